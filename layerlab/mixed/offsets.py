"""A module call whose input lost its spread before it ran: a large offset added in half precision.

``h = emb(x) + 1000`` in bfloat16 rounds every element to a step of 4 (bfloat16 keeps 8 bits:
at 1000 its step is 2³ · 2⁻¹ = 4), so values that differed by less than that are now equal. The
next LayerNorm subtracts the mean and shows the loss, but the information was gone before it ran:
running the norm in float32 does not bring it back, removing the offset (or adding it in float32)
does. The input error precision-check measures says nothing of it (relative to 1000, a rounding
of 2 is 0.2 %), so the norm looks like the culprit.

What is measured: the *centred* input error, ``‖(x̃ − mean x̃) − (x − mean x)‖ / ‖x − mean x‖`` on
the kept sample of the call's input (the same positions in both runs; ``x̃`` the half run's
values, ``x`` float32's), next to the offset's size ``max |x| / max |x − mean x|`` (float32).
When the offset is :data:`~layerlab.mixed.causes.CANCELLED` times the spread or more and the
centred error is already above the output bar, the spread was lost before the call — unless the
call's output error is more than :data:`~layerlab.mixed.dtypes.GAIN` times that centred error: then
its own computation made most of it (``(x ** 2).mean() - x.mean() ** 2`` at a mean of 50 in bfloat16
turns a 6 % centred input error into 15 000 %: computing the variance in float32 on the same rounded
input gives the 6 %), and the call keeps the blame, as the flag rule keeps it for a relative input
error. The op that
made the input is looked for among the parent call's own ops that ran just before the call, with
no module call in between (an add/sub in half precision with a float32 ``max |x|`` matching the
input's); found, it is blamed with its ``file:line``. Where the parent ran none of its own ops before
the call and handed it its own input unchanged (``block.ln(x)`` first thing in ``block.forward``), the
search goes on in the grandparent, before the parent's call, and so up the calls: the add that made a
residual stream two modules up is found. Not found, the finding says what it measured and names no op
(for the model's own input: the cast rounded it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

from layerlab.mixed import causes
from layerlab.mixed.capture import Key, Seen
from layerlab.mixed.dtypes import GAIN, Tolerance
from layerlab.mixed.magnitude import step
from layerlab.mixed.runs import OpSeen, RunResult

#: norms that subtract the mean: an offset added just before them changes nothing in exact arithmetic
SHIFT_INVARIANT = {"LayerNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"}


@dataclass
class LostSpread:
    """The spread of input ``index`` of a call was lost before it: ``offset`` = float32
    ``max |x| / max |x − mean x|``; ``error``: the centred input error in the half run."""

    index: int
    offset: float
    error: float
    amax: float


def _centred(sample: torch.Tensor) -> torch.Tensor:
    finite = sample[torch.isfinite(sample)]
    return sample - (finite.mean() if finite.numel() else 0.0)


def lost_spread(ref_inputs: List[Seen], half_inputs: List[Seen], tol: Tolerance) -> Optional[LostSpread]:
    """The first input whose centred values are already off by more than ``tol.output``, under an
    offset at least :data:`~layerlab.mixed.causes.CANCELLED` times their spread."""
    for i, (r, h) in enumerate(zip(ref_inputs, half_inputs)):
        if r.sample.numel() < 2 or r.sample.shape != h.sample.shape or not h.finite or not r.finite:
            continue
        ref_centred = _centred(r.sample.double())
        spread = float(ref_centred.abs().max())
        amax = float(r.sample.double().abs().max())
        if spread == 0.0 or amax / spread < causes.CANCELLED:
            continue
        error = float((_centred(h.sample.double()) - ref_centred).norm() / ref_centred.norm())
        if error > tol.output:
            return LostSpread(index=i, offset=amax / spread, error=error, amax=amax)
    return None


def _passed_down(key: Key, ref: RunResult, run: RunResult, seen: Seen) -> bool:
    """The parent of ``key`` received ``seen``'s values itself (the same kept sample, in both runs)."""
    parent = ref.calls[key].parent
    if parent is None or parent not in run.calls:
        return False
    mine = run.calls[key].inputs
    index = next((i for i, s in enumerate(ref.calls[key].inputs) if s is seen), None)
    if index is None or index >= len(mine):
        return False
    for r, h in zip(ref.calls[parent].inputs, run.calls[parent].inputs):
        if r.numel == seen.numel and r.sample.shape == seen.sample.shape and torch.equal(r.sample, seen.sample) \
                and h.sample.shape == mine[index].sample.shape and torch.equal(h.sample, mine[index].sample):
            return True
    return False


