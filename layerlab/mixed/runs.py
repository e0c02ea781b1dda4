"""One forward + backward of the model, in float32 or in half precision, and what it kept.

Every run leaves the user's module as it was: a model made only of torch.nn / layerlab modules
(which change nothing but buffers when they run) runs as it is and gets its buffers (BatchNorm
statistics) back afterwards; any other model, a lazy one and a ``cast`` run use ``copy.deepcopy``
of it (a user-written forward may change any attribute). Gradients are taken with
``torch.autograd.grad``, so no ``.grad`` is touched. Every run seeds torch's generator the
same way (dropout draws the same mask: on CPU a bf16 and a float32 bernoulli draw agree element
for element), and differentiates the same loss: inspect's seeded projection ``Σ ⟨outᵢ, Rᵢ⟩``
(:func:`layerlab.probe.backward.random_projection`), with ``R`` drawn once in float32 and handed to
each output in its own dtype, as autograd would hand a half output its gradient. Gradients are
taken with respect to the model's trainable parameters.

Settings (:class:`Setting`): ``float32`` (the reference), ``autocast`` (``torch.autocast`` around
the forward only, as torch recommends: backward runs outside it) and ``cast`` (the copy and the
floating inputs ``.to(dtype)``, what ``--dtype float16`` does for the other commands). A
``grad_scale`` multiplies the loss and divides the gradients afterwards, as
``torch.amp.GradScaler`` does on its first step (init_scale 2¹⁶); a non-finite scaled gradient is
what makes GradScaler skip the step and halve its scale (``found_inf``).

The op trace (:class:`~layerlab.probe.ops.OpTrace`, the one op-level mechanism) runs in every
run of a model with a user-written forward: it says which of the model's own ops ran in which
dtype (it records nothing inside torch.nn / layerlab modules, so it is left out where there are
no others). In the float32 run
:class:`RangeTrace` also notes each op's ``max |output|``, which is what says that an intermediate
value (``exp(x)`` inside a user's forward, never a module's output) would overflow float16.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch.nn.parameter import is_lazy

from layerlab.mixed.capture import Capture, CallSeen, Key, measured_amax
from layerlab.mixed.dtypes import HALF
from layerlab.target.buffers import SavedBuffers
from layerlab.probe.backward import differentiable_outputs, random_projection
from layerlab.probe.hooks import ProbeBug, Recorder
from layerlab.probe.ops import OpTrace
from layerlab.probe.report import OpRecord
from layerlab.target.copying import copy_model
from layerlab.target.seeding import seed_generators


@dataclass(frozen=True)
class Setting:
    """How one run computes: ``kind`` float32 | autocast | cast, ``dtype`` float16 | bfloat16."""

    kind: str
    dtype: Optional[str] = None
    grad_scale: Optional[float] = None

    @property
    def label(self) -> str:
        if self.kind == "float32":
            return "float32"
        return f"{self.kind} {self.dtype}" + (" + GradScaler" if self.grad_scale else "")


FLOAT32 = Setting("float32")


@dataclass
class OpSeen:
    """An op of the model's own code in one run: its record, the call it ran in, ``max |output|``
    (float32 run only)."""

    record: OpRecord
    key: Optional[Key]
    amax: Optional[float] = None


@dataclass
class RunResult:
    """What one run kept: per call (:class:`~layerlab.mixed.capture.CallSeen`), the
    parameters' gradients (whole: they are parameter-sized), the ops, and how it went."""

    setting: Setting
    calls: Dict[Key, CallSeen] = field(default_factory=dict)
    grads: Dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    ops: List[OpSeen] = field(default_factory=list)
    projections: List[torch.Tensor] = field(default_factory=list)
    projection_versions: List[int] = field(default_factory=list)  # as drawn, before any backward ran
    out_shapes: List[tuple] = field(default_factory=list)
    dropped_calls: int = 0
    dropped_ops: int = 0
    found_inf: bool = False
    raised: Optional[BaseException] = None
    #: the innermost module call open when ``raised`` was raised (its path; "(root)" for the model)
    raised_in: Optional[str] = None
    seconds: float = 0.0
    grad_sums: Optional[Dict[str, tuple]] = None  # per gradient sums, filled once (compare.grad_sums)
    seen: Dict[int, tuple] = field(default_factory=dict)  # the capture's tensors seen (Capture.known)
    real_tiny: set = field(default_factory=set)  # tiny gradients a float64 run showed are not rounding noise
    float64_checked: set = field(default_factory=set)  # the gradients that float64 run measured


class RangeTrace(OpTrace):
    """The op trace, plus ``max |output|`` (finite elements) of every floating output it records
    (float32 run)."""

    def __init__(self, recorder: Recorder, measure: bool) -> None:
        super().__init__(recorder)
        self.measure = measure
        self.amax: Dict[int, float] = {}

    def _record(self, name, call, args, kwargs, file, line, outs) -> OpRecord:
        record = super()._record(name, call, args, kwargs, file, line, outs)
        if self.measure:
            found = [_amax(o) for o in outs if o.is_floating_point() and o.numel() and not o.is_nested]
            if found:
                self.amax[record.index] = max(found)
        return record


