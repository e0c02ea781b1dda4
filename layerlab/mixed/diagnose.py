"""Which numbers of a half run are problems, the first module that has one, and why.

Rules (``tol`` = :class:`~layerlab.mixed.dtypes.Tolerance` of the run's dtype):

* **non-finite** — an output is inf/NaN where float32 is finite and the call's inputs were finite
  in this run (it made them itself); ``overflow`` when float32 values there exceed the dtype's range.
* **precision** — ``error > tol.output`` and ``error > tol.gain × input_error``: the call's own
  computation added the error (an error carried in from before is not this call's fault).
* A flagged call with a flagged call inside it is ``inherited``: only the innermost is blamed.
  The *first* finding is the innermost flagged call that started first (forward order).
* A precision finding whose input already lost its spread (a large offset added in half
  precision just before it) is blamed on that add (:mod:`~layerlab.mixed.offsets`).
* The rows then tell the findings' story (:func:`retell`): a call whose finding is blamed on
  another call's op (that add, a running sum that absorbed increments) or on rounding before it
  ran is ``upstream`` (its output is off because its input was, not by its own computation), no
  longer ``precision``; the call whose op is blamed carries ``precision``; ``inherited`` is then
  worked out again from the calls that lost precision themselves.
* **underflow** (float16 runs) — more than 1 % of a parameter gradient's norm is carried by
  elements that are small (below 2⁻¹⁴) in float32 and exactly 0 here.
* **gradient** — a parameter gradient's error above ``tol.grad``: a warning naming it (the
  backward of everything after it contributes; the forward rows say where, if anywhere). With no
  forward finding, :mod:`~layerlab.mixed.kinks` checks whether ReLU inputs that rounding moved
  across 0 explain it; if they do, an info note says so instead (:func:`at_a_kink`).
* The model output's error above ``tol.output`` with no call flagged: a warning (error that
  grows module by module, no single culprit).

:func:`forecast` reads float16's future from the float32 run alone: values above 65504 and
gradients that float16 would flush to zero. Those are warnings; the float16 run is the test.
"""

from __future__ import annotations

import math
from typing import Dict, List

from layerlab.mixed import causes, magnitude, offsets
from layerlab.mixed.capture import Key
from layerlab.mixed.compare import ops_by_call
from layerlab.mixed.dtypes import FP16_MAX, UNDERFLOW_FRACTION, Tolerance
from layerlab.mixed.report import Finding, ModuleRow, ParamRow
from layerlab.mixed.runs import RunResult

#: how many flagged calls beyond the first get their own finding
MORE_FINDINGS = 3


def _eps(value: float, tol: Tolerance) -> str:
    return "inf" if math.isinf(value) else f"{value:.2g} ({value / tol.eps:.3g}·eps)"


def flag(rows: List[ModuleRow], ref: RunResult, run: RunResult, tol: Tolerance) -> None:
    """Set each row's ``flags`` (non-finite, overflow, precision, inherited)."""
    for row in rows:
        key = (row.path, row.call)
        r, c = ref.calls[key], run.calls[key]
        ref_finite = all(o.finite for o in r.outputs)
        inputs_finite = all(i.finite for i in c.inputs)
        if not row.finite and ref_finite and inputs_finite:
            row.flags.append("non-finite")
            if row.dtype == "float16" or tol.dtype == "float16":
                big = max([row.amax or 0.0] + [op.amax or 0.0 for op in ref.ops if op.key == key])
                if big > FP16_MAX:
                    row.flags.append("overflow")
        elif row.finite and row.error is not None and not math.isnan(row.error) and row.error > tol.output \
                and (not row.input_error or row.error > tol.gain * row.input_error):
            row.flags.append("precision")
    flagged = {(r.path, r.call): r for r in rows if r.flags}
    blamed = set(innermost(flagged, ref))
    for key, row in flagged.items():
        if key not in blamed:
            row.flags.append("inherited")


