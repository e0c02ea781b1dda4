"""Silent bugs: a model that runs, and computes something other than what its author meant.

Read from axis provenance (:mod:`layerlab.engine.provenance`), never from names: each finder looks
at the records of one forward and says where an op treats the batch axis, or two unrelated axes,
in a way no correct model does. Each finding is a :class:`~layerlab.errors.Problem` (the one
finding type of inspect) with a stable rule id as its ``code``, severity ``warning`` (none fails a
run), ``where`` the user's ``file:line``, ``hint`` the fix, and ``data`` holding ``rule``, ``op``,
``line``, ``code`` (the source line), ``evidence`` (the provenance: "axis 1 [7] is input x axis 1
(seq), via view at model.py:12") and ``fix``.

Rules (ids are stable; tests/engine has a buggy model and its correct twin for each):

    silent/interleaving-view        a view/reshape whose output axes cut across its input axes
                                    (split order ≠ merge order): a transpose was meant. A cut that
                                    is a clean split (an outer piece joins the axes before it, as in
                                    MobileViT's unfolding) counts only once distinct sizes make it
                                    unclean
    silent/batch-normalization      softmax/normalize/cumsum over the batch axis of a tensor that
                                    has one batch axis (a (B, B) similarity matrix has two)
    silent/batch-reduction          a reduction over the batch axis whose result reaches a model
                                    output that has no batch axis left
    silent/batch-broadcast          broadcasting that pairs the batch axis with a size-1 feature
                                    axis of a higher-rank operand: (B, 1) − (B,) → (B, B)
    silent/batch-index              a constant index on the batch axis (``out[-1]`` of a
                                    batch_first RNN)
    silent/layer-across-axis        a layer sized for the features applied across a sequence,
                                    spatial or batch axis of the same size
    silent/coincident-sizes         an op that pairs two different axes that only line up because
                                    their sizes are equal (confirmed by the distinct-size re-run)

What is by design and not reported: ops inside torch.nn modules (BatchNorm's batch statistics,
attention inside MultiheadAttention), a (B, B) matrix made by a product (contrastive logits), an
explicitly unsqueezed pairwise difference ``a[:, None] - b``, a positional table tied to the
sequence length, a layer applied across an axis the model's own transpose moved there.
"""

from __future__ import annotations

from typing import List, Optional

from layerlab.engine.labels import atoms_of
from layerlab.engine.provenance import Provenance, Record
from layerlab.errors import Problem

__all__ = ["silent_findings", "RULES", "coincidences"]

#: rule id → one line saying what it finds (``layerlab`` docs and ``--json`` consumers read these)
RULES = {
    "silent/interleaving-view": "a view/reshape that mixes two input axes into one output axis",
    "silent/batch-normalization": "softmax or normalisation over the batch axis",
    "silent/batch-reduction": "a reduction over the batch axis that the output never gets back",
    "silent/batch-broadcast": "broadcasting that pairs the batch axis with another per-sample axis",
    "silent/batch-index": "a constant index on the batch axis",
    "silent/layer-across-axis": "a layer applied across an axis it was not built for",
    "silent/coincident-sizes": "two different axes paired because their sizes happen to be equal",
}

_FREE = ("batch", "seq", "spatial")


def _single(p: Provenance, label) -> Optional[int]:
    atoms = atoms_of(label)
    return atoms[0] if len(atoms) == 1 else None


def _role(p: Provenance, label) -> Optional[str]:
    a = _single(p, label)
    return p.role(a) if a is not None else None


def _axis_text(p: Provenance, r: Record, operand: int, axis: int) -> str:
    shape = r.in_shapes[operand]
    label = r.inputs[operand][axis]
    via = p.chain(r.index, operand, axis)
    return (f"axis {axis} [{shape[axis]}] is {p.describe(label)}"
            + (f", via {', '.join(via)}" if via else ""))


def _finding(rule: str, r: Record, message: str, evidence: List[str], fix: str, where: Optional[str] = None,
             severity: str = "warning") -> Problem:
    where = where or r.where
    return Problem(code=rule, message=message, where=where, hint=fix, severity=severity,
                   data={"rule": rule, "op": r.op, "line": where, "code": r.code, "module": r.module_path,
                         "evidence": evidence, "fix": fix})


_SHOWN = {"__getitem__": "indexing", "__matmul__": "@", "__add__": "+", "__sub__": "−", "__mul__": "*",
          "__truediv__": "/", "__rsub__": "−", "__radd__": "+", "__rmul__": "*"}


