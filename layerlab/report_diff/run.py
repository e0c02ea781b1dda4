"""``layerlab.diff(a, b)``: what changed between two layerlab reports.

A and B are report objects (``layerlab.inspect(...)``), dicts (a ``--json`` file read back) or
paths of ``--json`` files. They must be of the same kind; inspect reports are compared in depth
(:mod:`~layerlab.report_diff.inspect_diff`), gradcheck and profile reports by their rows and
verdicts, other kinds field by field. Their manifests are compared too, as context.

This module never imports torch (diffing two JSON files needs none).
"""

from __future__ import annotations

import math
from typing import Any

from layerlab.report_diff.collect import Collector
from layerlab.report_diff.load import ReportError, kind_of, load
from layerlab.report_diff.numbers import DEFAULT_ATOL, DEFAULT_RTOL
from layerlab.report_diff.report import SECTIONS, DiffReport
from layerlab.target.entry import entry_point

__all__ = ["diff"]


@entry_point("diff", pure=True)
def diff(a: Any, b: Any, *, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> DiffReport:
    """Compare two reports of the same kind; the result lists every difference, largest first.

    Args:
        a, b: ``InspectReport`` (or another report object), a dict of a ``--json`` report, or the
            path of a ``--json`` file. A is "before", B "after".
        rtol (float, optional): relative tolerance. Default: ``1e-4``.
        atol (float, optional): absolute tolerance. Default: ``1e-6``. Two numbers differ when
            ``|a − b| > atol + rtol · max(|a|, |b|)``.

    Returns:
        DiffReport: ``differs`` (the results differ beyond tolerance), ``changes`` (ranked),
        ``origins`` (the calls where the forward starts to differ), ``manifest`` (how the two
        runs were made differently), ``notes`` (what was not compared).

    Raises:
        ReportError: a file that cannot be read, is not JSON or not a layerlab report, a schema newer
            than this layerlab reads, or two reports of different kinds.

    Example::

        >>> d = layerlab.diff(layerlab.inspect(before, x), layerlab.inspect(after, x))
        >>> d.origins            # ['encoder.layers.1.linear2']
    """
    from layerlab.arguments import check_tolerance

    check_tolerance(rtol, "rtol")
    check_tolerance(atol, "atol")
    ra, name_a = load(a, "A")
    rb, name_b = load(b, "B")
    kind_a, kind_b = kind_of(ra), kind_of(rb)
    if kind_a != kind_b:
        raise ReportError(f"cannot compare {_a(_what(kind_a))} with {_a(_what(kind_b))}", where=f"{name_a} vs {name_b}",
                          expected="two reports of the same kind (two inspect reports, two profiles …)",
                          got=f"{kind_a} and {kind_b}",
                          hint="make both with the same command: layerlab inspect A.yaml --json > A.json")
    col = Collector(rtol, atol)
    report = DiffReport(kind=kind_a, a=name_a, b=name_b, rtol=rtol, atol=atol)
    manifest_col = Collector(rtol, atol)
    from layerlab.report_diff import rows_diff

    report.notes += rows_diff.manifests(ra.get("manifest"), rb.get("manifest"), manifest_col)
    report.manifest = manifest_col.changes
    if kind_a == "inspect-report":
        from layerlab.report_diff import inspect_diff

        report.origins, notes = inspect_diff.compare(ra, rb, col)
    elif kind_a == "gradcheck-report":
        notes = rows_diff.gradcheck(ra, rb, col)
    elif kind_a == "gradcheck-matrix":
        notes = rows_diff.gradcheck_matrix(ra, rb, col)
    elif kind_a == "profile-report":
        notes = rows_diff.profile(ra, rb, col)
    else:
        rows_diff.generic(ra, rb, col)
        notes = [f"{kind_a}: compared field by field (layerlab diff knows no finer structure of this kind)"]
    report.notes += notes
    report.changes = ranked(col.changes)
    report.compared = dict(col.compared)
    return report


def ranked(changes):
    """Structural changes first (in report order, by section); then the numbers of what went into
    the run (a parameter's value, a model input's statistics: causes, not consequences), then every
    other number, and the backward's loss last; within each, largest first.

    Why causes before the rest: one changed weight moves dozens of downstream statistics and
    gradient norms, some by more than the weight itself moved (a scalar loss near 0 changes by
    "×10" when it flips sign); the reader looks for the change they made, and it must not be
    buried under its effects. The loss is a seeded random projection of every output, made only to
    drive the backward: it differs whenever any output does, and near 0 its relative change is
    large and says nothing about where.
    """
    def key(item):
        i, c = item
        structural = math.isinf(c.score)
        tier = 0 if structural else 1 if _is_cause(c) else 3 if _is_loss(c) else 2
        return (tier, SECTIONS.index(c.section) if structural and c.section in SECTIONS else 0,
                0.0 if structural else -c.score, i)

    return [c for _, c in sorted(enumerate(changes), key=key)]


def _is_cause(change) -> bool:
    """A forward-side number of a parameter or a model input (their gradients are effects)."""
    return change.section in ("params", "inputs") and "grad" not in change.what


def _is_loss(change) -> bool:
    return change.section == "backward" and change.what == "loss"


def _what(kind: str) -> str:
    names = {"inspect-report": "inspect report", "profile-report": "profile report",
             "gradcheck-report": "gradcheck report", "gradcheck-matrix": "gradcheck --all report",
             "unknown": "JSON document of unknown kind"}
    return names.get(kind, kind.replace("-", " "))


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun
