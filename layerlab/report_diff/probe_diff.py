"""Probe results (``inspect --probe``) of two reports: rows by ``(probe, path, call)``, each value
against the tolerance, each series (per head, per step) element by element with the largest
difference reported, flags by equality. A probe that ran in one report only is a note, not a
change: it says which options the runs had, not how the model behaved.
"""

from __future__ import annotations

from typing import Any, Dict, List

from layerlab.probe.report import call_label  # no torch: diffing JSON files never imports it
from layerlab.report_diff.collect import Collector
from layerlab.report_diff.numbers import as_number, differ


def compare_probes(pa: List[dict], pb: List[dict], col: Collector) -> List[str]:
    """Record the differences of the probes both reports ran; return notes about the others."""
    from layerlab.report_diff.inspect_diff import _pair

    notes: List[str] = []
    for name, a, b in _pair({p.get("name"): p for p in pa}, {p.get("name"): p for p in pb}):
        if a is None or b is None:
            notes.append(f"probe {name!r} ran in {'B' if a is None else 'A'} only: not compared")
            continue
        col.compared["probes"] += 1
        for key, ra, rb in _pair(_rows(a), _rows(b)):
            where = f"{name}: {call_label(*key)}"
            if ra is None or rb is None:
                col.add("probes", where, "row added" if ra is None else "row gone", None, None)
                continue
            for column, va, vb in _pair(ra.get("values") or {}, rb.get("values") or {}):
                col.number("probes", where, column, va, vb)
            for series, sa, sb in _pair(ra.get("series") or {}, rb.get("series") or {}):
                _series(col, where, series, sa, sb)
            col.same("probes", where, "flags", sorted(ra.get("flags") or []), sorted(rb.get("flags") or []))
        for key, va, vb in _pair(a.get("summary") or {}, b.get("summary") or {}):
            if as_number(va) is not None or as_number(vb) is not None:
                col.number("probes", f"{name}: (summary)", key, va, vb)
    return notes


def _rows(probe: dict) -> Dict[tuple, dict]:
    return {(r.get("path"), r.get("call")): r for r in probe.get("rows") or []}


def _series(col: Collector, where: str, name: str, sa: Any, sb: Any) -> None:
    if not isinstance(sa, list) or not isinstance(sb, list) or len(sa) != len(sb):
        col.same("probes", where, f"{name} length", _len(sa), _len(sb))
        return
    worst = None  # the element with the largest absolute difference among those beyond tolerance
    for i, (x, y) in enumerate(zip(sa, sb)):
        fx, fy = as_number(x), as_number(y)
        if fx is None or fy is None or not differ(fx, fy, col.rtol, col.atol):
            continue
        gap = abs(fx - fy) if fx == fx and fy == fy else float("inf")
        if worst is None or gap > worst[0]:
            worst = (gap, i)
    col.compared["numbers"] += len(sa)
    if worst is not None:
        i = worst[1]
        col.number("probes", where, f"{name}[{i}]", sa[i], sb[i])


def _len(value: Any) -> Any:
    return len(value) if isinstance(value, list) else value