def _op(r: Record) -> str:
    """How a message names the op: ``reshape``, ``indexing``, ``+``."""
    return _SHOWN.get(r.op, r.op)


# -- the finders ---------------------------------------------------------------------------------
def interleaving_views(p: Provenance) -> List[Problem]:
    found = []
    for r in p.records:
        if not r.user or r.kind != "view":
            continue
        for kind, data in r.events:
            if kind != "view":
                continue
            for g in data["groups"]:
                if any(a < 0 for a, _ in g.parts) or not g.interleaves([r.out_shapes[0][k] for k in g.out_axes]):
                    continue
                if len({p.cls(a) for a, s in g.parts if s > 1}) < 2:
                    continue  # pieces of one axis re-cut: no two axes are mixed
                out_sizes = [r.out_shapes[0][k] for k in g.out_axes]
                axes = sorted(set(g.in_axes))
                names = ", ".join(f"{p.describe(((a, s),))} [{s}]" for a, s in g.parts)
                evidence = [f"axes {', '.join(map(str, axes))} of {r.in_shapes[0]} hold {names}",
                            f"the {r.op} cuts them into {out_sizes}: an output axis ends inside an input axis"]
                free = next((k for k in axes for a, s in g.parts if s > 1 and p.role(a) in _FREE
                             and r.inputs[0][k] is not None and a in atoms_of(r.inputs[0][k])), None)
                if free is not None:
                    evidence.append(_axis_text(p, r, 0, free))
                fix = _reorder_fix(r, g)
                found.append(_finding(
                    "silent/interleaving-view", r,
                    f"{_op(r)} at {r.where} interleaves axes: {r.in_shapes[0]} → {r.out_shapes[0]} splits them in "
                    f"another order than they are stored, so each output row mixes "
                    f"{' and '.join(sorted({p.role(a) for a, _ in g.parts}))} positions", evidence, fix))
                break
    return found


def _reorder_fix(r: Record, g) -> str:
    """The permutation of the input axes after which this view keeps the axes whole."""
    shape = r.in_shapes[0]
    axes = sorted(set(g.in_axes))
    if len(axes) != len([s for a, s in g.parts if s > 1]):
        return "move the axes with transpose/permute before the view so that each output axis is made of whole input axes"
    remaining = list(axes)
    order = []
    for k in g.out_axes:
        size = r.out_shapes[0][k]
        single = [a for a in remaining if shape[a] == size]
        if single:
            order.append(single[0]); remaining.remove(single[0]); continue
        prod, take = 1, []
        for a in remaining:
            prod *= shape[a]; take.append(a)
            if prod == size:
                break
        if prod != size:
            return "move the axes with transpose/permute before the view so that each output axis is made of whole input axes"
        order += take
        remaining = [a for a in remaining if a not in take]
    perm = list(range(len(shape)))
    for slot, a in zip(axes, order):
        perm[slot] = a
    moved = [k for k in range(len(perm)) if perm[k] != k]
    if len(moved) == 2:
        move = f".transpose({moved[0]}, {moved[1]})"
    else:
        move = f".permute({', '.join(map(str, perm))})"
    return f"did you mean `{move}` before the {r.op}? (then `.reshape`, or `.contiguous().view`)"


def batch_normalizations(p: Provenance) -> List[Problem]:
    found = []
    for r in p.records:
        if not r.user or r.kind != "normalize" or not r.inputs:
            continue
        lab = r.inputs[0]
        if len(lab) < 2:
            continue
        batch = p.batch_axes(lab)
        for kind, data in r.events:
            if kind != "normalize" or len(batch) != 1:
                continue
            for axis in data["axes"]:
                if axis == batch[0] and r.in_shapes[0][axis] > 1:
                    other = next((k for k in range(len(lab)) if k != axis and r.in_shapes[0][k] > 1), None)
                    fix = (f"normalise over the axis meant, e.g. dim={other - len(lab)}" if other is not None
                           else "normalise over a per-sample axis")
                    found.append(_finding(
                        "silent/batch-normalization", r,
                        f"{_op(r)} at {r.where} normalises over the batch axis (dim {axis} of {r.in_shapes[0]}): "
                        f"each sample's result depends on the others in the batch",
                        [_axis_text(p, r, 0, axis)], fix))
    return found


