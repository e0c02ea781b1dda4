"""``layerlab.inspect``: run a module forward and backward once, with probes, and report every step.

(This module is ``layerlab.probe.run`` rather than ``layerlab.inspect`` so that the submodule never
shadows the function on the package.)

    >>> import torch, layerlab
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    >>> report = layerlab.inspect(model, torch.randn(2, 3, 16, 16))
    >>> report.ok, report.call("0").outputs[0].shape, report.checks[0].steps[0]
    (True, [2, 8, 14, 14], 'H: (16 + 2·0 − 3) // 1 + 1 = 14')

The report keeps shapes, dtypes, devices, ``grad_fn`` and small statistics of every module
call's inputs and outputs, gradient norms after a backward pass, formula checks for conv/pool-type
layers and, when the forward or backward raises, the failing call with an explanation. It never
keeps the activations. Hooks are removed, every submodule's train/eval flag restored and every
buffer (BatchNorm's running statistics) put back on the way out, also when the model raises
(before the diagnosis, which re-runs copies of the model: :mod:`layerlab.probe.verify_fix`, never
the model itself); the entry point's snapshot then puts back everything else a run may touch —
tensor hooks, ``.grad``, inputs written in place, RNGs, global flags (:mod:`layerlab.target.no_trace`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, Optional, Sequence

from layerlab.errors import UsageError
from layerlab.target.entry import entry_point

__all__ = ["inspect"]


@entry_point("inspect")
def inspect(
    module: Any,
    *inputs: Any,
    backward: bool = True,
    loss: Optional[Callable[[Any], Any]] = None,
    seed: int = 0,
    mode: Optional[str] = None,
    stats: bool = True,
    vanish: float = 1e-6,
    explode: float = 1e4,
    forward_kwargs: Optional[Dict[str, Any]] = None,
    ops: bool = False,
    fix: bool = True,
    meta: bool = False,
    probes: Optional[Sequence[Any]] = None,
    silent: bool = True,
    **kwargs: Any,
):
    """Run ``module(*inputs, **kwargs)`` (and a backward pass) with probes; return the report.

    Args:
        module (nn.Module): the layer or model.
        *inputs: positional forward arguments.
        backward (bool, optional): also run backward. Default: ``True``.
        loss (callable, optional): ``loss(output) -> scalar tensor``. Default: a seeded random
            projection of every differentiable output, scaled so the output gradient has norm 1
            (see :mod:`layerlab.probe.backward`). A loss that raises is a failure of phase ``"loss"``,
            diagnosed and fixed like a forward failure (see :mod:`layerlab.probe.loss_failure`).
        seed (int, optional): seed of that projection and of the global RNG during the run (so
            dropout masks are reproducible); the global RNG state is restored afterwards.
            ``None`` leaves the RNG alone (and draws the projection from seed 0). Default: ``0``.
        mode (str, optional): ``"train"`` or ``"eval"`` for the run; ``None`` keeps the module's
            own flags. Restored afterwards either way. Default: ``None``.
        stats (bool, optional): compute value statistics. Default: ``True``.
        vanish, explode (float, optional): a gradient norm below ``vanish`` or above ``explode``
            times the gradient norm at the output is flagged. Default: ``1e-6``, ``1e4``.
        forward_kwargs (dict, optional): keyword arguments for forward whose names clash with the
            ones above.
        ops (bool, optional): also record every torch function and tensor method the model's own
            code calls (``report.ops``; see :mod:`layerlab.probe.ops`). Default: ``False``.
        fix (bool, optional): when the forward (or the loss) raises, re-run it on a copy of the model to find
            where the offending input came from, and apply the suggested fix to another copy to
            check that the model then runs (``failure.diagnosis.verified``). Default: ``True``.
        meta (bool, optional): a shape-only dry run on meta twins of the model and inputs (the
            model is not moved; see :mod:`layerlab.probe.meta`): shapes, dtypes, parameter counts
            and ``report.memory``, an estimate of activation and gradient bytes per call; no
            statistics or gradient norms. Default: ``False``.
        probes (list, optional): probes to run beside the recording (``"attention"``,
            ``"sparsity"``, ``"dead"``, ``"rank"``, ``"init"``, ``"steps"``, ``"histogram"``, a
            :class:`~layerlab.probe.probes.base.Probe`, or a callable ``(module, inputs, output) ->
            dict`` run on every module call); results in ``report.probes`` (see
            :mod:`layerlab.probe.probes`). Default: none (no cost).
        silent (bool, optional): look for silent bugs (a view that interleaves axes, a softmax
            over the batch, ...) from the axis provenance of the forward; warnings with a
            ``silent/…`` code (see :mod:`layerlab.engine.silent`). Default: ``True``.
        **kwargs: keyword arguments for forward (``attn_mask=…``).

    Returns:
        :class:`~layerlab.probe.report.InspectReport`. A layer that raises does not raise here:
        ``report.failure`` says where and why, and ``report.ok`` is false.
    """
    import torch

    from layerlab.target.buffers import SavedBuffers
    from layerlab.probe.hooks import ProbeBug, Recorder
    from layerlab import faults
    from layerlab.target.seeding import seeded

    from layerlab.arguments import check_module, check_not_meta, check_seed

    check_module(module, "layerlab.inspect")
    check_seed(seed, optional=True)
    if mode not in (None, "train", "eval"):
        raise UsageError("mode must be 'train' or 'eval'", where="mode", expected="train | eval", got=mode)
    fwd_kwargs = {**(forward_kwargs or {}), **kwargs}
    if meta:  # shapes only: meta twins of the model and inputs (see probe.meta)
        from layerlab.probe.meta import meta_module, meta_value

        module, inputs, fwd_kwargs, stats = meta_module(module), meta_value(inputs), meta_value(fwd_kwargs), False
    else:
        check_not_meta(module, [*inputs, *fwd_kwargs.values()])  # the report's statistics need values
    named_modules = list(module.named_modules())
    flags = [(m, m.training) for _, m in named_modules]
    # a train-mode forward updates BatchNorm's running statistics: put back on the way out
    buffers = SavedBuffers(m for _, m in named_modules)
    recorder = Recorder(module, stats=stats, grads=backward)
    probe_list, probe_run = _probes(probes, meta, module, named_modules, inputs, fwd_kwargs, backward, seed)
    trace = None
    if ops:
        from layerlab.probe.ops import OpTrace

        trace = recorder.trace = OpTrace(recorder)
    watcher = provenance = None
    if silent and not meta:  # axis provenance of the real forward (layerlab.engine.silent_check)
        from layerlab.engine.silent_check import watch

        watcher = watch(module, inputs, fwd_kwargs)
        if watcher is not None and trace is None:
            recorder.trace = watcher  # the recorder pauses it while its hooks compute statistics
    failure = None
    raised = None
    timing: Dict[str, float] = {}
    back = None
    try:
        if mode is not None:
            module.train(mode == "train")  # a module's own train() may keep a child in eval
            used_mode = _mode_name(m.training for m in module.modules())
        else:
            used_mode = _mode_name(flag for _, flag in flags)
        recorder.install(named_modules)
        for probe in probe_list:
            probe.attach(probe_run)
        with seeded(seed, module, [*inputs, *fwd_kwargs.values()]):
            faults.step("forward")
            start = time.perf_counter()
            try:
                # on meta, tensors the forward makes without device= are made on meta too, as they
                # would be on the model's device in a real run
                with trace if trace is not None else contextlib.nullcontext(), \
                        torch.device("meta") if meta else contextlib.nullcontext(), \
                        probe_run.around_forward() if probe_run is not None else contextlib.nullcontext(), \
                        watcher if watcher is not None else contextlib.nullcontext():
                    output = module(*inputs, **fwd_kwargs)
            except ProbeBug as bug:
                raise bug.original from None
            except Exception as exc:  # the model raised: that is a finding, not an error of ours
                failure = _forward_failure(recorder, exc)
                # its live arguments, kept before the hooks are removed (a message that cannot be
                # printed leaves the diagnosis nothing to read: the failure is reported without one)
                if failure.call is not None and _printable(exc):
                    raised = exc, failure.call, recorder.live.get(failure.call, ((), {}))
                output = None
            timing["forward_s"] = time.perf_counter() - start
            if failure is None and watcher is not None:
                from layerlab.engine.silent_check import seen

                provenance = seen(watcher, output)
            if failure is None:
                for probe in probe_list:
                    probe.after_forward(probe_run, output)
            if backward and failure is None:
                faults.step("backward")
                start = time.perf_counter()
                back, failure = _backward(module, output, [*inputs, *fwd_kwargs.values()], recorder, loss, seed or 0,
                                          trace)
                timing["backward_s"] = time.perf_counter() - start
                if failure is None and back["info"].ran:
                    for probe in probe_list:
                        probe.after_backward(probe_run)
            del output
    finally:
        recorder.remove()
        if probe_run is not None:
            probe_run.remove()
        for m, flag in flags:
            if m.training is not flag:  # nn.Module.__setattr__ is slow: only where it changed
                m.training = flag
        buffers.restore()
    if raised is not None:
        faults.step("while diagnosing the failure (re-running copies of the model)")
        start = time.perf_counter()
        _explain(failure, raised, recorder, trace, module, inputs, fwd_kwargs, seed, mode, fix,
                 timing["forward_s"])
        timing["diagnosis_s"] = time.perf_counter() - start
    elif back is not None and back.get("loss_exc") is not None:  # the loss raised: the forward's machinery
        from layerlab.probe.loss_failure import explain as explain_loss

        faults.step("while diagnosing the loss's failure (re-running copies of the model)")
        start = time.perf_counter()
        explain_loss(failure, back.pop("loss_exc"), module, inputs, fwd_kwargs, seed, mode, loss, fix, trace,
                     timing["forward_s"])
        timing["diagnosis_s"] = time.perf_counter() - start
    start = time.perf_counter()
    report = _assemble(module, recorder, used_mode, failure, back, backward, vanish, explode, meta)
    if meta:
        from layerlab.probe.meta import estimate, explain_meta_failure

        report.memory = estimate(recorder, module)
        if failure is not None and failure.phase != "loss":  # a loss's failure on meta: see loss_failure
            explain_meta_failure(failure)
    report.ops = trace.records if trace is not None else None
    if not meta and failure is None and not any(getattr(p, "name", "") == "init" for p in probe_list):
        from layerlab.probe.probes.init_findings import add_init_findings  # weights + stats: no hooks

        add_init_findings(report, module)  # the short form of --probe init
    if provenance is not None:
        from layerlab.engine.silent_check import findings

        silent_start = time.perf_counter()
        report.problems += findings(provenance, module, inputs, fwd_kwargs)
        timing["silent_s"] = time.perf_counter() - silent_start
    if probe_list:
        _probe_results(report, probe_list, timing)
    timing["report_s"] = time.perf_counter() - start
    report.timing = timing
    return report


def _probes(probes, meta, module, named_modules, inputs, kwargs, backward, seed):
    """The probe instances asked for and the run they share (none: no cost at all)."""
    if not probes:
        return [], None
    from layerlab.probe.probes import make_probes
    from layerlab.probe.probes.base import ProbeRun

    if isinstance(probes, str):
        probes = [p for p in probes.split(",") if p.strip()]
    made = make_probes(probes)
    if meta and made:
        raise UsageError("probes need values, and a --meta run has none", where="probes",
                         expected="probes without meta, or meta without probes", got=[p.name for p in made])
    return made, ProbeRun(module, named_modules, inputs, kwargs, backward, seed)


def _probe_results(report, probe_list, timing) -> None:
    """Each probe's result into ``report.probes``; its findings into problems (warnings) or notes."""
    start = time.perf_counter()
    results = []
    for probe in probe_list:
        result = probe.result(report)
        results.append(result)
        for finding in result.findings:
            (report.notes if finding.severity == "info" else report.problems).append(finding)
    report.probes = results
    timing["probes_s"] = time.perf_counter() - start


