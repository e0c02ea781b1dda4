"""Re-run a failing forward on a copy: once with the op trace (where did the bad input come from?),
then with the suggested fix applied, following the chain of failures until the model runs; then
judge the fixed copy with the oracles (:mod:`layerlab.engine.oracles`) and search the edit grammar
(:mod:`layerlab.engine.fix_search`) where the rule's fix fails one (see :mod:`layerlab.probe.fix_judging`).

Both runs use a deep copy of the model (the user's model is never touched), the same inputs and
the same seed (dropout masks as in the real run), module hooks without statistics, and the op
trace. A fix's verification stops when the model runs (``runs``), when a failure has no mechanical
fix or the same fix comes back (``still-fails``), or at the time cap or step limit
(``not-verified``); a fix that runs but fails an oracle is ``implausible``, never *the* fix. Only metadata is kept: output shapes, never outputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from layerlab.probe.context import FailureContext
from layerlab.probe.report import Verification, VerifiedStep
from layerlab.target.copying import copy_model as deep_copy

#: At most this many fixes in a row (a chain longer than that is not "a fix").
MAX_STEPS = 6


@dataclass
class Outcome:
    """One traced forward: its output shapes, or the context of its failure."""

    ok: bool
    outputs: List[List[int]] = field(default_factory=list)
    ctx: Optional[FailureContext] = None


def copy_model(module: torch.nn.Module, mode: Optional[str]) -> Optional[torch.nn.Module]:
    try:
        clone = deep_copy(module)
    except Exception:  # a module holding something that cannot be copied: no replay, no verification
        return None
    if mode is not None:
        clone.train(mode == "train")
    return clone


def traced_forward(model: torch.nn.Module, args: tuple, kwargs: dict, seed: Optional[int],
                   substitutions=None) -> Outcome:
    """Run ``model(*args, **kwargs)`` with module hooks (no statistics) and the op trace."""
    from layerlab.probe.hooks import ProbeBug, flatten
    from layerlab.probe.ops import tracing
    from layerlab.target.seeding import seeded

    with seeded(seed, model, [*args, *kwargs.values()]), tracing(model, substitutions) as (recorder, trace):
        try:
            out = model(*args, **kwargs)
        except ProbeBug as bug:
            raise bug.original from None
        except Exception as exc:  # the context keeps the live arguments: built before the hooks go
            return Outcome(False, ctx=context_of(recorder, trace, exc))
    return Outcome(True, outputs=[list(v.shape) for _, v in flatten(out, "") if isinstance(v, torch.Tensor)])


def context_of(recorder, trace, exc: BaseException, index: Optional[int] = None,
               live: Optional[tuple] = None) -> FailureContext:
    """The failure context of the innermost open call (or ``index`` with its ``live`` arguments)."""
    if index is None:
        open_calls = recorder.open_calls()
        index = open_calls[-1] if open_calls else None
        live = recorder.live.get(index, ((), {})) if index is not None else ((), {})
    args, kwargs = live or ((), {})
    module = recorder.modules[index] if index is not None else None
    path = recorder.calls[index].path if index is not None else ""
    outer = [(recorder.calls[i].path, *recorder.live[i]) for i in recorder.open_calls() if i in recorder.live]
    return FailureContext(module=module, path=path, args=args, kwargs=kwargs, exc=exc, recorder=recorder,
                          trace=trace, outer=outer)


def location(ctx: FailureContext) -> str:
    """``conv (Conv1d)`` or ``view at model.py:41 in block (Block)``."""
    failed = ctx.failed_op
    module = f"{ctx.path or '(root)'} ({type(ctx.module).__name__})" if ctx.module is not None else "outside any module"
    if failed is not None:
        return f"{failed.record.label} in {module}"
    return module


def replay(module, args, kwargs, seed, mode, path: Optional[str], exc: BaseException) -> Optional[FailureContext]:
    """The failure again, on a copy, with the op trace on — if it fails the same way."""
    clone = copy_model(module, mode)
    if clone is None:
        return None
    outcome = traced_forward(clone, args, kwargs, seed)
    ctx = outcome.ctx
    if outcome.ok or ctx is None:
        return None
    if ctx.path != path or type(ctx.exc) is not type(exc) or str(ctx.exc) != str(exc):
        return None
    return ctx


def verify(module, args, kwargs, seed, mode, first, budget_s: float, ctx: Optional[FailureContext] = None
           ) -> Optional[Verification]:
    """Apply ``first.fix`` to a copy and re-run; follow the next failures' fixes (see module doc).
    Then judge the fixed copy with the oracles and search the edit grammar where the rule's fix fails
    one, changes parameters, or is missing (:func:`judge_and_search`: it may replace ``first.fix``)."""
    chained, fixed, flattened = follow(module, args, kwargs, seed, mode, first, budget_s)
    return judge_and_search(module, args, kwargs, seed, mode, first, chained, fixed, ctx, flattened)


def follow(module, args, kwargs, seed, mode, first, budget_s: float):
    """``(Verification, FixedModel or None, flattened)``: the rule's fix and the fixes of the failures
    after it; ``flattened``: the layers met failing on a flattened input (for the oracles)."""
    from layerlab.engine.oracle_sizes import flattened_inputs
    from layerlab.probe.blame import diagnose
    from layerlab.probe.fixes import FixError, FixedModel, apply_step

    if first is None or first.fix is None:
        return None, None, {}
    deadline = time.perf_counter() + budget_s
    clone = copy_model(module, mode)
    if clone is None:
        return Verification("not-verified", [first.fix], note="the model cannot be copied"), None, {}
    fixed = FixedModel(clone, {})
    steps, then, flattened = [first.fix], [], {}
    applied = {(first.fix.where, first.fix.code)}
    try:
        apply_step(fixed, first.fix)
    except FixError as exc:
        return Verification("not-verified", steps, note=f"the fix could not be applied: {exc}"), None, {}
    for _ in range(MAX_STEPS):
        if time.perf_counter() > deadline:
            return Verification("not-verified", steps, then, note=f"stopped at the time cap of {budget_s:.0f} s"), None, {}
        outcome = traced_forward(fixed.model, args, kwargs, seed, fixed.substitutions)
        if outcome.ok:
            return Verification("runs", steps, then, outputs=outcome.outputs), fixed, flattened
        ctx = outcome.ctx
        flattened.update(flattened_inputs(ctx))
        d = diagnose(ctx)
        where = location(ctx)
        message = d.message if d is not None else f"{type(ctx.exc).__name__}: {_first_line(ctx.exc)}"
        if first.fix.params.get("alone"):  # a fix that must work by itself: no resizing after it
            then.append(VerifiedStep(where, message, None))
            return Verification("still-fails", steps, then, note="the fix alone does not make the model run: "
                                "it may not be the right one"), None, {}
        if d is None or d.fix is None or (d.fix.where, d.fix.code) in applied:
            then.append(VerifiedStep(where, message, None))
            return Verification("still-fails", steps, then,
                                note=None if d is None or d.fix is None else "the same fix comes back: it did not help"), None, {}
        then.append(VerifiedStep(where, message, d.fix))
        steps.append(d.fix)
        applied.add((d.fix.where, d.fix.code))
        try:
            apply_step(fixed, d.fix)
        except FixError as exc:
            return Verification("not-verified", steps, then, note=f"the fix could not be applied: {exc}"), None, {}
    return Verification("not-verified", steps, then, note=f"more than {MAX_STEPS} fixes in a row"), None, {}


def judge_and_search(*args, **kwargs):
    from layerlab.probe.fix_judging import judge_and_search as judged

    return judged(*args, **kwargs)


def _first_line(exc: Any) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