def findings(rows: List[ModuleRow], param_rows: List[ParamRow], ref: RunResult, run: RunResult, tol: Tolerance,
             device_type: str) -> List[Finding]:
    """The run's findings, the first (innermost, earliest) failing module first."""
    label = run.setting.label
    out: List[Finding] = []
    half_ops = ops_by_call(run.ops)
    ref_ops = ops_by_call(ref.ops)
    blamed = [r for r in rows if r.flags and "inherited" not in r.flags]
    overflowed = any(not r.finite for r in rows)  # inf/NaN in the forward, at a module or inside one
    modules = {c.order: c.class_name for c in run.calls.values()}  # an op's ``from_call`` → its class
    by_order = {c.order: k for k, c in run.calls.items()}
    sizes = _sizes(ref, run, by_order)
    context = dict(modules=modules, sizes=sizes)
    moved: List[tuple] = []  # (row key, key of the call whose op is blamed, or None: before it ran)
    for row in blamed[:1 + MORE_FINDINGS]:
        key: Key = (row.path, row.call)
        library = ref.calls[key].library
        where = row.label
        if "non-finite" in row.flags:
            cause = causes.overflow(row.class_name, row.amax, ref_ops.get(key, []), tol.dtype, device_type)
            if cause is None:
                cause = causes.explain(row.class_name, half_ops.get(key, []), tol.dtype, device_type, library,
                                       ref_ops.get(key, []), non_finite=True, **context)
            cause = _with_eps(cause, half_ops.get(key, []), device_type)
            message = f"{row.label} ({row.class_name}) outputs inf/NaN in {label}; float32 is finite there"
            kind = "overflow" if "overflow" in row.flags else "non-finite"
        else:  # a float16 value past 65504 saturates as often as it goes non-finite (tanh(inf) = 1)
            cause = causes.overflow(row.class_name, row.amax, ref_ops.get(key, []), tol.dtype, device_type) or \
                causes.explain(row.class_name, half_ops.get(key, []), tol.dtype, device_type, library,
                               ref_ops.get(key, []), **context)
            inherited = f"; its inputs carried {_eps(row.input_error, tol)}" if row.input_error else \
                "; its inputs were exact"
            message = (f"{row.label} ({row.class_name}) loses precision in {label}: output error "
                       f"{_eps(row.error, tol)} > {tol.output:.2g}{inherited}")
            # the same numbers, said of a call whose error was made before it (upstream, see retell)
            shown = (f"{row.label} ({row.class_name}) shows it in {label}, not of its own making: output error "
                     f"{_eps(row.error, tol)} > {tol.output:.2g}{inherited}")
            kind = "precision"
            # a cancellation whose large operand a module call made: if that call's own adds rounded
            # small increments away, the information was lost there, not in the subtraction
            maker = by_order.get(cause.operand_call) if cause is not None and cause.what == "cancellation" else None
            if maker is not None:
                lost = magnitude.absorbed(half_ops.get(maker, []), ref_ops.get(maker, []), sizes)
                if lost is not None:
                    cause, where = lost, maker[0] or "(root)"
                    message = (f"{where} ({ref.calls[maker].class_name}) rounds away what {row.label} needs: "
                               f"{shown}")
                    moved.append((key, maker))
            # its input's spread was gone before it ran: blame the op that rounded it away (only where
            # the call's own ops explain nothing more specific than a variance or a cancellation)
            if (cause is None or cause.what in ("variance", "cancellation")) and where == row.label:
                lost = offsets.explain(key, row.class_name, ref, run, tol, device_type, row.error)
                if lost is not None:
                    cause, maker = lost
                    moved.append((key, maker if maker != key else None))
                    if maker is not None and maker != key:
                        where = maker[0] or "(root)"
                        message = (f"{where} ({ref.calls[maker].class_name}) rounds away the spread of "
                                   f"{row.label}'s input: {shown}")
                    else:
                        message = f"the spread of {row.label}'s input was lost before it ran: {shown}"
        overflowed = overflowed or (cause is not None and cause.what == "overflow")
        out.append(Finding(severity="error", kind=kind, where=where, message=message,
                           cause=cause.text if cause else "I can't tell which op: it is not one the rules "
                                                            "know (see the ops column)",
                           fix=cause.fix if cause else causes.unexplained_fix(device_type),
                           source=cause.source if cause else None, run=label))
    retell(rows, moved, ref)
    if len(blamed) > 1 + MORE_FINDINGS:
        out.append(Finding(severity="info", kind="precision", where="", run=label,
                           message=f"{len(blamed) - 1 - MORE_FINDINGS} more module call(s) flagged (see the table)"))
    forward = bool(out)
    under = _underflow(param_rows, tol, label, after_nonfinite=overflowed)
    out.extend(under)
    out.extend(_gradient(param_rows, tol, label, forward, underflow=bool(under)))
    root = next((r for r in rows if r.path == "" and r.call == 1), None)
    if not blamed and root is not None and root.error is not None and root.finite and root.error > tol.output:
        out.append(Finding(severity="warning", kind="precision", where="(root)", run=label,
                           message=f"the model's output error {_eps(root.error, tol)} is above {tol.output:.2g}, "
                                   "yet no single module adds it: it grows module by module",
                           fix="run the largest-error modules in float32 to see which ones matter"))
    return out


#: flags that say a call's own computation went wrong (``upstream`` and ``inherited`` say it did not)
OWN = ("precision", "non-finite")