def _mode_name(training_flags) -> str:
    flags = set(training_flags)
    return "train" if flags == {True} else "eval" if flags == {False} else "mixed"


def _printable(exc: BaseException) -> bool:
    try:
        str(exc)
    except Exception:
        return False
    return True


def _message(exc: BaseException) -> str:
    try:
        text = str(exc).strip() or type(exc).__name__
    except Exception:  # the model's own exception class may fail to print: its name still says something
        text = f"{type(exc).__name__} (its message could not be shown: str() raised)"
    return text if len(text) <= 2000 else text[:2000] + " …"


def _forward_failure(recorder, exc: BaseException):
    from layerlab.probe.report import Failure

    open_calls = recorder.open_calls()
    failure = Failure(phase="forward", exception=type(exc).__name__, message=_message(exc))
    if not open_calls:
        return failure
    for index in open_calls:
        recorder.calls[index].status = "unfinished"
    index = open_calls[-1]
    call = recorder.calls[index]
    call.status = "raised"
    failure.call, failure.path, failure.class_name = index, call.path, call.class_name
    failure.inputs = call.inputs
    failure.chain = [recorder.calls[i].label for i in open_calls]
    return failure


#: The time a diagnosis may take for its replay and its fix's verification, as a multiple of the
#: forward that failed (and at least / at most these many seconds).
_VERIFY_FACTOR, _VERIFY_MIN_S, _VERIFY_MAX_S = 20.0, 3.0, 60.0


