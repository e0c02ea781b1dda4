"""What one labelled forward saw, read back: the roles of the input axes, readable origins, chains.

A :class:`Provenance` is what :class:`~layerlab.engine.provenance.ProvenanceMode` returns: its atoms
(:mod:`layerlab.engine.labels`), its op records, and the labels of the inputs and outputs. Here
they are read: which role an input axis plays (learnt from the layers that consume it, see
:meth:`Provenance.roles`), which axes of two inputs are one axis (a mask and the ids it masks),
where an axis came from in words, and which op last moved it (:meth:`Provenance.first_departure`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from layerlab.engine.labels import Atom, Label, Labels, atoms_of

if TYPE_CHECKING:
    from layerlab.engine.provenance import Record

__all__ = ["AxisOrigin", "Provenance"]


@dataclass
class AxisOrigin:
    """Where one axis came from: its atoms (several for a merged axis), their role and source."""

    role: str
    source: str
    size: int
    parts: Tuple[int, ...] = ()

    @property
    def text(self) -> str:
        return f"{self.source} ({self.role})" if self.role not in ("unknown",) else self.source



class Provenance:
    """What a :class:`ProvenanceMode` saw: atoms, records, and the labels of inputs and outputs."""

    def __init__(self, atoms, records, inputs, outputs, out_shapes, failed, errors, dropped) -> None:
        self.atoms: List[Atom] = atoms
        self.records: List[Record] = records
        self.inputs: Dict[str, Labels] = inputs
        self.outputs: List[Labels] = outputs
        self.out_shapes: List[List[int]] = out_shapes
        self.failed: Optional[Record] = failed
        self.errors: List[BaseException] = errors
        self.dropped = dropped
        self._roles: Optional[Dict[int, str]] = None
        self._class: Dict[int, int] = {}

    # -- roles ------------------------------------------------------------------------------------
    def root(self, atom: int) -> int:
        """The atom a piece was cut from, and one representative for input axes tied together."""
        while self.atoms[atom].parent is not None:
            atom = self.atoms[atom].parent
        return self._find(atom)

    def _find(self, a: int) -> int:
        while self._class.get(a, a) != a:
            a = self._class[a]
        return a

    def _union(self, a: int, b: int) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self._class[max(ra, rb)] = min(ra, rb)

    def roles(self) -> Dict[int, str]:
        """Role of each input atom (after tying the same axis of two inputs together)."""
        if self._roles is not None:
            return self._roles
        inputs = [a for a in self.atoms if a.kind == "input"]
        # two inputs' axes that meet (mask and ids, h0 and x) are one axis
        for r in self.records:
            for kind, data in r.events:
                pairs = []
                if kind == "broadcast":
                    for _, contrib in data["meets"]:
                        known = [c for c in contrib if c[1] is not None and c[2] and c[2] > 1]
                        pairs += [(known[0][1], c[1]) for c in known[1:]]
                elif kind == "contract":
                    pairs += [(p[0], p[2]) for p in data["pairs"] if p[1] > 1 and p[1] == p[3]]
                for x, y in pairs:
                    ax, ay = atoms_of(x), atoms_of(y)
                    if len(ax) == 1 and len(ay) == 1:
                        a, b = self.atoms[ax[0]], self.atoms[ay[0]]
                        if a.kind == b.kind == "input" and a.input != b.input and a.size == b.size:
                            self._union(a.id, b.id)
        evidence: Dict[int, set] = {}
        for r in self.records:
            for kind, data in r.events:
                if kind == "role":
                    for lab in data["labels"]:
                        if lab is not None and len(lab) == 1 and self.atoms[lab[0][0]].kind == "input":
                            evidence.setdefault(self._find(lab[0][0]), set()).add(data["role"])
                elif kind == "bind" and r.kind == "contract":
                    for lab in data["labels"]:
                        if lab is not None and len(lab) == 1 and self.atoms[lab[0][0]].kind == "input":
                            evidence.setdefault(self._find(lab[0][0]), set()).add("bound")
        roles: Dict[int, str] = {}
        for a in inputs:
            c = self._find(a.id)
            seen = evidence.get(c, set())
            axis0 = any(self._find(b.id) == c and b.axis == 0 for b in inputs)
            if "batch" in seen:
                role = "batch"
            elif "seq" in seen or "spatial" in seen:
                role = "spatial" if "spatial" in seen and "seq" not in seen else "seq"
            elif "batch-or-seq" in seen:
                role = "batch" if axis0 else "seq"
            elif "bound" in seen:
                role = "feature"
            elif axis0:
                role = "batch"
            else:
                role = "unknown"
            roles[a.id] = role
        self._roles = roles
        return roles

    def role(self, atom: int) -> str:
        """``batch``, ``seq``, ``spatial``, ``feature`` (an input axis a layer is sized for, or
        the new axis a layer's weight makes), ``unknown`` (an input axis nothing said more
        about), ``param`` (a parameter's own axis), ``new``, ``inserted``."""
        atom = self.root(atom) if self.atoms[atom].kind == "piece" else atom
        a = self.atoms[atom]
        if a.kind == "input":
            return self.roles().get(a.id, "unknown")
        return a.kind

    def cls(self, atom: int) -> int:
        """The class of an atom: input axes tied together are one class; a piece is its parent's."""
        self.roles()
        return self.root(atom)

    def batch_axes(self, labels: Labels) -> List[int]:
        """The axes of a tensor that hold (only) a batch atom."""
        return [k for k, lab in enumerate(labels)
                if lab is not None and len(lab) == 1 and self.role(lab[0][0]) == "batch"]

    # -- reading ----------------------------------------------------------------------------------
    def origins(self, labels: Labels) -> List[AxisOrigin]:
        out = []
        for lab in labels:
            if lab is None:
                out.append(AxisOrigin("unknown", "unknown", -1))
                continue
            names = [self.atoms[a].name for a, _ in lab]
            roles = [self.role(a) for a, _ in lab]
            size = 1
            for _, s in lab:
                size *= s
            out.append(AxisOrigin(roles[0] if len(set(roles)) == 1 else "merged", " · ".join(names), size,
                                  atoms_of(lab)))
        return out

    def describe(self, label: Label) -> str:
        """``input x axis 1 (seq)``, or ``input x axis 0 · input x axis 1 (merged)``."""
        if label is None:
            return "of unknown origin"
        return self.origins((label,))[0].text

    def chain(self, record: int, operand: int, axis: int, limit: int = 6) -> List[str]:
        """The ops of the model's code that brought the axis at ``axis`` of ``record``'s operand
        there, newest first (``transpose at model.py:12``)."""
        steps = []
        r = self.records[record]
        producer = r.producers[operand] if operand < len(r.producers) else None
        label = r.inputs[operand][axis] if operand < len(r.inputs) and axis < len(r.inputs[operand]) else None
        atoms = set(atoms_of(label))
        while producer is not None and len(steps) < limit:
            p = self.records[producer]
            if p.user and p.kind in ("move", "view", "squeeze", "index", "join", "split"):
                steps.append(p.label)
            nxt = None
            for k, lab in enumerate(p.inputs):
                if atoms & {a for x in lab if x for a in atoms_of(x)}:
                    nxt = p.producers[k] if k < len(p.producers) else None
                    break
            producer = nxt
        return steps

    def first_departure(self, record: int, operand: int, axis: int) -> Optional[Record]:
        """The newest op before ``record`` that moved or regrouped the axis its consumer reads at
        ``axis`` of ``operand`` (the op a fix would change), or ``None``."""
        r = self.records[record]
        producer = r.producers[operand] if operand < len(r.producers) else None
        label = r.inputs[operand][axis] if operand < len(r.inputs) else None
        atoms = set(atoms_of(label))
        while producer is not None:
            p = self.records[producer]
            if p.kind in ("move", "view", "squeeze"):
                return p
            nxt = None
            for k, lab in enumerate(p.inputs):
                if not atoms or atoms & {a for x in lab if x for a in atoms_of(x)}:
                    nxt = p.producers[k] if k < len(p.producers) else None
                    break
            producer = nxt
        return None
