"""``layerlab.mixed``: does this model survive half precision, and if not, where does it break?

    >>> import torch, layerlab
    >>> block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    >>> report = layerlab.precision_check(block, torch.randn(2, 10, 32))
    >>> report.ok, [r.label for r in report.runs]
    (True, ['autocast bfloat16'])

One float32 forward + backward is the reference; each half-precision setting runs the same
forward + backward on its own copy of the model (:mod:`~layerlab.mixed.runs`), and
every module call is compared with float32 (:mod:`~layerlab.mixed.compare`). The first
module that loses precision is named with the op that did it and a fix
(:mod:`~layerlab.mixed.diagnose`, :mod:`~layerlab.mixed.causes`).

Settings: ``autocast`` dtypes (default bf16 on CPU, fp16 and bf16 on CUDA; fp16 autocast on CPU
when asked and torch supports it), ``cast`` dtypes (the whole model ``.to(dtype)``, for
comparison), ``grad_scaler`` (float16 runs scale the loss by 2¹⁶ as GradScaler's first step does).
A setting this machine cannot run (float16 autocast on a CPU build without it) is listed in
``report.skipped`` with torch's reason, never silently dropped.

The model must be float32 (it is the reference); the user's module is never run or changed.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from layerlab.errors import CheckFailed, UsageError
from layerlab.target.entry import entry_point
from layerlab.mixed import compare, diagnose
from layerlab.mixed.capture import MAX_CALLS, MAX_SAMPLES
from layerlab.mixed.dtypes import autocast_supported, default_autocast, half_names, tolerance
from layerlab.mixed.inputs import SavedInputs
from layerlab.mixed.report import Finding, PrecisionReport, PrecisionRun
from layerlab.mixed.runs import FLOAT32, RunResult, Setting, run
from layerlab.mixed.section import parse

__all__ = ["precision_check", "check_target"]

#: GradScaler's default ``init_scale``: the loss scale of its first step
GRAD_SCALE = 2.0 ** 16


@entry_point("precision-check")
def precision_check(module_or_spec: Any, *inputs: Any, autocast: Optional[Sequence[str]] = None,
                    cast: Optional[Sequence[str]] = None, grad_scaler: Optional[bool] = None,
                    tolerance_scale: Optional[float] = None, seed: Optional[int] = None,
                    allow_import: bool = False, target: Optional[str] = None,
                    forward_kwargs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> PrecisionReport:
    """Compare ``module(*inputs, **kwargs)`` forward + backward in half precision with float32.

    Args:
        module_or_spec (nn.Module or str): the model (float32), or a spec file / registry name
            (its inputs come from the spec; its ``precision:`` section gives the defaults below).
        *inputs: positional forward arguments (with a module).
        autocast (list of str, optional): ``torch.autocast`` dtypes, ``"float16"``/``"bfloat16"``;
            ``[]`` for none. Default: bf16 on CPU, fp16 and bf16 on CUDA.
        cast (list of str, optional): also run the whole model cast to these dtypes. Default: none.
        grad_scaler (bool, optional): float16 runs scale the loss by 2¹⁶ and unscale the gradients,
            as ``torch.amp.GradScaler`` does. Default: ``False``.
        tolerance_scale (float, optional): multiplies every error bar. Default: ``1``.
        seed (int, optional): seeds sample positions, dropout and the loss projection. Default: ``0``
            (a spec's ``seed:``).
        allow_import (bool): a spec may import user code (``layer: ./my.py:Layer``).
        target (str, optional): the name reports show. Default: the class name.
        forward_kwargs (dict, optional): keyword forward arguments whose names clash with the above.
        **kwargs: keyword forward arguments.

    Returns:
        PrecisionReport: ``.ok``; ``.runs`` (per setting: ``.first`` finding, ``.rows`` per module
        call, ``.params``); ``.forecast`` (float16 overflow/underflow read from float32 values).
    """
    if isinstance(module_or_spec, str):
        if inputs or kwargs or forward_kwargs:
            raise UsageError("a spec brings its own inputs", where="inputs", got=f"{len(inputs)} input(s)",
                             hint="pass the module itself to give inputs, or put them in the spec")
        from layerlab.spec import Overrides
        from layerlab.target.build import resolve

        t = resolve(module_or_spec, overrides=Overrides(seed=seed) if seed is not None else None,
                    allow_import=allow_import, reference=False)
    else:
        from layerlab.arguments import check_module
        from layerlab.target import from_module

        check_module(module_or_spec, "layerlab.mixed")
        t = from_module(module_or_spec, *inputs, seed=seed or 0, name=target, forward_kwargs=forward_kwargs,
                        **kwargs)
    return check_target(t, autocast=autocast, cast=cast, grad_scaler=grad_scaler, tolerance_scale=tolerance_scale)


def check_target(t: Any, *, autocast: Optional[Sequence[str]] = None, cast: Optional[Sequence[str]] = None,
                 grad_scaler: Optional[bool] = None, tolerance_scale: Optional[float] = None,
                 progress: Optional[Callable[[str, int, int], None]] = None) -> PrecisionReport:
    """:func:`precision_check` on a built :class:`~layerlab.target.Target` (what the CLI calls).

    Arguments given here win over the spec's ``precision:`` section; ``None`` takes the section's."""
    from layerlab.arguments import check_not_meta, check_seed
    from layerlab.target.bind import class_path, describe

    started = time.perf_counter()
    section = parse(t.sections.get("precision") if t.sections else None, t.marks)
    check_seed(t.seed)
    args = list(t.args)
    check_not_meta(t.module, [a.value for a in args])
    _check_float32(t.module, args)
    device = _device(t.module, args)
    autocast = half_names(autocast, "--autocast") if autocast is not None else section.autocast
    cast = half_names(cast, "--cast") if cast is not None else (section.cast or [])
    grad_scaler = grad_scaler if grad_scaler is not None else bool(section.grad_scaler)
    scale = tolerance_scale if tolerance_scale is not None else (section.tolerance_scale or 1.0)
    if autocast is None:
        autocast = default_autocast(device.type)
    settings, skipped = [], []
    for dtype in autocast:
        why = autocast_supported(device.type, dtype)
        if why is None:
            settings.append(Setting("autocast", dtype, GRAD_SCALE if grad_scaler and dtype == "float16" else None))
        else:
            skipped.append(f"autocast {dtype}: {why}")
    settings += [Setting("cast", d, GRAD_SCALE if grad_scaler and d == "float16" else None) for d in cast]
    if not settings:
        raise UsageError("nothing to compare with float32: no half-precision setting can run here",
                         where="--autocast", got="; ".join(skipped) or "none asked",
                         hint="--autocast bfloat16 runs on every CPU; --cast float16 casts the whole model")
    tell = progress or (lambda what, i, n: None)
    tell("float32 forward + backward", 0, len(settings) + 1)
    saved_inputs = SavedInputs(args)
    ref = run(t.module, args, FLOAT32, seed=t.seed)
    saved_inputs.restore()
    if ref.raised is not None:
        raise _raised(ref.raised, "in float32")
    report = PrecisionReport(target=t.name, model=class_path(t.module), device=str(device), mode=t.mode,
                             inputs={a.name: describe(a.value) for a in args}, loss=_loss_text(ref),
                             skipped=skipped, samples=MAX_SAMPLES, float32_seconds=ref.seconds)
    _confirm_noise(t, args, ref)
    for i, setting in enumerate(settings, 1):
        tell(f"{setting.label} forward + backward", i, len(settings) + 1)
        half = run(t.module, args, setting, seed=t.seed, reference=ref)
        saved_inputs.restore()
        report.runs.append(_compare(ref, half, t.seed, device.type, scale))
        _check_kinks(t, args, ref, half, report.runs[-1], saved_inputs)
        report.runs[-1].findings[:0] = _float32_not_finite(ref, setting.label)
    report.forecast = diagnose.forecast(ref, device.type, any(s.dtype == "float16" for s in settings))
    _notes(report, ref)
    if saved_inputs.changed:
        report.notes.append(f"the model writes into its input(s) {', '.join(saved_inputs.changed)} in place: each run "
                            "started from the values given, and they were put back afterwards")
    report.seconds = time.perf_counter() - started
    return report


def _compare(ref: RunResult, half: RunResult, seed: int, device_type: str, scale: float) -> PrecisionRun:
    setting = half.setting
    tol = tolerance(setting.dtype, scale)
    out = PrecisionRun(label=setting.label, kind=setting.kind, dtype=setting.dtype, tolerance=tol,
                       grad_scale=setting.grad_scale, seconds=half.seconds)
    if half.raised is not None:
        from layerlab.deploy.messages import first_line
        from layerlab.mixed.runs import OutputsDiffer

        out.raised = first_line(half.raised)
        if isinstance(half.raised, OutputsDiffer):  # not an exception of the model: nothing to compare
            out.findings.append(Finding(
                severity="warning", kind="precision", where="(root)", run=setting.label,
                message=f"the model's outputs have other shapes in {setting.label} than in float32 "
                        f"({out.raised}): data-dependent shapes (a mask, nonzero) that rounding changed; "
                        "this run was not compared",
                fix="compare the module before the data-dependent step (precision-check on it)"))
            return out
        if unsupported(half.raised):
            out.findings.append(Finding(
                severity="warning", kind="unsupported", where=half.raised_in or type(half.raised).__name__,
                run=setting.label,
                message=f"torch on {device_type} has no {setting.dtype} kernel for an op of this model: {out.raised}",
                cause="a missing kernel on this device, not a loss of precision: this setting was not checked",
                fix="check it on the device you train on (CUDA has float16 kernels for the ops CPUs lack)"))
            return out
        out.findings.append(Finding(
            severity="error", kind="raised", where=half.raised_in or type(half.raised).__name__,
            run=setting.label,
            message=f"the model raised in {setting.label}" + (f", in {half.raised_in}" if half.raised_in else "")
                    + f": {out.raised}",
            fix=_raised_fix(half.raised, setting)))
        return out
    out.params = compare.params(ref, half)
    out.rows = compare.rows(ref, half, out.params)
    diagnose.flag(out.rows, ref, half, tol)
    out.findings = diagnose.findings(out.rows, out.params, ref, half, tol, device_type)
    root = next((r for r in out.rows if r.path == "" and r.call == 1), None)
    out.output_error = root.error if root is not None else None
    errors = [p.error for p in out.params if p.error is not None]
    out.grad_error = max(errors) if errors else None
    if half.found_inf:
        out.findings.append(Finding(severity="info", kind="underflow", where="(gradients)", run=setting.label,
                                    message="scaled by 2¹⁶, a gradient is inf/NaN: GradScaler would skip this "
                                            "step and halve its scale (it settles on a scale that fits)"))
    resized = [k for k, c in half.calls.items() if k in ref.calls
               and [o.numel for o in c.outputs] != [o.numel for o in ref.calls[k].outputs]]
    if resized:
        out.findings.append(Finding(severity="warning", kind="precision", where=resized[0][0] or "(root)",
                                    run=setting.label,
                                    message=f"{len(resized)} module call(s) returned other sizes in {setting.label} "
                                            "than in float32 (data-dependent shapes): their errors are not measured"))
    return out


def _float32_not_finite(ref: RunResult, label: str) -> List[Finding]:
    """A warning when the float32 reference itself is broken: the model's output or a parameter
    gradient holds inf/NaN in float32 (``log(softmax(x))`` of large logits is ``-inf`` there too).
    Errors are then measured only where float32 is finite and a NaN gradient not at all, so an "ok"
    would vouch for a model float32 already breaks. An inner module that returns ``-inf`` on purpose
    (a float attention mask) while the output and gradients stay finite is not this.
    The calls whose float32 output is not finite from finite inputs are listed, not blamed: a mask
    maker and the real culprit look alike there."""
    root = ref.calls.get(("", 1))
    root_bad = root is not None and not all(o.finite for o in root.outputs)
    grads = [n for n, g in ref.grads.items() if g is not None and not bool(torch.isfinite(g).all())]
    if not root_bad and not grads:
        return []
    broken = {k for k, c in ref.calls.items()
              if not all(o.finite for o in c.outputs) and all(i.finite for i in c.inputs)}
    innermost = diagnose.innermost(broken, ref)
    seen = ["the model's output is inf/NaN"] if root_bad else []
    if grads:
        seen.append(("the gradients of " if grads[1:] else "the gradient of ") + ", ".join(grads[:3])
                    + (f" (and {len(grads) - 3} more)" if grads[3:] else "") + (" are" if grads[1:] else " is")
                    + " inf/NaN")
    if innermost:
        seen.append("calls whose output is inf/NaN although their inputs are finite: "
                    + ", ".join(f"{k[0] or '(root)'} ({ref.calls[k].class_name})" for k in innermost[:3]))
    where = (innermost[0][0] or "(root)") if innermost else ("(root)" if root_bad else grads[0])
    return [Finding(severity="warning", kind="float32-non-finite", where=where, run=label,
                    message="float32 itself is not finite: " + "; ".join(seen) + f". {label} was compared "
                            "only where float32 is finite, and a non-finite gradient not at all, so this run's "
                            "verdict cannot vouch for the model",
                    fix="make the float32 model finite first (layerlab inspect shows the values per module)")]


def _check_kinks(t: Any, args: List[Any], ref: RunResult, half: RunResult, out: PrecisionRun,
                 saved_inputs: SavedInputs) -> None:
    """A gradient warning that no forward finding explains: if ReLU inputs that rounding moved across
    0 explain it (:mod:`~layerlab.mixed.kinks`, two more runs of a copy), it becomes an info note.
    Only when there is such a warning; anything else keeps it as it is."""
    warned = [i for i, f in enumerate(out.findings) if f.kind == "gradient" and f.cause == diagnose.IN_THE_BACKWARD]
    if not warned or half.raised is not None:
        return
    from layerlab.mixed.kinks import verify

    names = [p.name for p in diagnose.over_grad_bar(out.params, out.tolerance)]
    try:
        verdict = verify(t.module, args, ref, half, names, t.seed, restore=saved_inputs.restore)
    except Exception:  # a model that will not run under the mode: the warning stands
        saved_inputs.restore()
        return
    if verdict.explains(out.tolerance.grad):
        out.findings[warned[0]] = diagnose.at_a_kink(out.findings[warned[0]], verdict, out.tolerance)


def _confirm_noise(t: Any, args: List[Any], ref: RunResult) -> None:
    """Before the half runs: the gradients small enough to be rounding noise around an exact zero
    (below SUSPECT of the median) are measured in a float64 run of a copy (only they are read), so a
    real tiny gradient — the one float16 flushes to 0 — is not waved through as noise, and noise a
    little above NEGLIGIBLE is not compared as a gradient. Only when there are such gradients: BERT's
    key bias, a bias before a train-mode BatchNorm."""
    from layerlab.mixed.compare import SUSPECT, confirm_noise, tiny_grads
    from layerlab.mixed.runs import float64_grad_rms

    tiny = sorted(tiny_grads(ref, SUSPECT))
    if not tiny or not ref.projections:
        return
    try:
        confirm_noise(ref, float64_grad_rms(t.module, args, t.seed, ref, tiny))
    except Exception:  # a model that will not run in float64 (a float32-only op): they stay noise
        return


def _raised_fix(exc: BaseException, setting: Any) -> Optional[str]:
    """What to change when the half-precision run raised, read from torch's message: only the two
    messages a cast model is known to meet get a fix (a wrong hint is worse than none)."""
    text = str(exc).lower()
    if "without overflow" in text:  # masked_fill(mask, -1e9) / fill_(1e5) on a float16 tensor
        return (f"a constant beyond {setting.dtype}'s range (float16: ±65504) is written into a half tensor "
                "(masked_fill(mask, -1e9), a fill of 1e5): use torch.finfo(x.dtype).min / .max, or float('-inf')")
    if setting.kind == "cast" and ("dtype" in text or "half" in text and "float" in text):
        return ("a tensor made inside forward in float32 meets a half one? create it with dtype=x.dtype "
                "(or x.new_zeros / torch.zeros_like)")
    return None


#: How torch says that a kernel does not exist for a dtype on a device (CPU float16 LSTM: oneDNN
#: "could not create a primitive descriptor"; "addmm_impl_cpu_" not implemented for 'Half').
_UNSUPPORTED = ("not implemented for", "could not create a primitive", "unsupported dtype", "does not support")


def unsupported(exc: BaseException) -> bool:
    """Did torch refuse the dtype (no kernel), rather than the model fail?"""
    text = str(exc).lower()
    return isinstance(exc, NotImplementedError) or any(s in text for s in _UNSUPPORTED)


def _check_float32(module: torch.nn.Module, args: List[Any]) -> None:
    from layerlab.target.bind import input_tensors

    found = {str(p.dtype).replace("torch.", "") for p in module.parameters() if p.is_floating_point()}
    found |= {str(v.dtype).replace("torch.", "") for _, v in input_tensors(args) if v.is_floating_point()}
    other = sorted(found - {"float32"})
    if other:
        raise UsageError(f"precision-check compares half precision with float32, and the model or its inputs are "
                         f"{', '.join(other)}", where="--dtype", expected="float32", got=other,
                         hint="build it in float32 (drop --dtype / the spec's dtype:); --cast float16 runs the "
                              "cast model next to it")


def _device(module: torch.nn.Module, args: List[Any]) -> torch.device:
    from layerlab.mixed.runs import _device as device_of

    return device_of(module, args)


def _raised(exc: BaseException, when: str) -> CheckFailed:
    from layerlab.deploy.messages import first_line

    return CheckFailed(f"the model raised {when}: {first_line(exc)}", where=type(exc).__name__,
                       hint="layerlab inspect shows where and why")


def _loss_text(ref: RunResult) -> str:
    from layerlab.probe.backward import RANDOM_PROJECTION

    return RANDOM_PROJECTION if ref.projections else "none: no output requires grad (forward only)"


def _notes(report: PrecisionReport, ref: RunResult) -> None:
    report.notes.append(f"errors are ‖half − float32‖ / ‖float32‖ per tensor, on at most {MAX_SAMPLES} seeded "
                        "positions of each (the same in every run); bars are multiples of the dtype's eps")
    if ref.dropped_calls:
        report.notes.append(f"{ref.dropped_calls} module call(s) past the first {MAX_CALLS} were run but not kept")
    if ref.dropped_ops:
        report.notes.append(f"the op trace kept its first ops; {ref.dropped_ops} more were not recorded")
    if any(r.kind == "autocast" for r in report.runs) and report.device.startswith("cpu"):
        report.notes.append("CPU autocast runs matmul/conv/linear in the half dtype and, unlike CUDA's, keeps "
                            "softmax, layer_norm and reductions in whatever dtype their input has")