def retell(rows: List[ModuleRow], moved: List[tuple], ref: RunResult) -> None:
    """Make the rows say what the findings say. ``moved``: ``(key, maker)`` for each finding blamed
    away from its call — on ``maker``'s own op, or (``maker`` ``None``) on rounding before the call ran.
    The call becomes ``upstream``; ``maker`` carries ``precision``; ``inherited`` is recomputed."""
    if not moved:
        return
    by_key = {(r.path, r.call): r for r in rows}
    makers = set()
    for key, maker in moved:
        # the call, and the calls around it up to the maker: their output error is the same loss, seen
        # through them (a relative input error cannot show a lost spread, so flag() took it for theirs)
        above = set()  # the maker and the calls around it (it may be a sibling: a running sum's module)
        at = maker
        while at is not None and at in ref.calls:
            above.add(at)
            at = ref.calls[at].parent
        chain, at = [key], ref.calls[key].parent if key in ref.calls else None
        while at is not None and at not in above and at in ref.calls:
            chain.append(at)
            at = ref.calls[at].parent
        for i, k in enumerate(chain):
            row = by_key.get(k)
            if row is not None and (i == 0 or "precision" in row.flags):
                row.flags = [f for f in row.flags if f not in ("precision", "inherited")] + ["upstream"]
        if maker is not None and maker in by_key:
            makers.add(maker)
            mine = by_key[maker]
            if "precision" not in mine.flags:
                mine.flags.insert(0, "precision")
    own = [(r.path, r.call) for r in rows if any(f in OWN for f in r.flags)]
    outer = set(own) - set(innermost(own, ref))
    for key, row in by_key.items():
        row.flags = [f for f in row.flags if f != "inherited"]
        if key in outer and key not in makers:  # a blamed maker keeps its blame, whatever it contains
            row.flags.append("inherited")


def _sizes(ref: RunResult, run: RunResult, by_order: Dict[int, Key]) -> magnitude.Sizes:
    """Float32 magnitudes of every module call's output and (when both runs ran the same ops) of
    every op, keyed by the half run's indices: the sizes of operands that another call made."""
    sizes = magnitude.Sizes(callers={c.order: f"{k[0] or '(root)'} ({c.class_name})" for k, c in run.calls.items()})
    for order, k in by_order.items():
        found = [o.amax for o in ref.calls[k].outputs if o.amax is not None] if k in ref.calls else []
        if found:
            sizes.calls[order] = max(found)
    paired = causes.float32_amax(run.ops, ref.ops)
    for op in run.ops:
        if op.record.index in paired:
            owner = run.calls[op.key].order if op.key in run.calls else None
            sizes.ops[op.record.index] = (paired[op.record.index], owner)
    return sizes


def _underflow(param_rows: List[ParamRow], tol: Tolerance, label: str, after_nonfinite: bool = False) -> List[Finding]:
    """Gradients that are 0 in a float16 run where float32's are small. After inf/NaN in the forward
    they may be zeros of another kind (x / inf = 0, a gradient through a saturated op): said as a
    possibility, not as underflow."""
    if tol.dtype != "float16":
        return []
    bad = [p for p in param_rows if p.zeroed is not None and p.zeroed > UNDERFLOW_FRACTION]
    if after_nonfinite and bad:
        names = ", ".join(p.name for p in bad[:MORE_FINDINGS + 1])
        return [Finding(severity="warning", kind="underflow", where=bad[0].name, run=label,
                        message=f"gradients of {names} are 0 in {label} where float32's are small, after inf/NaN "
                                "in the forward (above): they may follow from those (x / inf = 0) rather than from "
                                "underflow; fix the forward first and check again")]
    out = []
    for p in bad[:MORE_FINDINGS]:
        out.append(Finding(severity="error", kind="underflow", where=p.name, run=label,
                           message=f"{100 * p.zeroed:.1f}% of the gradient of {p.name} (by norm) is 0 in {label}: "
                                   "its small elements underflow",
                           cause="float16 flushes |g| < 2⁻²⁵ to 0 (its smallest subnormal is 2⁻²⁴ ≈ 6e-8)",
                           fix=causes.underflow_fix("float16")))
    return out


#: the cause of a gradient warning that no forward finding explains (:mod:`~layerlab.mixed.kinks` checks it)
IN_THE_BACKWARD = "no forward output is off by as much: the loss of precision is in the backward"


def over_grad_bar(param_rows: List[ParamRow], tol: Tolerance) -> List[ParamRow]:
    """The parameters whose gradient error is above the bar."""
    return [p for p in param_rows if p.error is not None and not math.isnan(p.error) and p.error > tol.grad]


