"""``layerlab.profile``: where a forward + backward step spends its time, memory and FLOPs, per module call.

    >>> import torch, layerlab
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
    ...                             torch.nn.Linear(8 * 14 * 14, 10))
    >>> report = layerlab.profile(model, torch.randn(4, 3, 16, 16), repeats=5)
    >>> report.row("0").flops_forward == 2 * 4 * 8 * 14 * 14 * 3 * 3 * 3
    True

How it measures (see :mod:`layerlab.profiling.hooks` for the hooks):

1. ``warmup`` untimed steps (allocator, oneDNN primitives, autograd threads), plain and profiled.
2. ``repeats`` timed rounds, each one plain step (no hooks: the real cost) and one profiled step
   (hooks), alternating which goes first. Every reported time is a median over the rounds.
3. One measure step under ``FlopCounterMode`` (plus the attention formulas it lacks, see
   :mod:`layerlab.profiling.flops`) and a saved-tensors hook: FLOPs and activation bytes; compute
   ops that ran without a formula are listed (``flops_not_counted``) and noted.

A step is ``out = model(*inputs)`` then ``torch.autograd.backward(outs, grads)`` with fixed, seeded
output gradients; ``.grad`` of every parameter and input is reset to ``None`` between steps, outside
what is timed (and a forward that writes into its input gets the values passed again:
:mod:`layerlab.target.fresh_inputs`). The user's ``.grad`` tensors, BatchNorm statistics, RNG and
everything else come back afterwards (:mod:`layerlab.target.no_trace`). On CUDA every timed region is bracketed by CUDA events and synchronised; on CPU it
is wall time (``time.perf_counter``). The profiler's overhead is the profiled step over the plain
one. The module's train/eval flags are left as they are (the spec's ``mode:``), and hooks are
removed in ``finally``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.errors import CheckFailed
from layerlab.target.entry import entry_point
from layerlab.profiling.hooks import CudaClock, StepProbe, WallClock
from layerlab.profiling.report import ProfileReport, ProfileRow, StepTiming
from layerlab.profiling.steadiness import check_steps, unsteady_note
from layerlab import faults
from layerlab.target.fresh_inputs import FreshInputs

__all__ = ["profile", "profile_args", "Stepper"]


@entry_point("profile")
def profile(module: Any, *inputs: Any, repeats: int = 10, warmup: int = 3, compile: bool = False,
            compile_backend: str = DEFAULT_COMPILE_BACKEND, reference: Any = None, threads: Optional[int] = None,
            seed: int = 0, target: Optional[str] = None, forward_kwargs: Optional[Dict[str, Any]] = None,
            **kwargs: Any) -> ProfileReport:
    """Profile ``module(*inputs, **kwargs)`` forward + backward; return a :class:`ProfileReport`.

    Args:
        module (nn.Module): the model (its weights and mode are left as they are).
        *inputs: positional forward arguments.
        repeats (int, optional): timed rounds; medians are reported. Default: ``10``.
        warmup (int, optional): untimed steps first. Default: ``3``.
        compile (bool, optional): also time ``torch.compile(module, backend=compile_backend)``
            against eager. Default: ``False``.
        compile_backend (str, optional): Default: ``"aot_eager"``, which times graph capture, not
            inductor's code: pass ``"inductor"`` to measure its speed-up (:mod:`layerlab.backends`).
        reference (nn.Module, optional): a counterpart (``torch.nn.TransformerEncoderLayer``) to time
            side by side: throughput and memory with the ratio. Default: ``None``.
        threads (int, optional): torch intra-op threads while measuring (restored after).
            Default: torch's setting.
        seed (int, optional): seed of the output gradients. Default: ``0``.
        target (str, optional): the name shown. Default: the class name.
        forward_kwargs (dict, optional): keyword forward arguments whose names clash with the above.
        **kwargs: keyword forward arguments.
    """
    from layerlab.arguments import check_module
    from layerlab.target import from_module

    check_module(module, "layerlab.profile")
    t = from_module(module, *inputs, seed=seed, name=target, forward_kwargs=forward_kwargs, **kwargs)
    return profile_args(t.module, t.args, repeats=repeats, warmup=warmup, compile=compile,
                        compile_backend=compile_backend, reference=reference, threads=threads, seed=seed,
                        target=t.name)


def profile_args(module: Any, args: Sequence[Any], *, repeats: int = 10, warmup: int = 3, compile: bool = False,
                 compile_backend: str = DEFAULT_COMPILE_BACKEND, reference: Any = None,
                 threads: Optional[int] = None, seed: int = 0, target: str = "",
                 progress: Optional[Callable[[str, int, int], None]] = None) -> ProfileReport:
    """:func:`profile` on ready-made :class:`~layerlab.target.bind.Arg` inputs.

    ``progress(what, i, n)`` is called before each phase (timed steps, torch.compile, the
    reference): ``--vs-reference`` on a big layer runs for minutes. The user's RNG state is left as it was."""
    from layerlab.target.seeding import rng_untouched

    with rng_untouched(module if isinstance(module, torch.nn.Module) else None, [a.value for a in args]):
        return _profile_args(module, args, repeats=repeats, warmup=warmup, compile=compile,
                             compile_backend=compile_backend, reference=reference, threads=threads, seed=seed,
                             target=target, progress=progress)