def _amax(t: torch.Tensor) -> float:
    """``max |x|`` over the finite elements, mask fills left out (see :func:`measured_amax`)."""
    return measured_amax(t.detach())[0]


def run(module: torch.nn.Module, args: Sequence[Any], setting: Setting, *, seed: int,
        reference: Optional[RunResult] = None, mode: Optional[Any] = None) -> RunResult:
    """Run ``setting`` on ``module`` (or a copy, see :func:`stateless`) with ``args``
    (:class:`~layerlab.target.bind.Arg`); the module comes back as it was.

    ``reference``: the float32 run (its loss projections are reused). ``mode``: a context manager
    entered around the forward, innermost (a TorchFunctionMode of :mod:`~layerlab.mixed.kinks`). An exception
    of the model is kept in ``raised`` (the caller decides what it means); layerlab's own
    (:class:`~layerlab.probe.hooks.ProbeBug`) propagates.
    """
    started = time.perf_counter()
    result = RunResult(setting=setting)
    dtype = HALF[setting.dtype] if setting.dtype else None
    device = _device(module, args)
    named_modules = list(module.named_modules())  # walked once: each walk costs ~10 µs per module
    modules = [m for _, m in named_modules]
    lazy = any(is_lazy(p) for m in modules for p in m._parameters.values() if p is not None)
    in_place = setting.kind != "cast" and stateless(module, modules)
    # A model of torch.nn / layerlab modules changes nothing but its buffers when it runs (BatchNorm's
    # statistics): it runs as it is, its buffers put back afterwards. Anything else runs on a copy.
    model = module if in_place else copy_model(module)
    saved = SavedBuffers(modules) if in_place else None
    try:
        _run(model, args, setting, dtype, seed, device, lazy, reference, result,
             named_modules if in_place else list(model.named_modules()), mode)
    finally:
        if saved is not None:
            saved.restore()
    result.seconds = time.perf_counter() - started
    return result


def _run(model: torch.nn.Module, args: Sequence[Any], setting: Setting, dtype: Optional[torch.dtype], seed: int,
         device: torch.device, lazy: bool, reference: Optional[RunResult], result: RunResult,
         named_modules: List[tuple], mode: Optional[Any] = None) -> None:
    from layerlab.target.bind import call, map_args

    rng_devices = [device] if device.type == "cuda" else []
    if lazy:
        # Materialise lazy parameters first, in float32 with the run's seed (every copy gets the same
        # weights), outside the trace: the op trace cannot describe an uninitialised parameter.
        with torch.no_grad(), torch.random.fork_rng(devices=rng_devices):
            seed_generators(seed, rng_devices)  # not torch.manual_seed: see layerlab.target.seeding
            call(model, args)
    if setting.kind == "cast":
        model.to(dtype)
        args = map_args(args, lambda t: t.to(dtype) if t.is_floating_point() else t)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # The op trace says which of the model's *own* ops ran in which dtype; it records nothing inside
    # torch.nn / layerlab modules, so a model made only of those runs without it (and its recorder).
    recorder = trace = None
    if needs_trace(model, [m for _, m in named_modules]):
        recorder = Recorder(model, stats=False, grads=False)
        trace = recorder.trace = RangeTrace(recorder, measure=reference is None)
    capture = Capture(model, seed=seed, trace=trace, measure=reference is None,  # max |x|: float32's only
                      named_modules=named_modules, known=reference.seen if reference is not None else None)
    autocast = torch.autocast(device.type, dtype=dtype) if setting.kind == "autocast" else contextlib.nullcontext()
    try:
        with torch.random.fork_rng(devices=rng_devices):
            seed_generators(seed, rng_devices)  # not torch.manual_seed: see layerlab.target.seeding
            if recorder is not None:
                recorder.install(named_modules)
            try:
                with capture, trace or contextlib.nullcontext(), autocast, mode or contextlib.nullcontext():
                    output = call(model, args)
            finally:
                if recorder is not None:
                    recorder.remove()
        outs = differentiable_outputs(output)
        result.out_shapes = [tuple(o.shape) for o in outs]
        if reference is None:
            result.projections = random_projection(outs, seed) if outs else []
            result.projection_versions = [r._version for r in result.projections]
        elif any(r._version != v for r, v in zip(reference.projections, reference.projection_versions)):
            # the float32 backward wrote into its output gradients (a gradient-reversal Function's
            # g.mul_(-1)): draw them again, the same values, rather than hand on what it left
            result.projections = random_projection(outs, seed) if outs else []
        else:
            result.projections = reference.projections
            if result.out_shapes != reference.out_shapes:
                raise OutputsDiffer(f"outputs {result.out_shapes} here, {reference.out_shapes} in float32")
        if outs and named:
            scale = setting.grad_scale or 1.0
            grad_outputs = [(r * scale if setting.grad_scale else r).to(o.dtype)  # no copy where nothing scales
                            for r, o in zip(result.projections, outs)]
            grads = torch.autograd.grad(outs, [p for _, p in named], grad_outputs=grad_outputs, allow_unused=True)
            if setting.grad_scale:
                result.found_inf = any(g is not None and not bool(torch.isfinite(g).all()) for g in grads)
                grads = [None if g is None else g / scale for g in grads]
                _unscale(capture.calls, scale)
            result.grads = {n: None if g is None else g.detach() for (n, _), g in zip(named, grads)}
    except ProbeBug as bug:
        raise bug.original from bug
    except Exception as exc:  # the model (or torch under it) raised in this setting
        result.raised = exc
        if capture._stack:  # the calls whose forward hooks never ran: the innermost one raised
            result.raised_in = capture._stack[-1][0] or "(root)"
    finally:
        capture.remove()
    result.calls = capture.calls
    result.seen = capture.seen()
    result.dropped_calls = capture.dropped
    if trace is None:
        return
    result.dropped_ops = trace.dropped
    for record in trace.records:
        key = None
        if record.call is not None and record.call < len(recorder.calls):
            c = recorder.calls[record.call]
            key = (c.path, c.call)
        result.ops.append(OpSeen(record=record, key=key, amax=trace.amax.get(record.index)))


