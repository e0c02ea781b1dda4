"""Result objects of ``layerlab diff``: plain dataclasses, no formatting (see cli/render_diff).

Vocabulary:

    A, B      the two reports, in the order given (A is "before", B "after")
    change    one thing that differs beyond tolerance: a call added or gone, a shape, a statistic …
    origin    a module call whose inputs are the same in A and B but whose outputs are not: the
              difference starts there (everything after it may only be its consequence)
    score     how large a numeric change is, for ranking: ln(1 + |a − b| / (min(|a|, |b|) + atol));
              a doubling scores 0.69, ×10 scores 2.3, ×1000 scores 6.9. Structural changes (added,
              gone, shape, dtype, verdict) score ∞ and come first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

#: Bumped only when a key is removed or changes meaning.
SCHEMA_VERSION = 1

#: what a change is about, in the order a reader wants them when scores tie
SECTIONS = ("verdict", "calls", "inputs", "params", "backward", "problems", "checks", "probes", "rows")


@dataclass
class Change:
    """One difference beyond tolerance.

    Attributes:
        section: what part of the report it is in (:data:`SECTIONS`).
        where: a module call (``encoder.layers.0.linear1`` or ``… (call 2)``), a parameter name, a
            probe row (``sparsity: relu``), a check name, a warning's code.
        what: which quantity: ``added``, ``gone``, ``output shape``, ``output std``,
            ``output grad norm``, ``grad norm``, ``weight norm``, ``warning``, ``status`` …
        a, b: the value in A and in B (``None`` where absent).
        score: the size of the change, for ranking (:mod:`module docstring <layerlab.report_diff.report>`).
        numeric: whether ``a`` and ``b`` are numbers compared with the tolerance.
    """

    section: str
    where: str
    what: str
    a: Any = None
    b: Any = None
    score: float = math.inf
    numeric: bool = False

    def to_dict(self) -> dict:
        return {"section": self.section, "where": self.where, "what": self.what, "a": self.a, "b": self.b,
                "score": self.score if math.isfinite(self.score) else "inf", "numeric": self.numeric}


@dataclass
class DiffReport:
    """What changed between two layerlab reports of the same kind.

    Attributes:
        kind: the kind of the two reports (``inspect-report``, ``gradcheck-report``, ``profile-report`` …).
        a, b: where they came from (file paths, or ``A``/``B`` for objects).
        rtol, atol: the tolerance: numbers differ when ``|a − b| > atol + rtol · max(|a|, |b|)``.
        manifest: where the two runs' manifests differ (versions, threads, device, seed, spec hash).
            Context, not a result: they do not make ``differs`` true on their own.
        changes: every difference in the results, largest first (see :data:`SECTIONS`, ``score``).
        origins: module calls whose inputs are the same in A and B but whose outputs are not
            (innermost first in execution order): where the forward starts to differ.
        compared: how many of each thing were compared (``calls``, ``params``, ``numbers`` …).
        notes: what was not compared, and why (a probe that ran in one report only, timings).
    """

    kind: str
    a: str
    b: str
    rtol: float
    atol: float
    manifest: List[Change] = field(default_factory=list)
    changes: List[Change] = field(default_factory=list)
    origins: List[str] = field(default_factory=list)
    compared: Dict[str, int] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    schema: int = SCHEMA_VERSION

    @property
    def differs(self) -> bool:
        """Whether the results differ beyond tolerance (``layerlab diff`` exits 1 then)."""
        return bool(self.changes)

    def where(self, section: Optional[str] = None) -> List[str]:
        """The distinct places that changed (in ranking order), optionally of one section."""
        seen: List[str] = []
        for c in self.changes:
            if (section is None or c.section == section) and c.where not in seen:
                seen.append(c.where)
        return seen

    def top(self, n: Optional[int]) -> List[Change]:
        return list(self.changes if n is None else self.changes[:n])

    def to_dict(self) -> dict:
        return {"schema": self.schema, "kind": "diff-report", "compared_kind": self.kind, "a": self.a, "b": self.b,
                "differs": self.differs, "rtol": self.rtol, "atol": self.atol,
                "manifest_changes": [c.to_dict() for c in self.manifest], "origins": list(self.origins),
                "changes": [c.to_dict() for c in self.changes], "compared": dict(self.compared),
                "notes": list(self.notes)}
