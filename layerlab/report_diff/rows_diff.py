"""Reports other than inspect's: gradcheck (verdict per check), profile (FLOPs and bytes per module
call; times are not compared: they vary between identical runs), any other kind field by field —
and the manifests of any two reports.
"""

from __future__ import annotations

from typing import Any, Dict, List

from layerlab.report_diff.collect import Collector
from layerlab.report_diff.inspect_diff import _label, _pair

#: keys that hold times (``seconds``, ``forward_s``, ``samples_step_s``): never compared
_TIMING_SUFFIXES = ("_s", "seconds", "timing", "overhead", "rows_error", "share")
_PROFILE_NUMBERS = ("flops_forward", "flops_backward", "activation_bytes", "output_bytes", "param_bytes")


def gradcheck(a: Dict[str, Any], b: Dict[str, Any], col: Collector, where: str = "(report)") -> List[str]:
    """One gradcheck report: its verdict, what it checked against, and each check's status."""
    col.same("verdict", where, "ok", a.get("ok"), b.get("ok"))
    for key in ("module", "reference"):
        col.same("verdict", where, key, a.get(key), b.get(key))
    checks_a = {c.get("name"): c for c in a.get("checks") or []}
    checks_b = {c.get("name"): c for c in b.get("checks") or []}
    for name, ca, cb in _pair(checks_a, checks_b):
        col.compared["checks"] += 1
        label = name if where == "(report)" else f"{where}: {name}"
        col.same("checks", label, "status", None if ca is None else ca.get("status"),
                 None if cb is None else cb.get("status"))
    return ["gradcheck reports are compared by each check's status, not its numbers"]


def gradcheck_matrix(a: Dict[str, Any], b: Dict[str, Any], col: Collector) -> List[str]:
    """``gradcheck --all``: each layer's report, matched by its target name."""
    col.same("verdict", "(report)", "ok", a.get("ok"), b.get("ok"))
    ra = {r.get("target"): r for r in a.get("reports") or []}
    rb = {r.get("target"): r for r in b.get("reports") or []}
    for target, x, y in _pair(ra, rb):
        if x is None or y is None:
            col.add("rows", str(target), "layer added" if x is None else "layer gone", None, None)
            continue
        gradcheck(x, y, col, where=str(target))
    return ["gradcheck reports are compared by each check's status, not its numbers"]


def profile(a: Dict[str, Any], b: Dict[str, Any], col: Collector) -> List[str]:
    """A profile: its setup, then FLOPs and bytes per module call (deterministic), not times."""
    for key in ("model", "mode", "backward", "inputs", "device"):
        col.same("verdict", "(report)", key, a.get(key), b.get(key))
    for key, x, y in _pair(a.get("totals") or {}, b.get("totals") or {}):
        if not key.endswith("_s"):
            col.number("rows", "(total)", key, x, y)
    rows_a = {(r.get("path"), r.get("call")): r for r in a.get("rows") or []}
    rows_b = {(r.get("path"), r.get("call")): r for r in b.get("rows") or []}
    for (path, call), x, y in _pair(rows_a, rows_b):
        label = _label(path or "", call or 1)
        if x is None or y is None:
            col.add("calls", label, "call added" if x is None else "call gone",
                    None if x is None else x.get("class_name"), None if y is None else y.get("class_name"))
            continue
        col.compared["calls"] += 1
        col.same("calls", label, "class", x.get("class_name"), y.get("class_name"))
        for key in _PROFILE_NUMBERS:
            col.number("calls", label, key.replace("_", " "), x.get(key), y.get(key))
    return ["profile times are not compared (they vary between identical runs); FLOPs and bytes are compared (they do not vary)"]


def generic(a: Any, b: Any, col: Collector, path: str = "") -> None:
    """Field by field, for report kinds diff knows no structure of: numbers against the tolerance,
    everything else by equality; lists by position; times and the manifest left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key, x, y in _pair(a, b):
            if (not path and key in ("manifest", "schema")) or str(key).endswith(_TIMING_SUFFIXES):
                continue
            sub = f"{path}.{key}" if path else str(key)
            if x is None and key not in a or y is None and key not in b:
                col.add("rows", sub, "added" if key not in a else "gone", x, y)
            else:
                generic(x, y, col, sub)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            col.add("rows", path or "(report)", "length", len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            generic(x, y, col, f"{path}[{i}]")
    else:
        from layerlab.report_diff.numbers import as_number

        if as_number(a) is not None and as_number(b) is not None:
            col.number("rows", path or "(report)", "value", a, b)
        else:
            col.same("rows", path or "(report)", "value", a, b)


def manifests(a: Any, b: Any, col: Collector) -> List[str]:
    """Where the two runs' manifests differ (recorded as changes of section ``manifest``)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        missing = " and ".join(n for n, m in (("A", a), ("B", b)) if not isinstance(m, dict))
        return [f"{missing} carr{'y' if ' and ' in missing else 'ies'} no manifest (written before layerlab "
                f"recorded one, or made in Python): versions, threads and seeds cannot be compared"]
    flat_a, flat_b = _flatten(a), _flatten(b)
    for key, x, y in _pair(flat_a, flat_b):
        if key == "schema" or key == "target" and (x, y) == (flat_a.get("spec.path"), flat_b.get("spec.path")):
            continue  # a spec's target is its path: said once
        col.same("manifest", key, "", x, y)
    return []


def _flatten(m: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in m.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                out[f"{key}.{sub}"] = v
        elif isinstance(value, list) and key == "command":
            out[key] = " ".join(map(str, value))
        elif isinstance(value, list):
            out[key] = repr(value)
        else:
            out[key] = value
    return out
