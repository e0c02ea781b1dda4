"""Result objects of ``layerlab export-check``: plain dataclasses, no formatting (see cli/render_export).

One :class:`PathResult` per export path (a cell of the matrix), one :class:`ExportReport` per
layer (a row), one :class:`ExportMatrix` for ``--all``. Statuses are gradcheck's
(:class:`~layerlab.checks.report.Status`): ``pass`` the path works and its outputs equal eager's;
``warn`` it works on the example input but is input-specific (a trace that baked in a shape or a
Python branch, an export that cannot keep the batch dim dynamic, graph breaks under compile);
``fail`` it raises or its outputs differ; ``skip`` not run (an optional dependency is missing, or
nothing to vary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from layerlab.checks.report import Status, status_counts
from layerlab.report_render import Displayable  # imports no Rich: it renders on demand

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1

#: the export paths, in column order
PATHS = ("trace", "script", "compile", "export", "export_dynamic", "onnx")

#: what each path runs (shown under the matrix and in --help)
PATH_TITLES = {
    "trace": "torch.jit.trace",
    "script": "torch.jit.script",
    "compile": "torch.compile(fullgraph=True)",
    "export": "torch.export.export",
    "export_dynamic": "torch.export.export, batch dim Dim('batch')",
    "onnx": "torch.onnx.export → onnxruntime",
}


@dataclass
class PathResult:
    """One cell: how one export path fared on one layer.

    Attributes:
        path: the path's name (:data:`PATHS`).
        status: pass, warn, fail or skip.
        reason: the first line of why (the unsupported op, the graph break, the TracerWarning, the
            baked-in shape), or what passed.
        where: the source location the reason points at (``file.py:12``), when known.
        hint: how to fix or enable it.
        matches_eager: the exported program's outputs equal eager's on the example input
            (``None``: it never produced outputs).
        comparisons: ``assert_close``-style numbers per output and input variant (see checks.compare).
        rtol, atol: the tolerances used for the comparisons.
        details: extra facts (TracerWarnings, graph-break count, exporter used, variants tried).
        seconds: wall time of the path.
    """

    path: str
    status: Status
    reason: str
    where: Optional[str] = None
    hint: Optional[str] = None
    matches_eager: Optional[bool] = None
    comparisons: List[Dict[str, Any]] = field(default_factory=list)
    rtol: Optional[float] = None
    atol: Optional[float] = None
    details: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "title": PATH_TITLES.get(self.path, self.path),
            "status": Status(self.status).value,
            "reason": self.reason,
            "where": self.where,
            "hint": self.hint,
            "matches_eager": self.matches_eager,
            "rtol": self.rtol,
            "atol": self.atol,
            "comparisons": self.comparisons,
            "details": self.details,
            "seconds": round(self.seconds, 3),
        }


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class ExportReport(Displayable):
    """Every selected path tried on one layer (a row of the matrix).

    Attributes:
        target: registry name, spec path, or class name.
        module: the class checked.
        paths: one result per path, in :data:`PATHS` order.
        settings: mode (always eval), inputs, compile backend, tolerances, seed.
        seconds: total wall time.
    """

    target: str
    module: str
    paths: List[PathResult]
    settings: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def result(self, path: str) -> PathResult:
        """The cell of ``path`` (``KeyError`` if it was not run)."""
        for r in self.paths:
            if r.path == path:
                return r
        raise KeyError(f"path {path!r} was not run; ran: {[r.path for r in self.paths]}")

    def counts(self) -> Dict[str, int]:
        return status_counts(self.paths)

    def ok_for(self, strict: bool = False) -> bool:
        """No path failed (and, with ``strict``, none warned)."""
        bad = {Status.FAIL, Status.WARN} if strict else {Status.FAIL}
        return not any(Status(r.status) in bad for r in self.paths)

    @property
    def ok(self) -> bool:
        return self.ok_for(False)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "export-check-report",
            "target": self.target,
            "module": self.module,
            "ok": self.ok,
            "counts": self.counts(),
            "paths": [r.to_dict() for r in self.paths],
            "settings": self.settings,
            "seconds": round(self.seconds, 3),
        }


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class ExportMatrix(Displayable):
    """``--all``: one :class:`ExportReport` per registry layer."""

    reports: List[ExportReport]
    path_names: List[str]
    seconds: float = 0.0

    def ok_for(self, strict: bool = False) -> bool:
        return all(r.ok_for(strict) for r in self.reports)

    @property
    def ok(self) -> bool:
        return self.ok_for(False)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "export-check-matrix",
            "ok": self.ok,
            "paths": list(self.path_names),
            "layers": [r.target for r in self.reports],
            "failed": [r.target for r in self.reports if not r.ok],
            "reports": [r.to_dict() for r in self.reports],
            "seconds": round(self.seconds, 3),
        }
