"""Turn what the recorder and the backward pass collected into an :class:`InspectReport`.

All device-to-host conversion happens here, once, after the run: statistics, gradient norms and
parameter norms. Then the judgements: formula checks, parameter gradient flags and problems
(first NaN/Inf in the forward and in the backward, gradients that vanish, explode or never
arrive).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.nn.parameter import is_lazy

from layerlab.errors import Problem
from layerlab.probe.formula import check_call
from layerlab.probe.hooks import Recorder, device_name, dtype_name
from layerlab.probe.report import CallRecord, FormulaCheck, ParamRecord, TensorInfo
from layerlab.probe.stats import finish_norms, finish_stats, grad_stats, l2_norms, l2_norms_of


def fill_tensor_stats(recorder: Recorder, infos: Sequence[TensorInfo]) -> None:
    """Attach finished statistics and gradients to every :class:`TensorInfo` (by slot)."""
    stats = finish_stats(recorder.slot_stats)
    grads = [grad_stats(v) for v in finish_norms(recorder.slot_grads)]
    for info in infos:
        if info.slot is not None:
            info.stats = stats[info.slot]
            info.grad = grads[info.slot]


def formula_checks(recorder: Recorder) -> List[FormulaCheck]:
    checks = []
    for record, module in zip(recorder.calls, recorder.modules):
        if any(i.nested for i in record.inputs):  # ragged sizes: no formula to check them against
            continue
        check = check_call(record, module)
        if check is not None:
            checks.append(check)
    return checks


def param_records(
    module: torch.nn.Module,
    grads: Optional[Dict[str, Optional[torch.Tensor]]],
    *,
    scale: float,
    vanish: float,
    explode: float,
    named: Optional[List[Tuple[str, torch.nn.Parameter]]] = None,
) -> List[ParamRecord]:
    """One record per parameter; with ``grads`` (name → gradient) the gradient columns and flags.

    ``named``: ``list(module.named_parameters())`` when the caller has it already.
    """
    if named is None:
        named = list(module.named_parameters())
    # a lazy module whose forward never ran (an earlier layer raised) has no sizes yet
    named = [(n, p) for n, p in named if not is_lazy(p)]
    tensors = [p for _, p in named]
    grad_norms: List[Optional[float]] = [None] * len(named)
    if grads is None:
        weight_norms = finish_norms(l2_norms(tensors))
    else:
        present = [i for i, (n, _) in enumerate(named) if grads.get(n) is not None]
        weights, got = l2_norms_of(tensors, [grads[named[i][0]] for i in present])
        values = finish_norms(weights + got)  # one conversion for both
        weight_norms = values[:len(named)]
        for i, value in zip(present, values[len(named):]):
            grad_norms[i] = value
    records = []
    for (name, p), norm, g in zip(named, weight_norms, grad_norms):
        rec = ParamRecord(
            name=name, module=name.rpartition(".")[0], shape=list(p.shape), dtype=dtype_name(p.dtype),
            device=device_name(p.device), numel=p.numel(), trainable=p.requires_grad, norm=norm,
        )
        if grads is not None and p.requires_grad:
            _judge_param(rec, g, scale=scale, vanish=vanish, explode=explode)
        records.append(rec)
    return records


def _judge_param(rec: ParamRecord, g: Optional[float], *, scale: float, vanish: float, explode: float) -> None:
    rec.grad_norm = g
    if g is None:
        rec.flags.append("no-grad")
        return
    if rec.norm:
        rec.ratio = g / rec.norm
    rec.grad_nan = g != g
    rec.grad_inf = g in (float("inf"), float("-inf"))
    if rec.grad_nan:
        rec.flags.append("nan")
    elif rec.grad_inf:
        rec.flags.append("inf")
    elif g == 0:
        rec.flags.append("zero-grad")
    elif g < vanish * scale:
        rec.flags.append("vanishing")
    elif g > explode * scale:
        rec.flags.append("exploding")


def _ran(calls: List[CallRecord], path: str) -> int:
    return sum(1 for c in calls if c.path == path)


def _name(call: CallRecord) -> str:
    return f"{call.label} ({call.class_name})"


def param_problems(params: List[ParamRecord], calls: List[CallRecord], vanish: float, explode: float) -> List[Problem]:
    problems = []
    for p in params:
        if "no-grad" in p.flags:
            ran = _ran(calls, p.module)
            why = (
                f"its module {p.module or '(root)'} never ran" if not ran
                else "it is not used in the forward, or only on a path cut by .detach() / torch.no_grad()"
            )
            problems.append(Problem(
                "no-grad", f"trainable parameter {p.name} received no gradient: {why}", where=p.name,
                hint="remove it, use it, or freeze it with requires_grad_(False) if that is intended",
            ))
        elif p.flags and p.flags[0] in ("nan", "inf"):
            problems.append(Problem(
                f"{p.flags[0]}-grad", f"the gradient of {p.name} holds {p.flags[0].upper()}", where=p.name,
                severity="error",
            ))
        elif "zero-grad" in p.flags:
            problems.append(Problem(
                "zero-grad", f"the gradient of {p.name} is exactly zero (dead units or a masked path)",
                where=p.name,
            ))
        elif "vanishing" in p.flags or "exploding" in p.flags:
            kind = p.flags[0]
            bound = f"< {vanish:g}" if kind == "vanishing" else f"> {explode:g}"
            problems.append(Problem(
                kind, f"the gradient of {p.name} is {kind}: ‖grad‖ = {p.grad_norm:.3g} {bound} × the output gradient",
                where=p.name, data={"grad_norm": p.grad_norm},
            ))
    return problems


def _nonfinite(info: TensorInfo, grad: bool) -> bool:
    if grad:
        return info.grad is not None and not info.grad.finite
    return info.stats is not None and not info.stats.finite


def _what(info: TensorInfo, grad: bool) -> str:
    if grad:
        return "NaN" if info.grad.nan else "Inf"
    s = info.stats
    return " and ".join(x for x, n in (("NaN", s.nan), ("Inf", s.inf)) if n)


def first_nonfinite_forward(calls: List[CallRecord]) -> Optional[Problem]:
    """The first finished call (children before parents) whose output holds NaN or Inf."""
    done = sorted((c for c in calls if c.end is not None), key=lambda c: c.end)
    for call in done:
        bad = [o for o in call.outputs if _nonfinite(o, grad=False)]
        if not bad:
            continue
        what = _what(bad[0], grad=False)
        tainted = [i for i in call.inputs if _nonfinite(i, grad=False)]
        if not tainted:
            msg = f"{what} first appears in the output of {_name(call)}; its inputs were finite"
            where = call.path
        else:
            src = tainted[0]
            origin = (
                f"the output of call #{src.source}" if src.source is not None
                else "code outside any module call (a model input, or a functional op in the parent's forward)"
            )
            msg = (f"{what} first reaches a module output at {_name(call)}; its input {src.name!r} already held "
                   f"it, made by {origin}")
            where = call.path
        return Problem(
            "nonfinite-forward", msg, where=where or "(root)", severity="error",
            hint="check this layer's arguments and its input range (log/sqrt/div of ≤ 0, overflow in float16)",
            data={"call": call.index},
        )
    return None


def first_nonfinite_backward(calls: List[CallRecord]) -> Optional[Problem]:
    """The first call in backward order whose input gradient holds NaN/Inf while its output's did not."""
    done = sorted((c for c in calls if c.end is not None), key=lambda c: c.end, reverse=True)
    for call in done:
        bad_in = [i for i in call.inputs if _nonfinite(i, grad=True)]
        if not bad_in:
            continue
        if any(_nonfinite(o, grad=True) for o in call.outputs):
            continue
        return Problem(
            "nonfinite-backward",
            f"{_what(bad_in[0], grad=True)} first appears in the backward of {_name(call)}: the gradient "
            f"w.r.t. its input {bad_in[0].name!r} is not finite while the one w.r.t. its output is",
            where=call.path or "(root)", severity="error", data={"call": call.index},
        )
    for call in done:  # the gradient arrived non-finite from the loss itself
        if any(_nonfinite(o, grad=True) for o in call.outputs):
            return Problem(
                "nonfinite-backward", f"the gradient w.r.t. the output of {_name(call)} is already not finite",
                where=call.path or "(root)", severity="error", data={"call": call.index},
            )
    return None


