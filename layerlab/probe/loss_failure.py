"""A failure raised while computing the loss: diagnosed by the same rules as a forward failure.

``layerlab.inspect(model, x, loss=fn)`` computes ``fn(output)`` after the forward. When ``fn`` raises
(a BCE target shaped ``(B,)`` for ``(B, 1)`` logits, float class indices, classes on the wrong
axis), the failure's phase is ``"loss"`` — not ``"backward"``, which is kept for what autograd's
backward raises — and it goes through the forward's machinery:

1. **Replay** on a deep copy of the model, same inputs and seed: the forward and then the loss, both
   under the op trace (:mod:`layerlab.probe.ops`), so the loss's ops are recorded with their source
   lines and the operands' origins reach back into the forward (``logits came from head (Linear)``).
   A module the loss calls (``nn.CrossEntropyLoss``) is found by a first pass with a global forward
   pre-hook, then hooked like a model's submodule (path ``loss``; ``loss.1`` … for more), so the
   module-stage rules see it with its live arguments. The replay must fail the same way (same
   exception type and message), else there is no diagnosis.
2. **Rules**: :func:`layerlab.probe.blame.diagnose` on that context, unchanged.
3. **Verification**: the fix (and the fixes of the failures after it) applied while re-running
   forward + loss on another copy: a ``replace-op`` through the trace's substitutions, an input fix
   of a loss module through a temporary pre-hook on that module (the loss callable calls the user's
   own object; the hook is removed right after), any other fix on the model's copy. "Verified"
   (``runs``) then means: the loss is a finite scalar, **backward** runs with finite gradients, and
   the **samples stay independent**: perturbing every sample but the first leaves the loss's
   gradient at the first unchanged (checked when the output is one tensor with one axis of the
   batch's size; :mod:`layerlab.probe.loss_checks`). A fix that runs but fails a check is
   ``implausible``; one that resizes a layer of the model to fit the loss is not claimed
   (``not-verified``: the layer or the loss's target may be what is wrong).

With ``fix=False`` nothing is re-run: the rules read the real run's op trace when ``ops=True`` (the
loss ran under it), else the failure has no diagnosis.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from layerlab.probe.context import FailureContext
from layerlab.probe.report import Diagnosis, Failure, FixStep, Origin, Verification, VerifiedStep

#: At most this many fixes in a row (as for a forward failure).
MAX_STEPS = 6
#: The path a module the loss calls gets in the report (``loss.1``, ``loss.2`` for more than one).
LOSS_PATH = "loss"


class LossRaised(Exception):
    """The user's loss raised (``original``): raised by :func:`compute_loss` so that the caller can
    tell it from a failure of autograd's backward."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


def compute_loss(loss: Callable[[Any], Any], output: Any, trace=None) -> torch.Tensor:
    """``loss(output)``, checked to be a scalar tensor, under ``trace`` (an op trace) when given;
    whatever it raises comes out as :class:`LossRaised` (layerlab's own hook bugs pass through)."""
    from layerlab.probe.hooks import ProbeBug

    try:
        with trace if trace is not None else contextlib.nullcontext():
            value = loss(output)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"loss must return a scalar tensor, got {type(value).__name__}"
                            + (f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""))
    except ProbeBug:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's loss raised: a finding
        raise LossRaised(exc) from exc
    return value


def loss_failure(exc: BaseException, message: str) -> Failure:
    """The report's Failure for a loss that raised (filled in by :func:`explain`); ``chain`` names the
    line of the user's code where it raised."""
    line = raised_at(exc)
    return Failure(phase="loss", exception=type(exc).__name__, message=message,
                   chain=[f"the loss at {line}"] if line else [])


def raised_at(exc: BaseException) -> Optional[str]:
    """``losses.py:12``: the innermost frame of the traceback outside torch and layerlab (the user's line)."""
    from layerlab.probe.ops import _display_path, _library_file

    found, tb = None, exc.__traceback__
    while tb is not None:
        if not _library_file(tb.tb_frame.f_code.co_filename):
            found = f"{_display_path(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