def _source(key: Key, ref: RunResult, run: RunResult, seen: Seen) -> Key:
    """The outermost call that received ``seen``'s values unchanged from its caller's input (``key`` itself
    when its parent made them)."""
    while _passed_down(key, ref, run, seen):
        parent = ref.calls[key].parent
        seen = next(s for s in ref.calls[parent].inputs if s.numel == seen.numel and torch.equal(s.sample, seen.sample))
        key = parent
    return key


def _maker(key: Key, ref: RunResult, run: RunResult, numel: int, amax: float) -> Optional[OpSeen]:
    """The parent call's last half-precision add/sub before ``key`` started whose output has the
    input's size and, in float32, its ``max |x|`` (the sample's max is at most the tensor's)."""
    call = ref.calls[key]
    if call.parent is None:
        return None
    half = [op for op in run.ops if op.key == call.parent]
    paired = causes.float32_amax(half, [op for op in ref.ops if op.key == call.parent])
    # no module call started between the op and this one: a module in between (dropout, a
    # projection) may have made the input instead, and then no op of this parent is named
    before = [op for op in half if op.record.after_call == call.order and op.record.outputs
              and math.prod(op.record.outputs[0]) == numel]
    if not before:
        return None
    op = before[-1]
    made = paired.get(op.record.index)
    if op.record.op not in causes.CANCEL_OPS or not causes.low(op) or made is None \
            or not (amax <= made * (1 + 1e-6) and amax >= made / 2):
        return None
    return op


def explain(key: Key, class_name: str, ref: RunResult, run: RunResult, tol: Tolerance,
            device_type: str, output_error: Optional[float] = None) -> Optional[tuple]:
    """``(cause, where)`` when the call's input lost its spread before it ran (``where``: the key
    of the call that made the input, ``None`` when no op of it is known), else ``None``.
    ``output_error``: the call's own; far above the lost spread's error, the call made it itself."""
    if key not in run.calls:
        return None
    lost = lost_spread(ref.calls[key].inputs, run.calls[key].inputs, tol)
    if lost is None:
        return None
    if output_error is not None and math.isfinite(output_error) and output_error > GAIN * lost.error:
        return None
    seen = ref.calls[key].inputs[lost.index]
    top = _source(key, ref, run, seen)  # the values may have come down unchanged from further up
    op = _maker(top, ref, run, seen.numel, lost.amax)
    name = f"{key[0] or '(root)'} ({class_name})"
    measured = (f"its input is a large offset (|x| up to {lost.amax:.3g}) {lost.offset:.3g}× bigger than the "
                f"spread around it, and that spread is off by {lost.error:.2g} already on the way in")
    same = ("; the norm after it subtracts the mean anyway, so without the offset the model computes the same "
            "thing" if class_name in SHIFT_INVARIANT else "")
    if op is None and ref.calls[top].parent is None and run.setting.kind == "cast":  # the cast rounded it
        return causes.Cause(
            "swamped", f"{measured}: the model's input was rounded at the offset's magnitude when it was cast to "
            f"{run.setting.dtype}, before {name} ran", "subtract the offset from the input in float32 before "
            f"casting it (or feed it in float32){same}"), None
    if op is None:
        return causes.Cause(
            "swamped", f"{measured}: the values were rounded at the offset's magnitude before {name} ran, which "
            "only shows the loss", f"remove the large offset before {name}, or add it in float32{same}"), None
    low = op.record.out_dtypes[0]
    ulp = step(lost.amax, low)
    return causes.Cause(
        "swamped", f"{op.record.op} runs in {low}{causes.code(op)}: it makes values of |x| up to {lost.amax:.3g}, "
        f"{lost.offset:.3g}× their spread, and {low}'s step there is {ulp:.3g}, so the spread is "
        f"lost here: {name} only shows it (its centred input is off by {lost.error:.2g}), and running it in "
        "float32 cannot bring it back",
        f"remove the offset (or subtract it again before rounding){same}; or do that {op.record.op} and {name} in "
        f"float32 (the {op.record.op} on .float() values, {name} inside "
        f"`with torch.autocast(\"{device_type}\", enabled=False):`)", op.record.source), op.key

