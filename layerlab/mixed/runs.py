"""One forward + backward of a copy of the model, in float32 or in half precision, and what it kept.

Every run starts from ``copy.deepcopy`` of the user's module (the module itself is never run, so
its ``.grad``, BatchNorm statistics and RNG-free state are untouched), seeds torch's generator the
same way (dropout draws the same mask: on CPU a bf16 and a float32 bernoulli draw agree element
for element), and differentiates the same loss: inspect's seeded projection ``Σ ⟨outᵢ, Rᵢ⟩``
(:func:`layerlab.probe.backward.random_projection`), with ``R`` drawn once in float32 and handed to
each output in its own dtype, as autograd would hand a half output its gradient. Gradients are
taken with ``torch.autograd.grad`` with respect to the copy's trainable parameters.

Settings (:class:`Setting`): ``float32`` (the reference), ``autocast`` (``torch.autocast`` around
the forward only, as torch recommends: backward runs outside it) and ``cast`` (the copy and the
floating inputs ``.to(dtype)``, what ``--dtype float16`` does for the other commands). A
``grad_scale`` multiplies the loss and divides the gradients afterwards, as
``torch.amp.GradScaler`` does on its first step (init_scale 2¹⁶); a non-finite scaled gradient is
what makes GradScaler skip the step and halve its scale (``found_inf``).

The op trace (:class:`~layerlab.probe.ops.OpTrace`, the one op-level mechanism) runs in every
run: it says which of the model's own ops ran in which dtype. In the float32 run
:class:`RangeTrace` also notes each op's ``max |output|``, which is what says that an intermediate
value (``exp(x)`` inside a user's forward, never a module's output) would overflow float16.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch.nn.parameter import is_lazy

from layerlab.mixed.capture import Capture, CallSeen, Key, abs_max, finite_amax
from layerlab.mixed.dtypes import HALF
from layerlab.probe.backward import differentiable_outputs, random_projection
from layerlab.probe.hooks import ProbeBug, Recorder
from layerlab.probe.ops import OpTrace
from layerlab.probe.report import OpRecord


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
    out_shapes: List[tuple] = field(default_factory=list)
    dropped_calls: int = 0
    dropped_ops: int = 0
    found_inf: bool = False
    raised: Optional[BaseException] = None
    seconds: float = 0.0


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
    """``max |x|`` over the finite elements (an op that writes ``-inf`` into a mask is not large)."""
    amax = abs_max(t.detach())
    return amax if math.isfinite(amax) else finite_amax(t)


def run(module: torch.nn.Module, args: Sequence[Any], setting: Setting, *, seed: int,
        reference: Optional[RunResult] = None) -> RunResult:
    """Run ``setting`` on a copy of ``module`` with ``args`` (:class:`~layerlab.target.bind.Arg`).

    ``reference``: the float32 run (its loss projections are reused). An exception
    of the model is kept in ``raised`` (the caller decides what it means); layerlab's own
    (:class:`~layerlab.probe.hooks.ProbeBug`) propagates.
    """
    from layerlab.target.bind import call, map_args

    started = time.perf_counter()
    result = RunResult(setting=setting)
    model = copy.deepcopy(module)
    dtype = HALF[setting.dtype] if setting.dtype else None
    rng_devices = [d for d in {_device(model, args)} if d.type == "cuda"]
    if any(is_lazy(p) for p in model.parameters()):
        # Materialise lazy parameters first, in float32 with the run's seed (every copy gets the same
        # weights), outside the trace: the op trace cannot describe an uninitialised parameter.
        with torch.no_grad(), torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(seed)
            call(model, args)
    if setting.kind == "cast":
        model.to(dtype)
        args = map_args(args, lambda t: t.to(dtype) if t.is_floating_point() else t)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    device = _device(model, args)
    recorder = Recorder(model, stats=False, grads=False)
    trace = recorder.trace = RangeTrace(recorder, measure=reference is None)
    capture = Capture(model, seed=seed, trace=trace)
    autocast = torch.autocast(device.type, dtype=dtype) if setting.kind == "autocast" else contextlib.nullcontext()
    try:
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(seed)
            recorder.install()
            try:
                with capture, trace, autocast:
                    output = call(model, args)
            finally:
                recorder.remove()
        outs = differentiable_outputs(output)
        result.out_shapes = [tuple(o.shape) for o in outs]
        if reference is None:
            result.projections = random_projection(outs, seed) if outs else []
        else:
            result.projections = reference.projections
            if result.out_shapes != reference.out_shapes:
                raise _Mismatch(f"outputs {result.out_shapes} here, {reference.out_shapes} in float32")
        if outs and named:
            scale = setting.grad_scale or 1.0
            grad_outputs = [(r * scale).to(o.dtype) for r, o in zip(result.projections, outs)]
            grads = torch.autograd.grad(outs, [p for _, p in named], grad_outputs=grad_outputs, allow_unused=True)
            if setting.grad_scale:
                result.found_inf = any(g is not None and not bool(torch.isfinite(g).all()) for g in grads)
                grads = [None if g is None else g / scale for g in grads]
            result.grads = {n: None if g is None else g.detach() for (n, _), g in zip(named, grads)}
    except ProbeBug as bug:
        raise bug.original from bug
    except Exception as exc:  # the model (or torch under it) raised in this setting
        result.raised = exc
    finally:
        capture.remove()
    result.calls = capture.calls
    result.dropped_calls = capture.dropped
    result.dropped_ops = trace.dropped
    for record in trace.records:
        key = None
        if record.call is not None and record.call < len(recorder.calls):
            c = recorder.calls[record.call]
            key = (c.path, c.call)
        result.ops.append(OpSeen(record=record, key=key, amax=trace.amax.get(record.index)))
    result.seconds = time.perf_counter() - started
    return result


class _Mismatch(Exception):
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