# -- loss modules -------------------------------------------------------------------------------------
def discover_modules(loss, output, model: torch.nn.Module) -> List[torch.nn.Module]:
    """The modules ``loss(output)`` calls that are not ``model``'s (its ``nn.CrossEntropyLoss``), found
    with a global forward pre-hook while it runs once (what it raises is ignored here)."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    own = {id(m) for m in model.modules()}
    found: List[torch.nn.Module] = []

    def seen(module, args):
        if id(module) not in own and not any(module is m for m in found):
            found.append(module)

    handle = register_module_forward_pre_hook(seen)
    try:
        with torch.no_grad():
            loss(output)
    except Exception:  # noqa: BLE001 - the failure itself: diagnosed in the traced run
        pass
    finally:
        handle.remove()
    # an outer module calling an inner one: the outermost is the loss; inner ones keep dotted paths
    return found


def _module_paths(modules: List[torch.nn.Module]) -> Dict[str, torch.nn.Module]:
    if len(modules) == 1:
        return {LOSS_PATH: modules[0]}
    return {LOSS_PATH if i == 0 else f"{LOSS_PATH}.{i}": m for i, m in enumerate(modules)}


# -- one run: forward + loss on a copy, traced -------------------------------------------------------------
@dataclass
class LossOutcome:
    """One traced forward + loss: the loss value, or the context of the failure (forward or loss)."""

    ok: bool
    value: Optional[torch.Tensor] = None
    output: Any = None
    ctx: Any = None
    phase: str = "loss"
    #: the op records of the loss (after the forward's)
    records: Optional[List[Any]] = None


@contextlib.contextmanager
def _fixed_context(model, loss_modules: Dict[str, torch.nn.Module], substitutions=None,
                   module_fixes: Tuple[FixStep, ...] = ()):
    """Module hooks (the model's and the loss modules') and the op trace, with the fixes active:
    yields ``(recorder, trace)``; every hook is removed on the way out."""
    from layerlab.probe.ops import tracing

    handles = []
    try:
        for step in module_fixes:  # before the recorder's hooks: the recorder sees the fixed arguments
            handles.append(_fix_hook(loss_modules[step.where], step))
        with tracing(model, substitutions) as (recorder, trace):
            recorder.install([(path, m) for path, m in loss_modules.items()])
            yield recorder, trace
    finally:
        for handle in handles:
            handle.remove()


def traced_run(model, args, kwargs, seed, loss, loss_modules: Dict[str, torch.nn.Module],
               substitutions=None, module_fixes: Tuple[FixStep, ...] = ()) -> LossOutcome:
    """``loss(model(*args, **kwargs))`` with module hooks (no statistics) and the op trace on both.
    ``module_fixes``: input fixes of the loss modules (by path), applied by a pre-hook while it runs."""
    from layerlab.probe.hooks import ProbeBug
    from layerlab.probe.verify_fix import context_of
    from layerlab.target.seeding import seeded

    with seeded(seed, model, [*args, *kwargs.values()]), \
            _fixed_context(model, loss_modules, substitutions, module_fixes) as (recorder, trace):
        phase = "forward"
        try:
            out = model(*args, **kwargs)
            phase, start = "loss", len(trace.records)
            value = compute_loss(loss, out)
        except ProbeBug as bug:
            raise bug.original from None
        except LossRaised as raised:
            inputs = [*args, *kwargs.values()]
            return LossOutcome(False, ctx=_context(recorder, trace, raised.original, loss_modules, inputs))
        except Exception as exc:  # noqa: BLE001 - a fixed copy's forward failing: the next failure
            return LossOutcome(False, ctx=context_of(recorder, trace, exc), phase=phase)
        return LossOutcome(True, value=value, output=out, records=trace.records[start:])


class LossContext(FailureContext):
    """The failure context of a loss: an operand that neither the model nor one of its inputs made is a
    tensor the loss holds (its target), never "a model input" — in the rules' words too."""

    model_inputs: Tuple[Any, ...] = ()

    def origin(self, name: str, t: torch.Tensor) -> Origin:
        found = super().origin(name, t)
        if not found.steps and self.made_by(t) == (None, None) and not any(t is a for a in self.model_inputs):
            found.steps = [LOSS_HELD]
        return found


#: How an operand of the loss that the model did not make is described.
LOSS_HELD = "a tensor the loss holds (not made by the model)"


def _context(recorder, trace, exc, loss_modules, model_inputs=()) -> LossContext:
    """The failure context of the loss: its innermost open loss-module call, or no module; no outer
    model call (the loss runs after the forward returned)."""
    from layerlab.probe.verify_fix import context_of

    ctx = context_of(recorder, trace, exc)
    fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)}
    fields["outer"] = [o for o in ctx.outer if o[0] in loss_modules]
    loss_ctx = LossContext(**fields)
    loss_ctx.model_inputs = tuple(model_inputs)
    return loss_ctx


def _fix_hook(module: torch.nn.Module, step: FixStep):
    from layerlab.probe.fixes import FixError, _change_input, _pre_hook

    if step.kind not in ("permute-input", "reshape-input", "cast-input"):
        raise FixError(f"a {step.kind} fix of the loss's own module is not applied to your object")
    return module.register_forward_pre_hook(_pre_hook(step.params["arg"], _change_input(step.kind, step.params)),
                                            with_kwargs=True)