def float64_grad_rms(module: torch.nn.Module, args: Sequence[Any], seed: int, reference: RunResult,
                     names: Sequence[str]) -> Dict[str, float]:
    """RMS of the gradients ``names`` in a float64 run of a copy (the same seed, inputs and loss
    projection as ``reference``): a gradient that is rounding noise around an exact zero in float32
    is ~1e9 times smaller here, a real tiny one keeps its size."""
    from layerlab.target.bind import call, map_args
    from layerlab.target.seeding import seeded

    model = copy_model(module).double()
    wide = map_args(args, lambda t: t.detach().double() if t.is_floating_point() else t)
    with seeded(seed, model):
        output = call(model, wide)
    outs = differentiable_outputs(output)
    params = dict(model.named_parameters())
    present = [n for n in names if n in params]
    grads = torch.autograd.grad(outs, [params[n] for n in present],
                                grad_outputs=[r.double() for r in reference.projections], allow_unused=True)
    return {n: (float(torch.linalg.vector_norm(g)) / g.numel() ** 0.5 if g is not None else 0.0)
            for n, g in zip(present, grads)}


def _unscale(calls: Dict[Key, CallSeen], scale: float) -> None:
    """The module-output gradients a GradScaler run sampled are ``scale`` times the real ones: the
    rows compare them with float32's unscaled gradients. Each kept sample is divided once (one
    :class:`~layerlab.mixed.capture.Seen` can stand for several calls' gradients)."""
    done = set()
    for call in calls.values():
        for seen in call.grads.values():
            if id(seen) not in done:
                done.add(id(seen))
                seen.sample.div_(scale)


def library_only(module: torch.nn.Module, modules: Optional[List[torch.nn.Module]] = None) -> bool:
    """Every module in it is torch.nn's or layerlab's (no forward written by the user).
    ``modules``: ``list(module.modules())`` when the caller has it."""
    from layerlab.probe.ops import library_class

    return all(library_class(type(m)) for m in (module.modules() if modules is None else modules))


def needs_trace(module: torch.nn.Module, modules: Optional[List[torch.nn.Module]] = None) -> bool:
    """The op trace records ops of user-written forwards only: is there one to record?"""
    return not library_only(module, modules)


def stateless(module: torch.nn.Module, modules: Optional[List[torch.nn.Module]] = None) -> bool:
    """Can it run in place? torch.nn / layerlab modules change only their buffers when they run
    (BatchNorm's running statistics), which :class:`~layerlab.target.buffers.SavedBuffers` puts back. A user-written forward
    or hook may change anything (a counter, a cache, a list it appends to), so a model with one runs
    on a copy, as does a lazy module (running it materialises its parameters)."""
    modules = list(module.modules()) if modules is None else modules
    return library_only(module, modules) and not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        or any(p is not None and is_lazy(p) for p in m._parameters.values()) for m in modules)


class OutputsDiffer(Exception):
    """The half run took another path than float32 (different outputs): nothing to compare."""


def _device(model: torch.nn.Module, args: Sequence[Any]) -> torch.device:
    from layerlab.target.bind import flatten

    for p in model.parameters():
        return p.device
    for a in args:
        for _, t in flatten(a.value):
            if isinstance(t, torch.Tensor):
                return t.device
    return torch.device("cpu")