def _explain(failure, raised, recorder, trace, module, inputs, kwargs, seed, mode, fix, forward_s) -> None:
    """Fill in the failure's diagnosis, the op that raised, where its inputs came from, and the
    verified fix (after the hooks are gone: the copies must not carry them)."""
    from layerlab.probe.blame import diagnose
    from layerlab.probe.context import op_tensors
    from layerlab.probe.verify_fix import context_of, replay, verify

    exc, index, live = raised
    ctx = context_of(recorder, trace, exc, index, live)
    if not ctx.outer:  # the open calls' arguments are gone with the hooks: the model's own are here
        ctx.outer = [("", tuple(inputs), dict(kwargs))]
    if trace is None and fix:  # the op trace was off: replay the failure on a copy with it on
        ctx = replay(module, inputs, kwargs, seed, mode, failure.path, exc) or ctx
    failure.diagnosis = diagnosis = diagnose(ctx)
    failed = ctx.failed_op
    if failed is not None:
        failure.op = failed.record
        named = [(o.name, t) for o, t in zip(failed.record.inputs, op_tensors(failed))]
    else:
        names = [i.name for i in failure.inputs if i.is_tensor]
        named = list(zip(names, ctx.tensors()))
    failure.origins = [ctx.origin(name, t) for name, t in named[:4]]
    if fix and diagnosis is not None and diagnosis.fix is not None:
        budget = min(max(_VERIFY_FACTOR * forward_s, _VERIFY_MIN_S), _VERIFY_MAX_S)
        diagnosis.verified = verify(module, inputs, kwargs, seed, mode, diagnosis, budget, ctx=ctx)
    elif fix and diagnosis is None:  # no rule recognises it: the fix search, judged by the oracles
        from layerlab.probe.fix_judging import search_diagnosis

        failure.diagnosis = search_diagnosis(module, inputs, kwargs, seed, mode, ctx)