# -- the diagnosis ----------------------------------------------------------------------------------------
def explain(failure: Failure, exc: BaseException, module, inputs, kwargs, seed, mode, loss, fix: bool,
            trace, forward_s: float) -> None:
    """Fill in ``failure``: the op of the loss that raised and its line, the module of the loss it ran in,
    where its operands came from, the rules' diagnosis and its verification (see the module doc)."""
    from layerlab.probe.blame import diagnose

    if _on_meta(module, inputs, kwargs):  # shapes only: the loss's own tensors have values, a copy has none
        failure.diagnosis = Diagnosis(
            "a --meta run has shapes only: the loss ran on the model's meta output, and whatever it raised "
            "says nothing about the real run", cause="meta", got="meta tensor",
            hint="inspect without meta (a small configuration of the same model) to check the loss")
        return
    loss_modules: Dict[str, torch.nn.Module] = {}
    if fix:
        ctx, loss_modules = replay(module, inputs, kwargs, seed, mode, loss, exc)
    elif trace is not None and getattr(trace, "failed", None) is not None:  # no copies: the real run's trace
        ctx = LossContext(module=None, path="", args=(), kwargs={}, exc=exc, recorder=trace.recorder, trace=trace)
        ctx.model_inputs = (*inputs, *kwargs.values())
    else:
        ctx = None
    if ctx is None:
        return
    failure.diagnosis = diagnosis = diagnose(ctx)
    if ctx.module is not None:
        failure.path, failure.class_name = ctx.path, type(ctx.module).__name__
    failed = ctx.failed_op
    if failed is not None:
        from layerlab.probe.context import op_tensors

        failure.op = failed.record
        named = [(o.name, t) for o, t in zip(failed.record.inputs, op_tensors(failed))]
    else:
        from layerlab.probe.hooks import forward_arg_names
        from layerlab.probe.ops import tensor_operands

        names = forward_arg_names(type(ctx.module)) if ctx.module is not None else ()
        named = [(names[int(n)] if n.isdigit() and int(n) < len(names) else n, t)  # input, target
                 for n, t in tensor_operands(tuple(ctx.args), dict(ctx.kwargs))]
    failure.origins = [ctx.origin(name, t) for name, t in named[:4]]
    if fix and diagnosis is not None and diagnosis.fix is not None:
        budget = min(max(20.0 * forward_s, 3.0), 60.0)
        diagnosis.verified = verify(module, inputs, kwargs, seed, mode, loss, loss_modules, diagnosis, budget)


def _on_meta(module, inputs, kwargs) -> bool:
    tensors = [t for t in (*inputs, *kwargs.values()) if isinstance(t, torch.Tensor)]
    return any(t.is_meta for t in (*tensors, *module.parameters()))


def replay(module, inputs, kwargs, seed, mode, loss, exc) -> Tuple[Any, Dict[str, torch.nn.Module]]:
    """The loss's failure again on a copy, traced, with its modules hooked — if it fails the same way."""
    from layerlab.probe.verify_fix import copy_model
    from layerlab.target.seeding import seeded

    clone = copy_model(module, mode)
    if clone is None:
        return None, {}
    try:
        with seeded(seed, clone, [*inputs, *kwargs.values()]):
            out = clone(*inputs, **kwargs)
        loss_modules = _module_paths(discover_modules(loss, out, clone))
        del out
    except Exception:  # noqa: BLE001 - the copy does not run as the model did: no replay
        return None, {}
    outcome = traced_run(clone, inputs, kwargs, seed, loss, loss_modules)
    ctx = outcome.ctx
    if outcome.ok or ctx is None or outcome.phase != "loss":
        return None, loss_modules
    if type(ctx.exc) is not type(exc) or str(ctx.exc) != str(exc):
        return None, loss_modules
    return ctx, loss_modules