def _profile_args(module: Any, args: Sequence[Any], *, repeats: int, warmup: int, compile: bool,
                  compile_backend: str, reference: Any, threads: Optional[int], seed: int, target: str,
                  progress: Optional[Callable[[str, int, int], None]]) -> ProfileReport:
    from layerlab.target.bind import class_path, describe as _describe

    from layerlab.arguments import check_module, check_not_meta, check_seed, check_threads

    check_module(module, "layerlab.profile")
    check_seed(seed)
    check_threads(threads)
    check_steps(repeats, "repeats", 1)
    check_steps(warmup, "warmup", 0)
    check_not_meta(module, [a.value for a in args])  # meta kernels take no time and move no bytes
    args, detached = _leaf_inputs(args)
    t_start = time.perf_counter()
    phases = 1 + bool(compile) + (reference is not None)
    tell = progress or (lambda what, i, n: None)
    with _threads(threads):
        tell(f"{warmup} warm-up + {repeats} timed steps", 0, phases)
        stepper = Stepper(module, args, seed=seed)
        try:
            rows, step, backward, not_counted, replayed = _measure(stepper, repeats, warmup)
        except Exception as exc:
            raise _model_raised(exc, module, "during the timed steps") or exc
        report = ProfileReport(
            target=target, model=class_path(module), device=str(stepper.device), timer=stepper.clock.name,
            threads=torch.get_num_threads(), mode=_mode(module), warmup=warmup, repeats=repeats,
            inputs={a.name: _describe(a.value) for a in args}, backward=backward, rows=rows, step=step,
            flops_not_counted=not_counted,
        )
        if not_counted:
            ops = ", ".join(f"{op} ×{n}" for op, n in sorted(not_counted.items()))
            report.notes.append(f"FLOPs not counted: {ops} (compute ops without a FLOP formula in "
                                "torch.utils.flop_counter; the FLOPs of rows marked + are lower bounds)")
        if detached:
            report.notes.append(f"input(s) {', '.join(detached)} came out of another computation (not leaves): "
                                "profiled as leaves that require grad, so each step's backward stops at them")
        if replayed:
            report.notes.append(f"{replayed} module call(s) ran again inside backward (activation checkpointing "
                                "recomputes them): they have no rows; their time and FLOPs are in the backward "
                                "of the rows whose autograd nodes asked for them")
        report.notes.extend(stepper.fresh.note())
        if not backward:
            report.notes.append("forward only: no output requires grad (no trainable parameter or input reaches it)")
        unsteady = unsteady_note(step)  # last: the other notes hold whatever the timings
        if unsteady:
            report.notes.append(unsteady)
        if compile:
            from layerlab.profiling.compare import compare_compiled

            tell(f"torch.compile (backend {compile_backend}) and its timed steps", 1, phases)
            report.compile = compare_compiled(stepper, repeats=repeats, warmup=warmup, backend=compile_backend)
        if reference is not None:
            from layerlab.profiling.compare import compare_reference

            tell("the reference's timed steps", phases - 1, phases)
            report.reference = compare_reference(stepper, reference, repeats=repeats, warmup=warmup)
    report.seconds = time.perf_counter() - t_start
    return report


def _leaf_inputs(args: Sequence[Any]):
    """``(args, names)``: inputs that are the output of another computation (``x * 2`` of a leaf that
    requires grad) replaced by detached leaves that require grad, and their names. Every step runs
    backward, and the graph behind such an input is freed by the first one ("backward through the
    graph a second time"); it is not part of the model's step anyway."""
    from layerlab.target.bind import Arg, flatten, map_tensors

    names = [a.name for a in args if any(t.requires_grad and not t.is_leaf for _, t in flatten(a.value))]
    if not names:
        return list(args), names

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_() if t.requires_grad and not t.is_leaf else t

    memo: dict = {}
    return [Arg(a.name, map_tensors(a.value, leaf, memo), a.keyword, a.no_grad) for a in args], names


