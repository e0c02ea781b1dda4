"""Result objects of ``layerlab gradcheck``: plain dataclasses, no formatting (see cli/render_gradcheck).

A :class:`CheckResult` is one check's verdict (``pass`` / ``fail`` / ``warn`` / ``skip``) with the
numbers it measured, the tolerances it used and where the problem is (an output path, an input
name, a parameter name or a submodule's qualified name). A :class:`VerifyReport` is every check
run on one layer; a :class:`MatrixReport` is ``--all``: one report per registry layer.

This module never imports torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from layerlab.report_render import Displayable  # imports no Rich: it renders on demand

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1


class Status(str, enum.Enum):
    """A check's verdict. ``fail`` makes the command exit 1; ``warn`` and ``skip`` do not."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"

    def __str__(self) -> str:  # "fail", not "Status.FAIL", in f-strings
        return self.value


def status_counts(results: Iterable[Any]) -> Dict[str, int]:
    """``{"pass": n, "fail": n, "warn": n, "skip": n}`` over results that have a ``status``."""
    out = {s.value: 0 for s in Status}
    for r in results:
        out[Status(r.status).value] += 1
    return out


@dataclass
class CheckResult:
    """The verdict of one check.

    Attributes:
        name: the check's stable name (``forward_parity``, ``gradcheck``, …; see :data:`CHECK_NAMES`).
        status: pass, fail, warn or skip.
        summary: one sentence: what was compared and what came out (or why it was skipped).
        where: the location at fault, most specific first: a parameter (``weight_ih_l0``), a
            submodule (``encoder.norm``), an input (``query``) or an output path (``output[1][0]``).
        hint: how to fix it (failures and warnings).
        details: the numbers: comparisons, tolerances, indices, shapes; JSON-ready values only.
        seconds: wall time the check took.
    """

    name: str
    status: Status
    summary: str
    where: Optional[str] = None
    hint: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == Status.FAIL


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class VerifyReport(Displayable):
    """Every check run on one layer.

    Attributes:
        target: what was verified (a registry name, a spec file, or the module's class name).
        module: the class that was checked (``layerlab.layers.recurrent.LSTM``).
        reference: what it was compared with (``torch.nn.LSTM``), or ``None``.
        checks: the results, in the order they ran.
        settings: seed, deep, dtype, caps: what is needed to reproduce the run.
        seconds: total wall time.
    """

    target: str
    module: str
    reference: Optional[str]
    checks: List[CheckResult]
    settings: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def failures(self) -> List[CheckResult]:
        return [c for c in self.checks if c.failed]

    def check(self, name: str) -> CheckResult:
        """The result of the check called ``name`` (``KeyError`` if it did not run)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in this report; ran: {[c.name for c in self.checks]}")

    def counts(self) -> Dict[str, int]:
        return status_counts(self.checks)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "gradcheck-report",
            "target": self.target,
            "module": self.module,
            "reference": self.reference,
            "ok": self.ok,
            "counts": self.counts(),
            "checks": [_check_dict(c) for c in self.checks],
            "settings": self.settings,
            "seconds": round(self.seconds, 3),
        }


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class MatrixReport(Displayable):
    """``--all``: one :class:`VerifyReport` per registry layer."""

    reports: List[VerifyReport]
    check_names: List[str]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "gradcheck-matrix",
            "ok": self.ok,
            "checks": list(self.check_names),
            "layers": [r.target for r in self.reports],
            "failed": [r.target for r in self.reports if not r.ok],
            "reports": [r.to_dict() for r in self.reports],
            "seconds": round(self.seconds, 3),
        }


def _check_dict(c: CheckResult) -> dict:
    return {
        "name": c.name,
        "status": Status(c.status).value,
        "summary": c.summary,
        "where": c.where,
        "hint": c.hint,
        "details": c.details,
        "seconds": round(c.seconds, 4),
    }
