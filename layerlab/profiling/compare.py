"""Side-by-side steps: eager vs ``torch.compile`` (``--compile``), and a layer vs its torch.nn
counterpart (``--vs-reference``).

Both time whole steps only (a compiled model has no per-module hooks to read): warm-up, then
alternating rounds of the two, medians. The reference gets the layer's weights through gradcheck's
alignment (:func:`layerlab.checks.reference.align`), so both compute the same thing.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.profiling.report import Comparison, Metric
from layerlab.target.copying import copy_model


def _rounds(steppers: List[Any], fns: List[Optional[Callable]], repeats: int, warmup: int) -> List[Dict[str, float]]:
    """Alternate the variants ``repeats`` times; medians of forward, backward and step per variant."""
    for _ in range(warmup):
        for s, fn in zip(steppers, fns):
            s.timed(fn)
    samples: List[List[tuple]] = [[] for _ in steppers]
    order = list(range(len(steppers)))
    for r in range(repeats):
        for i in (order if r % 2 == 0 else order[::-1]):
            samples[i].append(steppers[i].timed(fns[i]))
    med = statistics.median
    return [{"forward_s": med([f for f, _ in s]), "backward_s": med([b for _, b in s]),
             "step_s": med([f + b for f, b in s])} for s in samples]


def _batch(stepper) -> int:
    from layerlab.checks.case import Case, batch_layout

    case = Case(module=stepper.module, args=stepper.args, target="")
    B, _ = batch_layout(case, stepper.args)
    return B or 1


def compare_compiled(stepper, *, repeats: int, warmup: int, backend: str = DEFAULT_COMPILE_BACKEND) -> Comparison:
    """Eager vs ``torch.compile(copy, backend=backend)``: compile time, then step medians."""
    import torch._dynamo

    from layerlab.deploy.messages import first_line

    result = Comparison(kind="compile", a=f"torch.compile (backend {backend})", b="eager")
    compiled_module = copy_model(stepper.module)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(compiled_module, backend=backend)
        from layerlab.profiling.run import Stepper

        other = Stepper(compiled_module, stepper.args)
        start = time.perf_counter()
        other.timed(compiled)  # compiles forward and backward
        first = time.perf_counter() - start
        eager, comp = _rounds([stepper, other], [None, compiled], repeats, max(warmup, 1))
    except Exception as exc:
        torch._dynamo.reset()
        result.error = f"torch.compile (backend {backend}) failed: {first_line(exc)}"
        return result
    torch._dynamo.reset()
    B = _batch(stepper)
    result.metrics = _timings(comp, eager, B)
    result.notes.append(f"first compiled step (compilation included): {first:.2f} s")
    result.notes.append(f"ratio = compiled / eager; throughput = batch {B} / step time")
    return result


def _timings(a: Dict[str, float], b: Dict[str, float], B: int) -> List[Metric]:
    """Forward, backward and step time of rounds ``a`` and ``b``, and throughput at batch ``B``."""
    return [
        Metric("forward", a["forward_s"], b["forward_s"], "s"),
        Metric("backward", a["backward_s"], b["backward_s"], "s"),
        Metric("step (fwd + bwd)", a["step_s"], b["step_s"], "s"),
        Metric("throughput", B / a["step_s"], B / b["step_s"], "samples/s", better="higher"),
    ]


def compare_reference(stepper, reference: Any, *, repeats: int, warmup: int) -> Comparison:
    """The layer vs ``reference`` carrying its weights: time, throughput and memory, with ratios."""
    from layerlab.target.bind import class_path
    from layerlab.checks.reference import align
    from layerlab.profiling.run import Stepper, _count

    ours = stepper.module
    aligned = align(ours, reference)
    ref = aligned.reference
    if ref is None and isinstance(reference, torch.nn.Module):
        ref = copy_model(reference)  # no weights to share: times and memory still compare
    result = Comparison(kind="reference", a=class_path(ours), b=class_path(reference))
    if not isinstance(ref, torch.nn.Module):
        result.error = f"no reference module to run: {aligned.error or 'the reference is not an nn.Module'}"
        return result
    ref = ref.to(stepper.device)
    ref.train(ours.training)
    try:
        other = Stepper(ref, stepper.args)
    except Exception as exc:
        result.error = str(getattr(exc, "message", exc))
        return result
    a, b = _rounds([stepper, other], [None, None], repeats, max(warmup, 1))
    B = _batch(stepper)
    act_a = sum(v[2] for v in _count(stepper)[0].values())
    act_b = sum(v[2] for v in _count(other)[0].values())
    result.metrics = _timings(a, b, B) + [
        Metric("parameters", _param_bytes(ours), _param_bytes(ref), "bytes"),
        Metric("activations (saved for backward)", act_a, act_b, "bytes"),
    ]
    if stepper.device.type == "cuda":
        from layerlab.profiling.run import _peak

        result.metrics.append(Metric("peak memory of a step", _peak(stepper), _peak(other), "bytes"))
    result.notes.append(f"weights: {aligned.note or 'not shared (' + str(aligned.error) + ')'}")
    result.notes.append(f"ratio = ours / reference; throughput = batch {B} / step time")
    return result


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