def _model_raised(exc: BaseException, module: torch.nn.Module, when: str) -> Optional[CheckFailed]:
    """The error for an exception the model (or torch under it) raised while being profiled, the same
    kind as a failing forward; ``None`` when layerlab's own code raised it (a bug: keep the traceback)."""
    import traceback

    from layerlab.checks.run import _frame_owner
    from layerlab.deploy.messages import first_line

    if isinstance(exc, CheckFailed) or not isinstance(exc, Exception):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and _frame_owner(frames[-1].filename) == "harness":
        return None
    return CheckFailed(f"the model raised {when}: {first_line(exc)}", where=type(module).__name__,
                       hint="layerlab inspect shows where and why")


@contextlib.contextmanager
def _threads(n: Optional[int]):
    previous = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _mode(module: torch.nn.Module) -> str:
    flags = {m.training for m in module.modules()}
    return "train" if flags == {True} else "eval" if flags == {False} else "mixed"


def _device(module: torch.nn.Module, args: Sequence[Any]) -> torch.device:
    from layerlab.target.bind import flatten

    for p in module.parameters():
        return p.device
    for a in args:
        for _, t in flatten(a.value):
            return t.device
    return torch.device("cpu")


class Stepper:
    """One model's step, runnable plain or with a probe, timed on the right clock."""

    def __init__(self, module: torch.nn.Module, args: Sequence[Any], *, seed: int = 0) -> None:
        from layerlab.target.bind import flatten

        self.module = module
        self.args = list(args)
        self.device = _device(module, args)
        self.clock = CudaClock(self.device) if self.device.type == "cuda" else WallClock()
        self.pos = [a.value for a in args if not a.keyword]
        self.kw = {a.name: a.value for a in args if a.keyword}
        self.leaves = [t for a in args for _, t in flatten(a.value) if t.requires_grad and t.is_leaf]
        self.fresh = FreshInputs((a.name, a.value) for a in args)  # a forward that writes into its input
        faults.step("first step")
        try:
            with torch.random.fork_rng(devices=[]):
                out = module(*self.pos, **self.kw)
        except Exception as exc:
            from layerlab.deploy.messages import first_line

            raise CheckFailed(f"the model raised on its inputs: {first_line(exc)}", where=type(module).__name__,
                              hint="layerlab inspect shows where and why") from None
        outs = _grad_outputs(out)
        gen = torch.Generator().manual_seed(seed)
        self.grads = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
        self.backward = bool(outs)
        if self.backward:  # a backward that raises is the model's failure too, reported the same way
            try:
                torch.autograd.backward(outs, self.grads)
            except Exception as exc:
                raise _model_raised(exc, module, "in the backward") or exc from None
            finally:
                self.reset()
        else:
            self.fresh.refresh()

    def reset(self) -> None:
        """Before a step: no gradients, and the inputs' own values (see FreshInputs)."""
        for p in self.module.parameters():
            p.grad = None
        for t in self.leaves:
            t.grad = None
        self.fresh.refresh()

    def run(self, fn: Optional[Callable] = None, probe: Optional[StepProbe] = None) -> tuple:
        """One step; return clock readings ``(start, after forward, after backward)``."""
        clock = self.clock
        model = self.module if fn is None else fn
        t0 = clock.now()
        out = model(*self.pos, **self.kw)
        outs = _grad_outputs(out)
        if probe is not None:
            probe.attach_backward(outs)
        t1 = clock.now()
        if self.backward:
            torch.autograd.backward(outs, self.grads)
        t2 = clock.now()
        return t0, t1, t2

    def timed(self, fn: Optional[Callable] = None, probe: Optional[StepProbe] = None) -> tuple:
        """``(forward_s, backward_s)`` of one step, grads reset first (not timed)."""
        self.reset()
        t0, t1, t2 = self.run(fn, probe)
        self.clock.sync()
        sec = self.clock.seconds
        return sec(t0, t1), sec(t1, t2)


def _grad_outputs(out: Any) -> List[torch.Tensor]:
    from layerlab.target.bind import flatten

    return [t for _, t in flatten(out) if t.requires_grad and t.is_floating_point()]