def _backward(module, output, inputs, recorder, loss, seed, trace=None):
    """Run backward; return ``(state, failure)`` where state holds what the report needs (and, when the
    user's loss raised, its exception as ``loss_exc``, for :mod:`layerlab.probe.loss_failure`)."""
    from layerlab.probe.backward import differentiable_outputs, grad_targets, run_backward
    from layerlab.probe.hooks import ProbeBug
    from layerlab.probe.loss_failure import LossRaised, loss_failure
    from layerlab.probe.report import BackwardInfo

    named = list(module.named_parameters())
    params, leaves = grad_targets(module, inputs, named)
    targets = [p for _, p in params] + leaves
    state = {"info": BackwardInfo(ran=False, loss="none"), "grads": None, "named": named}
    outs = differentiable_outputs(output) if loss is None else None
    if loss is None and not outs:
        state["info"].skipped = (
            "no floating output requires grad (no trainable parameter or grad-requiring input "
            "reaches it, or the forward ran under torch.no_grad)"
        )
        return state, None
    if not targets:
        state["info"].skipped = "nothing to differentiate: no trainable parameter and no input with requires_grad"
        return state, None
    try:
        value, grads, description = run_backward(output, targets, loss=loss, seed=seed, outs=outs, trace=trace)
    except ProbeBug as bug:
        raise bug.original from None
    except LossRaised as raised:  # the user's loss raised: diagnosed after the hooks are gone
        state["loss_exc"] = raised.original
        state["info"].skipped = "the loss raised"
        return state, loss_failure(raised.original, _message(raised.original))
    except Exception as exc:  # autograd's backward raised
        return state, _backward_failure(recorder, exc, loss)
    state["info"] = BackwardInfo(ran=True, loss=description, loss_value=value)
    state["grads"] = {name: g for (name, _), g in zip(params, grads)}
    return state, None