# -- verification -----------------------------------------------------------------------------------------
def verify(module, inputs, kwargs, seed, mode, loss, loss_modules, first, budget_s: float) -> Optional[Verification]:
    """Apply ``first.fix`` (then the next failures' fixes) to forward + loss on a copy; judge the result."""
    from layerlab.probe.blame import diagnose
    from layerlab.probe.fixes import FixError
    from layerlab.probe.verify_fix import _first_line, location

    deadline = time.perf_counter() + budget_s
    fixed = FixedLoss.build(module, mode, loss, loss_modules)
    if fixed is None:
        return Verification("not-verified", [first.fix], note="the model cannot be copied")
    steps: List[FixStep] = [first.fix]
    then: List[VerifiedStep] = []
    applied = {(first.fix.where, first.fix.code)}
    try:
        fixed.apply(first.fix)
    except FixError as exc:
        return Verification("not-verified", steps, note=f"the fix could not be applied: {exc}")
    for _ in range(MAX_STEPS):
        if time.perf_counter() > deadline:
            return Verification("not-verified", steps, then, note=f"stopped at the time cap of {budget_s:.0f} s")
        outcome = fixed.traced(inputs, kwargs, seed)
        if outcome.ok and any(s.kind == "set-arg" for s in steps):
            return Verification("not-verified", steps, then, outputs=[list(outcome.value.shape)],
                                note="it runs, but it resizes a layer of the model to fit the loss: whether the "
                                     "layer or the loss's target is wrong, a run cannot tell")
        if outcome.ok:
            from layerlab.probe.loss_checks import judge

            return judge(fixed, module, inputs, kwargs, seed, outcome, steps, then)
        ctx = outcome.ctx
        d = diagnose(ctx)
        where = location(ctx)
        message = d.message if d is not None else f"{type(ctx.exc).__name__}: {_first_line(ctx.exc)}"
        if d is None or d.fix is None or (d.fix.where, d.fix.code) in applied:
            then.append(VerifiedStep(where, message, None))
            return Verification("still-fails", steps, then,
                                note=None if d is None or d.fix is None else "the same fix comes back: it did not help")
        then.append(VerifiedStep(where, message, d.fix))
        steps.append(d.fix)
        applied.add((d.fix.where, d.fix.code))
        try:
            fixed.apply(d.fix)
        except FixError as exc:
            return Verification("not-verified", steps, then, note=f"the fix could not be applied: {exc}")
    return Verification("not-verified", steps, then, note=f"more than {MAX_STEPS} fixes in a row")


@dataclass
class FixedLoss:
    """A copy of the model and the user's loss with fixes applied: ``fixed(*inputs)`` is the fixed loss
    (the model's copy runs forward, then the loss, with the fixes' substitutions and hooks active)."""

    model: torch.nn.Module
    loss: Callable[[Any], Any]
    loss_modules: Dict[str, torch.nn.Module]
    substitutions: Dict = field(default_factory=dict)
    module_fixes: List[FixStep] = field(default_factory=list)

    @classmethod
    def build(cls, module, mode, loss, loss_modules) -> Optional["FixedLoss"]:
        from layerlab.probe.verify_fix import copy_model

        clone = copy_model(module, mode)
        return None if clone is None else cls(clone, loss, loss_modules)

    def apply(self, step: FixStep) -> None:
        from layerlab.probe.fixes import FixError, FixedModel, apply_step

        if step.kind != "replace-op" and step.where in self.loss_modules:
            if step.kind not in ("permute-input", "reshape-input", "cast-input"):
                raise FixError(f"a {step.kind} fix of the loss's own module is not applied to your object")
            self.module_fixes.append(step)
            return
        holder = FixedModel(self.model, self.substitutions)
        apply_step(holder, step)

    def traced(self, inputs, kwargs, seed) -> LossOutcome:
        return traced_run(self.model, inputs, kwargs, seed, self.loss, self.loss_modules, self.substitutions,
                          tuple(self.module_fixes))

    def __call__(self, *inputs, **kwargs) -> torch.Tensor:
        """The fixed loss on these inputs (the model's copy, its current weights)."""
        outcome = self.traced(inputs, kwargs, None)
        if not outcome.ok:
            raise outcome.ctx.exc
        return outcome.value


def fixed_loss(module, loss, steps: List[FixStep], inputs: tuple, kwargs: Optional[dict] = None, *,
               mode: Optional[str] = None, seed: Optional[int] = 0) -> FixedLoss:
    """A :class:`FixedLoss`: ``module`` copied (untouched), the modules ``loss`` calls found by one run on
    ``inputs``, and ``steps`` applied to the copy and the loss.

        >>> fixed = fixed_loss(model, loss, report.failure.diagnosis.verified.steps, (x,))
        >>> fixed(x)   # the loss the fixed code computes, on the same weights
    """
    from layerlab.probe.fixes import FixError
    from layerlab.target.seeding import seeded

    kwargs = kwargs or {}
    fixed = FixedLoss.build(module, mode, loss, {})
    if fixed is None:
        raise FixError("the model cannot be copied")
    with seeded(seed, fixed.model, [*inputs, *kwargs.values()]):
        out = fixed.model(*inputs, **kwargs)
    fixed.loss_modules = _module_paths(discover_modules(loss, out, fixed.model))
    for step in steps:
        fixed.apply(step)
    return fixed