def batch_broadcasts(p: Provenance) -> List[Problem]:
    found = []
    for r in p.records:
        if not (r.user or r.kind == "loss") or r.kind not in ("elementwise", "loss"):
            continue
        for kind, data in r.events:
            if kind != "broadcast":
                continue
            hit = _self_broadcast(p, r, data["meets"])
            if hit is None:
                continue
            low, high, axis = hit
            out = r.out_shapes[0] if r.out_shapes and r.kind != "loss" else None
            shown = out if out is not None else "a (B, B) grid inside the loss"
            evidence = [f"operand {low} {r.in_shapes[low]} has its batch axis on the right: broadcasting adds "
                        f"its missing axes on the left, so it meets axis {axis} of operand {high} "
                        f"{r.in_shapes[high]}, a size-1 {p.describe(r.inputs[high][axis])}",
                        _axis_text(p, r, high, 0) if r.inputs[high] else ""]
            fix = (f"make the shapes equal: squeeze the size-1 axis of operand {high} "
                   f"(`.squeeze({axis})`) or unsqueeze operand {low} (`.unsqueeze({axis})`)")
            found.append(_finding(
                "silent/batch-broadcast", r,
                f"{_op(r)} at {r.where} broadcasts {r.in_shapes[high]} against {r.in_shapes[low]} into {shown}: "
                f"every sample is paired with every other", [e for e in evidence if e], fix))
            break
    return found


def _self_broadcast(p: Provenance, r: Record, meets) -> Optional[tuple]:
    ranks = [len(s) for s in r.in_shapes]
    for axis, contrib in meets:
        for i, label, size, promoted in contrib:
            if promoted or label is None or size is None or size <= 1:
                continue
            if _role(p, label) != "batch" or ranks[i] >= max(ranks):
                continue
            for j, other, osize, opromoted in contrib:
                if j == i or opromoted or osize != 1 or other is None:
                    continue
                atom = _single(p, other)
                if atom is None or p.atoms[atom].kind == "inserted":
                    continue  # an explicit unsqueeze/None: a pairwise grid on purpose
                if p.batch_axes(r.inputs[j]):
                    return i, j, axis
    return None


def batch_indices(p: Provenance) -> List[Problem]:
    found = []
    for r in p.records:
        if not r.user or r.kind != "index" or not r.inputs:
            continue
        for kind, data in r.events:
            if kind != "const-index":
                continue
            axis, label = data["axis"], data["label"]
            lab = r.inputs[0]
            if _role(p, label) != "batch" or len(p.batch_axes(lab)) != 1 or r.in_shapes[0][axis] <= 1:
                continue
            seq = next((k for k, x in enumerate(lab) if _role(p, x) == "seq"), None)
            fix = (f"index the sequence axis instead: `[:, {data['value']}]`" if seq == 1 else
                   f"index the axis meant (dim {seq})" if seq is not None else "index a per-sample axis, not the batch")
            found.append(_finding(
                "silent/batch-index", r,
                f"{_op(r)} at {r.where} takes element {data['value']} of the batch axis (dim {axis} of "
                f"{r.in_shapes[0]}): one sample's result is used for the whole batch",
                [_axis_text(p, r, 0, axis)], fix))
    return found


def batch_reductions(p: Provenance) -> List[Problem]:
    """A reduction over the batch axis on the way to a model output that has no batch axis."""
    if not p.outputs or not any(a.kind == "input" and p.role(a.id) == "batch" for a in p.atoms):
        return []
    found = []
    for out in p.outputs:
        if not out or p.batch_axes(out):
            continue
        r = _batch_dropper(p, out)
        if r is None or r.kind != "reduce":
            continue
        axis = next(a for kind, d in r.events if kind == "reduce" for a, lab in zip(d["axes"], d["labels"])
                    if _role(p, lab) == "batch")
        lab = r.inputs[0]
        seq = next((k for k, x in enumerate(lab) if k != axis and _role(p, x) in ("seq", "spatial")), None)
        fix = (f"reduce over the sequence/spatial axis: dim={seq}" if seq is not None else
               "reduce over a per-sample axis, and keep the batch axis")
        found.append(_finding(
            "silent/batch-reduction", r,
            f"{_op(r)} at {r.where} reduces over the batch axis (dim {axis} of {r.in_shapes[0]}) and the model's "
            f"output has no batch axis left: the samples are averaged together",
            [_axis_text(p, r, 0, axis)], fix))
    return found


def _batch_dropper(p: Provenance, out) -> Optional[Record]:
    """The record (of the model's code) that made a tensor without a batch axis out of one with it,
    found walking back from the op that produced ``out``."""
    target = next((r for r in reversed(p.records) if r.outputs and out in r.outputs), None)
    seen = set()
    while target is not None and target.index not in seen:
        seen.add(target.index)
        carrying = [k for k, lab in enumerate(target.inputs) if p.batch_axes(lab)]
        if carrying:
            if target.user and not any(p.batch_axes(o) for o in target.outputs):
                return target
            return None if any(p.batch_axes(o) for o in target.outputs) else None
        nxt = next((target.producers[k] for k in range(len(target.producers)) if target.producers[k] is not None), None)
        target = p.records[nxt] if nxt is not None else None
    return None


