"""Two ``layerlab inspect`` reports side by side: calls, tensors, parameters, findings, probes.

Module calls are aligned by ``(path, call number)``; parameters by name; warnings and notes by
``(severity, code, where)`` (their wording holds numbers that move from run to run); probe rows by
``(probe, path, call)``. For every call both reports ran, the outputs are compared (shape, dtype,
statistics, gradient norm); its inputs are compared too, quietly, to find the *origins*: calls
whose inputs are the same but whose outputs are not. A call's inputs are earlier calls' outputs,
so each tensor is listed once, as the output of the call that made it. "The same" is judged on five
statistics, which a transpose or shuffle keeps: where the tensors' provenance cannot back them up
(:mod:`~layerlab.report_diff.provenance`), the call is not named and a note says why.

Not compared: timings (they vary between identical runs), the op trace (``--ops``), the meta
memory estimate, and the wording of messages.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from layerlab.report_diff.collect import Collector
from layerlab.report_diff.provenance import Provenance, inputs_trusted as _inputs_trusted

_STATS = ("mean", "std", "min", "max", "zeros")


def compare(a: Dict[str, Any], b: Dict[str, Any], col: Collector) -> Tuple[List[str], List[str]]:
    """Record every difference of two inspect reports in ``col``; return ``(origins, notes)``."""
    notes: List[str] = []
    col.same("verdict", "(report)", "ok", a.get("ok"), b.get("ok"))
    col.same("verdict", "(report)", "failure", _failure(a.get("failure")), _failure(b.get("failure")))
    col.same("verdict", "(report)", "mode", a.get("mode"), b.get("mode"))
    inputs_differ = [name for name, ta, tb in _pair(_by_name(a.get("inputs")), _by_name(b.get("inputs")))
                     if tensor(col, "inputs", f"(model input) {name}", "input", ta, tb)]
    origins, doubt_notes = _calls(a.get("calls") or [], b.get("calls") or [], col,
                                  (a.get("params") or [], b.get("params") or []))
    notes += doubt_notes
    if inputs_differ and not origins:  # every call may differ from the first: say why none is named
        notes.append(f"the model's inputs differ ({', '.join(inputs_differ)}), so the forward differs from its "
                     "first call on; no module is named as where it starts to differ")
    _params(a.get("params") or [], b.get("params") or [], col)
    _backward(a.get("backward") or {}, b.get("backward") or {}, col)
    _findings(a, b, col)
    _formula_checks(a.get("checks") or [], b.get("checks") or [], col)
    from layerlab.report_diff.probe_diff import compare_probes

    notes += compare_probes(a.get("probes") or [], b.get("probes") or [], col)
    if a.get("ops") or b.get("ops"):
        notes.append("the op traces (--ops) are not compared")
    notes.append("timings are not compared (they vary between identical runs)")
    return origins, notes


def tensor(col: Collector, section: str, where: str, what: str, ta: Optional[dict], tb: Optional[dict]) -> bool:
    """Compare one tensor (or non-tensor value) of A and B; True if its forward side differs
    (presence, shape, dtype, statistics). Gradient changes are recorded but not returned: the
    origins are about where the forward starts to differ."""
    if ta is None or tb is None:
        return col.add(section, where, f"{what} {'added' if ta is None else 'gone'}",
                       _shape_text(ta), _shape_text(tb))
    if (ta.get("shape") is None) != (tb.get("shape") is None) or (ta.get("shape") is None and ta.get("value") != tb.get("value")):
        return col.add(section, where, what, _shape_text(ta), _shape_text(tb))
    if ta.get("shape") is None:
        return False
    changed = col.same(section, where, f"{what} shape", ta["shape"], tb["shape"])
    if changed:  # statistics of tensors of different sizes: their difference says nothing more
        return True
    changed |= col.same(section, where, f"{what} dtype", ta.get("dtype"), tb.get("dtype"))
    sa, sb = ta.get("stats") or {}, tb.get("stats") or {}
    for key in ("nan", "inf"):
        changed |= col.same(section, where, f"{what} {key} count", sa.get(key), sb.get(key))
    spread = max(_num(sa.get("std")), _num(sb.get("std")))
    for key in _STATS:
        # a mean is judged against the spread (a LayerNorm's mean is ~1e-9 by nature); the fraction
        # of zeros against 10 percentage points
        scale = spread if key == "mean" else 0.1 if key == "zeros" else 0.0
        changed |= col.number(section, where, f"{what} {key}", sa.get(key), sb.get(key), scale=scale)
    ga, gb = ta.get("grad"), tb.get("grad")
    if (ga is None) != (gb is None):
        col.add(section, where, f"{what} grad", _grad_text(ga), _grad_text(gb))
    elif ga is not None:
        col.number(section, where, f"{what} grad norm", ga.get("norm"), gb.get("norm"))
    return changed


def _calls(calls_a: List[dict], calls_b: List[dict], col: Collector,
           params: Tuple[List[dict], List[dict]]) -> Tuple[List[str], List[str]]:
    quiet = col.quietly()
    ka = {(c["path"], c["call"]): c for c in calls_a}
    kb = {(c["path"], c["call"]): c for c in calls_b}
    owner_a, owner_b = _slot_owners(calls_a), _slot_owners(calls_b)
    prov_a, prov_b = Provenance(calls_a, quiet), Provenance(calls_b, quiet)
    candidates: List[tuple] = []
    doubts: Dict[tuple, str] = {}
    for key, ca, cb in _pair(ka, kb):
        label = _label(*key)
        if ca is None or cb is None:
            col.add("calls", label, "call added" if ca is None else "call gone",
                    None if ca is None else ca["class_name"], None if cb is None else cb["class_name"])
            continue
        col.compared["calls"] += 1
        changed = col.same("calls", label, "class", ca["class_name"], cb["class_name"])
        changed |= col.same("calls", label, "status", ca.get("status"), cb.get("status"))
        changed |= col.same("calls", label, "parameters", ca.get("params"), cb.get("params"))
        for name, ta, tb in _pair(_by_name(ca.get("outputs")), _by_name(cb.get("outputs"))):
            # a tensor a child returned as it is (the root's output is its last layer's) is listed
            # once, at the child; here it is only compared
            shown = _owns(owner_a, ca, ta) and _owns(owner_b, cb, tb)
            changed |= tensor(col if shown else quiet, "calls", label, "output" + name, ta, tb)
        inputs = list(_pair(_by_name(ca.get("inputs")), _by_name(cb.get("inputs"))))
        same_inputs = not any(tensor(quiet, "calls", label, "input", ta, tb) for _, ta, tb in inputs)
        if changed and same_inputs:  # equal statistics: trusted as equal tensors only where provenance allows
            trusted, why = _inputs_trusted(prov_a, prov_b, inputs, ca, cb, params, quiet)
            if trusted:
                candidates.append(key)
            else:
                doubts[key] = why
    origins = _innermost(candidates, calls_a)
    return origins, _doubt_notes(doubts)


def _doubt_notes(doubts: Dict[tuple, str]) -> List[str]:
    """Say why a call whose outputs differ, with inputs that look the same, was not named."""
    notes = []
    for key, why in list(doubts.items())[:3]:
        notes.append(f"{_label(*key)}: its outputs differ and its inputs look the same, but it is not named as where "
                     f"the forward starts to differ: {why}")
    if len(doubts) > 3:
        notes.append(f"… and {len(doubts) - 3} more such calls")
    return notes


def _slot_owners(calls: List[dict]) -> Dict[int, int]:
    """slot → index of the call that returned it first (the innermost: children end first)."""
    owners: Dict[int, tuple] = {}
    for c in calls:
        for t in c.get("outputs") or []:
            slot, end = t.get("slot"), c.get("end")
            if slot is None:
                continue
            rank = (end if isinstance(end, int) else 1 << 30, c["index"])
            if slot not in owners or rank < owners[slot]:
                owners[slot] = rank
    return {slot: rank[1] for slot, rank in owners.items()}


def _owns(owners: Dict[int, int], call: dict, t: Optional[dict]) -> bool:
    if t is None or t.get("slot") is None:
        return True
    return owners.get(t["slot"], call["index"]) == call["index"]


def _innermost(candidates: List[tuple], calls: List[dict]) -> List[str]:
    """Drop a candidate that encloses another one (the root's output changes when a child's does)."""
    by_index = {c["index"]: c for c in calls}
    keys = set(candidates)
    enclosing = set()
    for c in calls:
        if (c["path"], c["call"]) not in keys:
            continue
        parent = by_index.get(c.get("parent"))
        while parent is not None:
            enclosing.add((parent["path"], parent["call"]))
            parent = by_index.get(parent.get("parent"))
    return [_label(*k) for k in candidates if k not in enclosing]


def _params(pa: List[dict], pb: List[dict], col: Collector) -> None:
    for name, a, b in _pair({p["name"]: p for p in pa}, {p["name"]: p for p in pb}):
        if a is None or b is None:
            col.add("params", name, "parameter added" if a is None else "parameter gone",
                    None if a is None else a.get("shape"), None if b is None else b.get("shape"))
            continue
        col.compared["params"] += 1
        if col.same("params", name, "shape", a.get("shape"), b.get("shape")):
            continue
        col.same("params", name, "dtype", a.get("dtype"), b.get("dtype"))
        col.same("params", name, "trainable", a.get("trainable"), b.get("trainable"))
        col.number("params", name, "norm", a.get("norm"), b.get("norm"))
        if (a.get("grad_norm") is None) != (b.get("grad_norm") is None):
            col.add("params", name, "grad", _none_or(a.get("grad_norm")), _none_or(b.get("grad_norm")))
        else:
            col.number("params", name, "grad norm", a.get("grad_norm"), b.get("grad_norm"))
        col.same("params", name, "flags", sorted(a.get("flags") or []), sorted(b.get("flags") or []))


def _backward(a: dict, b: dict, col: Collector) -> None:
    col.same("backward", "(backward)", "ran", a.get("ran"), b.get("ran"))
    col.same("backward", "(backward)", "skipped", a.get("skipped"), b.get("skipped"))
    col.number("backward", "(backward)", "loss", a.get("loss_value"), b.get("loss_value"))


def _findings(a: dict, b: dict, col: Collector) -> None:
    """New and gone warnings, errors and notes, matched by what they are about, not their wording."""
    def keyed(report: dict) -> Dict[tuple, dict]:
        items = list(report.get("problems") or []) + list(report.get("notes") or [])
        return {(p.get("severity", "warning"), p.get("code"), p.get("where")): p for p in items}

    for (severity, code, where), pa, pb in _pair(keyed(a), keyed(b)):
        if pa is None or pb is None:
            col.add("problems", where or "(model)", f"{severity} {code} " + ("new" if pa is None else "gone"),
                    None if pa is None else pa.get("message"), None if pb is None else pb.get("message"))


def _formula_checks(ca: List[dict], cb: List[dict], col: Collector) -> None:
    """Formula checks by module path and their order among that path's checks (``call`` in a check
    is the call's index, which shifts when a call is added before it)."""
    def keyed(checks: List[dict]) -> Dict[tuple, dict]:
        out: Dict[tuple, dict] = {}
        for c in checks:
            n = sum(1 for k in out if k[0] == c["path"]) + 1
            out[(c["path"], n)] = c
        return out

    for (path, n), a, b in _pair(keyed(ca), keyed(cb)):
        col.same("checks", _label(path, n), "formula check",
                 None if a is None else _verdict(a.get("passed")), None if b is None else _verdict(b.get("passed")))