def _gradient(param_rows: List[ParamRow], tol: Tolerance, label: str, explained: bool,
              underflow: bool = False) -> List[Finding]:
    """``explained``: a forward finding precedes it; ``underflow``: only gradient underflow does
    (float16 without a loss scale: small gradients lose their bits as well as their zeros)."""
    bad = over_grad_bar(param_rows, tol)
    if not bad:
        return []
    worst = max(bad, key=lambda p: p.error)
    why = "the forward finding above is the likely source" if explained else \
        "the gradient underflow above is the likely source: small gradients lose bits before they reach 0" \
        if underflow else IN_THE_BACKWARD
    return [Finding(severity="warning", kind="gradient", where=worst.name, run=label,
                    message=f"gradient of {worst.name} is off by {_eps(worst.error, tol)} > {tol.grad:.2g} in {label}"
                            + (f" ({len(bad) - 1} more parameter(s) above it)" if len(bad) > 1 else ""),
                    cause=why)]


def at_a_kink(warning: Finding, verdict, tol: Tolerance) -> Finding:
    """The info note that replaces a gradient ``warning`` which kink flips explain
    (``verdict``: :class:`~layerlab.mixed.kinks.Verdict`, :meth:`~layerlab.mixed.kinks.Verdict.explains`)."""
    parts = []
    for f in (f for f in verdict.flips if f.flipped):
        what = "max-pool windows picked another element" if f.family == "max-pool" else \
            f"{f.family} inputs took the other side of the kink"
        text = f"{f.flipped} of {f.total} {what}"
        if f.example is not None:
            here = f", {f.example[1]:.1e} here" if f.example[1] is not None else ""
            text += f" (e.g. {f.example[0]:.1e} in float32{here})"
        parts.append(text)
    worst = max(verdict.errors.values())
    return Finding(severity="info", kind="gradient", where=warning.where, run=warning.run,
                   message=f"{warning.message}: {'; '.join(parts)}; float32 on the same sides differs by "
                           f"{100 * worst:.2g} % ({worst / tol.eps:.2g}·eps): rounding at a kink, not lost precision in "
                           "the backward",
                   cause="an input within rounding of a kink (a ReLU input near 0) took the other branch, "
                         "switching its gradient path off or on: one such element moves a small model's gradients by percents")


def forecast(ref: RunResult, device_type: str, fp16_ran: bool) -> List[Finding]:
    """float16 overflow and underflow read from the float32 values (warnings; ``info`` when a
    float16 run measured the real thing)."""
    severity = "info" if fp16_ran else "warning"
    out: List[Finding] = []
    by_call: Dict[Key, list] = ops_by_call(ref.ops)
    found = {}
    for key, call in ref.calls.items():
        amax = max((o.amax for o in call.outputs), default=0.0)
        cause = causes.overflow(call.class_name, amax, by_call.get(key, []), "float16", device_type)
        if cause is not None:
            found[key] = cause
    for key in innermost(found, ref)[:1]:
        cause, call = found[key], ref.calls[key]
        where = key[0] or "(root)"
        out.append(Finding(severity=severity, kind="fp16-overflow", where=where, source=cause.source,
                           message=f"{where} ({call.class_name}) would overflow in float16: {cause.text}",
                           fix=cause.fix, run="float32 values"))
    from layerlab.mixed.compare import flushed_share, negligible_grads

    noise = negligible_grads(ref)
    for name, g in ref.grads.items():
        share = flushed_share(ref, name) if g is not None and name not in noise else 0.0
        if share > UNDERFLOW_FRACTION:
            out.append(Finding(severity=severity, kind="fp16-underflow", where=name, run="float32 values",
                               message=f"{100 * share:.1f}% of the gradient of {name} (by norm) is below 2⁻²⁵ in "
                                       "float32: float16 flushes it to 0 (under this check's unit-norm loss)",
                               fix=causes.underflow_fix("float16")))
            break
    return out


def innermost(keys, ref: RunResult) -> List[Key]:
    """The calls of ``keys`` with none of ``keys`` inside them, in the order they started."""
    outer = set()
    for key in keys:
        parent = ref.calls[key].parent
        while parent is not None and parent not in outer:
            outer.add(parent)
            parent = ref.calls[parent].parent if parent in ref.calls else None
    return sorted((k for k in keys if k not in outer), key=lambda k: ref.calls[k].order)


def _with_eps(cause, ops: list, device_type: str):
    """In a call whose output is inf/NaN, an eps that is 0 in its dtype (``x.pow(2).mean() + 1e-12`` in
    float16) guards nothing: said as the cause when no other is found, else added to it (whether the
    zero it was there to guard is real, a padded row, or made by rounding, the other cause says)."""
    from dataclasses import replace

    from layerlab.mixed.magnitude import eps_underflow

    eps = next((c for c in (eps_underflow(op, device_type) for op in ops) if c is not None), None)
    if eps is None or (cause is not None and cause.what == "eps-underflow"):
        return cause
    if cause is None:
        return eps
    return replace(cause, text=f"{cause.text}; also, {eps.text}", fix=f"{cause.fix}; and {eps.fix}")