def activation_grad_problems(calls: List[CallRecord], scale: float, vanish: float, explode: float,
                             expected: Optional[Callable[[CallRecord], bool]] = None) -> List[Problem]:
    """One problem for the first call (backward order) whose output gradient vanishes or explodes.

    ``expected(call)``: whether a small gradient at that call is explained (passed over).
    """
    problems = []
    done = sorted((c for c in calls if c.end is not None), key=lambda c: c.end, reverse=True)
    for kind, test in (("vanishing", lambda g: 0 < g < vanish * scale), ("exploding", lambda g: g > explode * scale)):
        for call in done:
            norms = [o.grad.norm for o in call.outputs if o.grad is not None and o.grad.finite]
            if norms and any(test(g) for g in norms):
                if kind == "vanishing" and expected is not None and expected(call):
                    continue
                problems.append(Problem(
                    f"{kind}-activation-grad",
                    f"the gradient reaching the output of {_name(call)} is {kind}: ‖grad‖ = {max(norms):.3g} "
                    f"against {scale:.3g} at the model output",
                    where=call.path or "(root)", data={"call": call.index},
                ))
                break
    return problems


def explain_gradients(
    problems: List[Problem], params: List[ParamRecord], recorder: Recorder, module: torch.nn.Module,
    scale: float, vanish: float, explode: float,
) -> Tuple[List[Problem], List[Problem]]:
    """Take the gradients that are small or zero by construction out of the warnings.

    Returns ``(problems, notes)``: parameters explained by a rule of
    :mod:`~layerlab.probe.gradient_causes` (key bias, bias before a batch-statistics norm, layer
    scale) lose their warning and get one note per rule; a vanishing activation gradient inside a
    layer-scaled block is passed over; the zero-gradient warnings upstream of the place where the
    gradient stops become one finding (:mod:`~layerlab.probe.gradient_root`).
    """
    from layerlab.probe import gradient_causes as causes
    from layerlab.probe.gradient_root import fold_zero_grads
    from layerlab.probe.layer_drop import layer_dropped

    view = causes.View(module, recorder.calls, recorder.modules)
    explained = causes.explain_params(params, view, scale, vanish)
    names = {e.param for e in explained}
    kept = [p for p in problems if not (p.code in ("vanishing", "zero-grad") and p.where in names)]
    notes = causes.notes_for(explained)

    def in_scaled_block(call: CallRecord) -> bool:
        found = causes.scaled_block(call.path, view, scale, vanish)
        norms = [o.grad.norm for o in call.tensor_outputs if o.grad is not None and o.grad.finite]
        return found is not None and min(norms) / found[2] >= vanish * scale

    if any(p.code == "vanishing-activation-grad" for p in kept):
        again = activation_grad_problems(recorder.calls, scale, vanish, explode, expected=in_scaled_block)
        kept = [p for p in kept if p.code != "vanishing-activation-grad"]
        kept += [p for p in again if p.code == "vanishing-activation-grad"]
    kept, root_notes = fold_zero_grads(kept, params, recorder.calls, recorder.modules)
    kept, dropped = layer_dropped(kept, module, recorder.calls)  # LayerDrop skipped them: a note
    return kept, notes + root_notes + dropped


def output_grad_scale(outputs: List[TensorInfo]) -> Optional[float]:
    norms = [o.grad.norm for o in outputs if o.grad is not None and o.grad.finite]
    return sum(g * g for g in norms) ** 0.5 if norms else None


def totals(
    module: torch.nn.Module, named: Optional[List[Tuple[str, torch.nn.Parameter]]] = None
) -> Tuple[int, int]:
    """All and trainable parameter counts (``named``: ``list(module.named_parameters())`` if known).

    A lazy parameter that was never materialised (its module never ran) counts as 0.
    """
    params = [p for _, p in named] if named is not None else list(module.parameters())
    params = [p for p in params if not is_lazy(p)]
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