# -- small helpers --------------------------------------------------------------------------------

def _pair(a: Dict[Any, Any], b: Dict[Any, Any]):
    """``(key, a's, b's)`` for every key of A (in A's order), then B's new keys (in B's order)."""
    for key, value in a.items():
        yield key, value, b.get(key)
    for key, value in b.items():
        if key not in a:
            yield key, None, value


def _by_name(items: Optional[List[dict]]) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for i, item in enumerate(items or []):
        name = item.get("name") or ""
        out[name if name not in out else f"{name}#{i}"] = item
    return out


def _label(path: str, call: int) -> str:
    from layerlab.spec.limits import clean_text

    from layerlab.probe.report import call_label

    return call_label(clean_text(path, 300) if path else path, call)  # a path from a file: echoed safely


def _failure(f: Optional[dict]) -> Optional[str]:
    if not f:
        return None
    return f"{f.get('exception')} in the {f.get('phase')} at {f.get('path') or '(root)'}"


def _verdict(passed: Any) -> str:
    return {True: "passed", False: "FAILED", None: "not run"}.get(passed, str(passed))


def _shape_text(t: Optional[dict]) -> Any:
    if t is None:
        return None
    if t.get("shape") is None:
        return t.get("value")
    return f"{t.get('dtype')}{list(t['shape'])}"


def _grad_text(g: Optional[dict]) -> Any:
    return "no grad" if g is None else g.get("norm")


def _none_or(value: Any) -> Any:
    return "no grad" if value is None else value


def _num(value: Any) -> float:
    from layerlab.report_diff.numbers import as_number

    x = as_number(value)
    return x if x is not None and x == x else 0.0