def layers_across_axes(p: Provenance) -> List[Problem]:
    found = []
    for r in p.records:
        if r.kind != "contract":
            continue
        for kind, data in r.events:
            if kind != "bind":
                continue
            for axis, label, size in zip(data["axes"], data["labels"], data["sizes"]):
                atom = _single(p, label)
                if atom is None or p.role(atom) not in _FREE:
                    continue
                lab = r.inputs[0]
                twin = next((k for k, x in enumerate(lab) if k != axis and r.in_shapes[0][k] == size
                             and _role(p, x) in ("feature", "param")), None)
                if twin is None:
                    continue
                moved = p.first_departure(r.index, 0, axis)
                if moved is not None and moved.user and moved.kind == "move":
                    continue  # the model's own transpose put it there: token mixing on purpose
                layer = r.module_path or r.op
                n = len(lab)
                if axis == n - 1:
                    fix = f"move the features last before {layer}: `x.transpose({twin - n}, -1)`"
                else:
                    fix = f"move the features to dim {axis} before {layer}: `x.transpose({axis}, {twin})`" + \
                          (", and back after" if data.get("layer") not in ("conv", "linear", "rnn") else "")
                found.append(_finding(
                    "silent/layer-across-axis", r,
                    f"{layer} ({r.module_class or r.op}) is sized for {size} features and is applied across "
                    f"axis {axis} of {r.in_shapes[0]}, a {p.role(atom)} axis that is {size} long too; the "
                    f"features are on axis {twin}",
                    [_axis_text(p, r, 0, axis), _axis_text(p, r, 0, twin)], fix))
    return found


def coincidences(p: Provenance) -> List[tuple]:
    """``(record, out axis, label a, label b, size)`` for every op that pairs two different axes of
    equal size where one of them is a batch/sequence/spatial axis of an input, and the other is
    neither a parameter's own axis (a table sized for that axis) nor unknown."""
    found = []
    for r in p.records:
        for kind, data in r.events:
            pairs = []
            if kind == "broadcast":
                for axis, contrib in data["meets"]:
                    known = [c for c in contrib if c[1] is not None and c[2] and c[2] > 1]
                    pairs += [(axis, known[0][1], c[1], c[2]) for c in known[1:]]
            elif kind == "contract":
                pairs += [(None, x, y, sx) for x, sx, y, sy in data["pairs"] if x is not None and y is not None
                          and sx == sy and sx > 1]
            for axis, x, y, size in pairs:
                a, b = _single(p, x), _single(p, y)
                if a is None or b is None or p.cls(a) == p.cls(b):
                    continue
                ra, rb = p.role(a), p.role(b)
                if "param" in (ra, rb) or "unknown" in (ra, rb) or "inserted" in (ra, rb):
                    continue
                if ra in _FREE or rb in _FREE:
                    found.append((r, axis, x, y, size))
    return found


def coincident_sizes(p: Provenance, confirmed: Optional[dict] = None) -> List[Problem]:
    found, seen = [], set()
    for r, axis, x, y, size in coincidences(p):
        if (r.where, r.op) in seen or not r.where:
            continue
        seen.add((r.where, r.op))
        what = "contracts" if axis is None else "pairs"
        evidence = [f"{p.describe(x)} and {p.describe(y)} are both {size} long"]
        note = (confirmed or {}).get((r.where, r.op))
        if note:
            evidence.append(note)
        found.append(_finding(
            "silent/coincident-sizes", r,
            f"{_op(r)} at {r.where} {what} {p.describe(x)} with {p.describe(y)}: they line up only because both "
            f"are {size} long", evidence,
            "check which axes this op should pair; move them with transpose/permute so that the same axis meets itself"))
    return found


FINDERS = (interleaving_views, batch_normalizations, batch_broadcasts, batch_indices, batch_reductions,
           layers_across_axes, coincident_sizes)


def silent_findings(p: Provenance) -> List[Problem]:
    """Every finding of every rule over one provenance, one per (rule, line)."""
    found, seen = [], set()
    for finder in FINDERS:
        for f in finder(p):
            key = (f.code, f.where)
            if key not in seen:
                seen.add(key)
                found.append(f)
    return found