def _measure(stepper: Stepper, repeats: int, warmup: int):
    module = stepper.module
    probe = StepProbe(module, stepper.clock)
    plain: List[tuple] = []
    probed: List[tuple] = []
    per_row: Dict[tuple, List[tuple]] = {}
    unattributed: List[float] = []
    try:
        for i in range(warmup):
            faults.step(f"warm-up step {i}")
            stepper.timed()
        for r in range(repeats + (1 if warmup else 0)):
            faults.step(f"timed round {r}")
            for variant in (("plain", "probed") if r % 2 == 0 else ("probed", "plain")):
                if variant == "plain":
                    result = stepper.timed()
                    if r or not warmup:
                        plain.append(result)
                    continue
                probe.begin()
                probe.install()
                try:
                    result = stepper.timed(probe=probe)
                finally:
                    probe.remove()
                if r or not warmup:  # round 0 warms the hooks up
                    probed.append(result)
                    times = probe.times()
                    for key, value in times.items():
                        per_row.setdefault(key, []).append(value)
                    unattributed.append(result[1] - sum(v[1] for v in times.values()))
        counts, structure, uncounted, params, replayed = _count(stepper)
    finally:
        probe.remove()
    rows = _rows(module, structure, per_row, counts, uncounted.by_owner, params)
    med = statistics.median
    step_s = med([f + b for f, b in plain])
    profiled_s = med([f + b for f, b in probed])
    rows_sum = sum(r.forward_s + r.backward_s for r in rows)
    for r in rows:
        r.share = (r.forward_s + r.backward_s) / rows_sum if rows_sum else 0.0
    step = StepTiming(step_s=step_s, forward_s=med([f for f, _ in plain]), backward_s=med([b for _, b in plain]),
                      profiled_step_s=profiled_s, overhead=profiled_s / step_s - 1 if step_s else 0.0,
                      rows_sum_s=rows_sum, rows_error=rows_sum / step_s - 1 if step_s else 0.0,
                      unattributed_s=med(unattributed) if unattributed else 0.0,
                      peak_bytes=_peak(stepper), samples_step_s=[f + b for f, b in plain])
    return rows, step, stepper.backward, dict(uncounted.total), replayed


def _count(stepper: Stepper):
    """One measure step: FLOPs per call and node, saved bytes per call, the compute ops no formula
    counted (:class:`~layerlab.profiling.flops.UncountedOps`); the call structure."""
    from layerlab.profiling.flops import UncountedOps, flop_counter

    counter = flop_counter()
    probe = StepProbe(stepper.module, stepper.clock, flops=counter)
    uncounted = UncountedOps(counter.flop_registry, probe.current_call)
    probe.install()
    stepper.reset()
    faults.step("FLOP-counting step")
    try:
        with uncounted, counter:  # uncounted below the counter: it sees what the counter ran
            with probe.saved_tensors():
                out = stepper.module(*stepper.pos, **stepper.kw)
            outs = _grad_outputs(out)
            probe.attach_backward(outs)
            if stepper.backward:
                torch.autograd.backward(outs, stepper.grads)
    finally:
        probe.remove()
        stepper.reset()
    return probe.counts_per_call(), probe.calls, uncounted, probe.param_bytes_per_call(), probe.replayed


def _rows(module: torch.nn.Module, calls, per_row: Dict[tuple, List[tuple]], counts: Dict[tuple, tuple],
          not_counted: Dict[Optional[int], Dict[str, int]], param_bytes: Dict[int, int]):
    named = dict(module.named_modules())
    med = statistics.median
    rows: List[ProfileRow] = []
    index_of: Dict[int, int] = {}
    for i, call in enumerate(calls):
        path, n = call.key
        mod = named.get(path)
        samples = per_row.get(call.key, [])
        f_flops, b_flops, saved, out_bytes = counts.get(call.key, (0, 0, 0, 0))
        params = param_bytes.get(i, 0)
        index_of[i] = len(rows)
        rows.append(ProfileRow(
            index=len(rows), path=path, call=n, class_name=type(mod).__name__ if mod is not None else "?",
            depth=path.count(".") + 1 if path else 0,
            parent=index_of.get(call.parent) if call.parent is not None else None,
            forward_s=med([s[0] for s in samples]) if samples else 0.0,
            backward_s=med([s[1] for s in samples]) if samples else 0.0,
            forward_incl_s=med([s[2] for s in samples]) if samples else 0.0,
            backward_incl_s=med([s[3] for s in samples]) if samples else 0.0,
            flops_forward=int(f_flops), flops_backward=int(b_flops), activation_bytes=int(saved),
            output_bytes=int(out_bytes), param_bytes=int(params), flops_not_counted=dict(not_counted.get(i, {})),
        ))
    return rows


def _peak(stepper: Stepper) -> Optional[int]:
    if stepper.device.type != "cuda":
        return None
    torch.cuda.synchronize(stepper.device)
    base = torch.cuda.memory_allocated(stepper.device)
    torch.cuda.reset_peak_memory_stats(stepper.device)
    stepper.timed()
    return int(torch.cuda.max_memory_allocated(stepper.device) - base)