def _backward_failure(recorder, exc: BaseException, loss):
    """Blame the innermost call whose output got its gradient but whose inputs did not."""
    from layerlab.probe.report import Failure

    failure = Failure(phase="backward",
                      exception=type(exc).__name__, message=_message(exc))
    arrived = set(recorder.grad_order)
    candidates = []
    for call in recorder.calls:
        outs = [o.slot for o in call.outputs if o.requires_grad]
        ins = [i.slot for i in call.inputs if i.requires_grad]
        if outs and ins and any(s in arrived for s in outs) and not all(s in arrived for s in ins):
            candidates.append(call)
    if candidates:
        call = min(candidates, key=lambda c: c.end if c.end is not None else -1)
        failure.call, failure.path, failure.class_name = call.index, call.path, call.class_name
        failure.inputs = call.inputs
        failure.chain = [call.label]
    return failure


def _assemble(module, recorder, mode, failure, back, backward, vanish, explode, meta=False):
    from layerlab.probe import assemble as A
    from layerlab.probe.report import BackwardInfo, InspectReport

    infos = [info for call in recorder.calls for info in (*call.inputs, *call.outputs)]
    A.fill_tensor_stats(recorder, infos)
    root = recorder.calls[0] if recorder.calls and recorder.calls[0].path == "" else None
    outputs = root.outputs if root is not None else []
    info = back["info"] if back else BackwardInfo(
        ran=False, loss="none", skipped="--no-backward" if not backward else "the forward raised"
    )
    scale = A.output_grad_scale(outputs) if info.ran else None
    info.output_grad_norm = scale
    scale = scale or 1.0
    named = back["named"] if back else list(module.named_parameters())
    params = A.param_records(  # on meta, gradients have shapes but no norms to judge
        module, back["grads"] if back and not meta else None, scale=scale, vanish=vanish, explode=explode,
        named=named,
    )
    problems, notes = [], []
    first_nan = A.first_nonfinite_forward(recorder.calls)
    if first_nan is not None:
        problems.append(first_nan)
    if info.ran and not meta:
        bad_grad = A.first_nonfinite_backward(recorder.calls)
        if bad_grad is not None:
            problems.append(bad_grad)
        problems += A.activation_grad_problems(recorder.calls, scale, vanish, explode)
        problems += A.param_problems(params, recorder.calls, vanish, explode)
        problems, notes = A.explain_gradients(problems, params, recorder, module, scale, vanish, explode)
    total, trainable = A.totals(module, named)
    return InspectReport(
        model=type(module).__name__,
        mode=mode,
        inputs=root.inputs if root is not None else [],
        outputs=outputs,
        calls=recorder.calls,
        params=params,
        checks=A.formula_checks(recorder),
        problems=problems,
        notes=notes,
        backward=info,
        failure=failure,
        total_params=total,
        trainable_params=trainable,
    )
