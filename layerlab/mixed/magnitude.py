"""Rules that read the *size* of an op's operands: where the rounding of a value, not the op, hurts.

:mod:`~layerlab.mixed.causes` names the op of a call that lost precision; these rules answer
the questions its table cannot answer from op names alone, from the float32 run's ``max |x|``
of each operand (an op of the call, a module call's output, or a Python number):

==============  ===========================================  =====================================
rule            seen                                         why (and why the obvious fix fails)
==============  ===========================================  =====================================
sensitive       exp/softmax/sin/cos of values |x| ≥ 4        the dtype's step at |x| is an absolute
                (``(logits / 1e-3).softmax()``,              error of the input, which exp turns
                ``sin(x @ B)`` with angles of 1000)          into a relative error of the output
                                                             and sin into a wrong phase; running
                                                             only the exp in float32 cannot undo
                                                             the rounding of its input
eps underflow   ``+ 1e-12`` (or ``clamp(min=1e-12)``) in     the eps is 0 in float16 (below 3e-8),
                float16                                      so a zero statistic divides 0 by 0
absorbed        ``h + small`` with ``|small|`` below         the increments round away: a running
                ``h``'s step (``h ≈ 300`` in bfloat16:       value that grows by them stays put
                step 2; increments of 0.01)
==============  ===========================================  =====================================

Operand magnitudes (:func:`operand_sizes`) come from three places: the float32 ``max |x|`` of the
op that made it (same call), of the module call whose output it is, or the number itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from layerlab.mixed.dtypes import HALF
from layerlab.mixed.runs import OpSeen

#: exponentials: an absolute error δ of the input is a relative error ≈ δ of the output
EXP_LIKE = {"softmax", "F.softmax", "log_softmax", "F.log_softmax", "exp", "exp2", "logsumexp", "softmin",
            "F.softmin"}
#: periodic functions: an absolute error δ of the angle is an error δ of an output of size 1
PERIODIC = {"sin", "cos", "tan", "sinc"}
#: ops that only scale their tensor operand by a number: they keep its relative error
SCALE_OPS = {"mul", "__mul__", "__rmul__", "div", "__truediv__", "true_divide", "neg", "__neg__", "unsqueeze",
             "squeeze", "view", "reshape", "transpose", "permute", "contiguous", "float", "to", "type_as"}
ADD_OPS = {"add", "__add__", "__radd__", "__iadd__", "sub", "__sub__", "__rsub__", "__isub__", "subtract"}
CLAMP_OPS = {"clamp", "clamp_min", "clip", "clamp_", "clamp_min_"}
#: an input this large (float32 max |x|) is rounded to a step of at least 4ε: exp/sin notice
SENSITIVE_FROM = 4.0


@dataclass
class Sizes:
    """What is known of the run beyond one call's own ops (float32 magnitudes, keyed by the half
    run's indices): ``calls``: call index → max |output|; ``ops``: op index (any call) →
    ``(max |output|, index of the call it ran in)``; ``callers``: call index → ``path (Class)``."""

    calls: Dict[int, float] = field(default_factory=dict)
    ops: Dict[int, Tuple[float, Optional[int]]] = field(default_factory=dict)
    callers: Dict[int, str] = field(default_factory=dict)


def step(value: float, dtype: str) -> float:
    """The dtype's spacing of numbers (ulp) at ``value``: bfloat16's at 300 is 2, float16's 0.25 (any
    floating dtype by name: an op's recorded output dtype)."""
    if value <= 0 or not math.isfinite(value):
        return 0.0
    return 2.0 ** math.floor(math.log2(value)) * float(torch.finfo(HALF.get(dtype) or getattr(torch, dtype)).eps)


def scalars(op: OpSeen) -> List[float]:
    """The Python numbers an add/sub took as an operand (``x - 300.0``: ``[300.0]``)."""
    if op.record.op not in ADD_OPS:
        return []
    return [float(v) for k, v in op.record.args.items()
            if k.isdigit() and isinstance(v, (int, float)) and not isinstance(v, bool)]


def operand_sizes(op: OpSeen, amax: Dict[int, float], sizes: Sizes) -> List[Tuple[float, Optional[int]]]:
    """``(float32 max |x|, the module call that made it or None)`` per operand of ``op`` whose
    size is known: tensors made by an op of the call (``amax``: op index → max |x|), by an op of
    another call or by a module call (``sizes``), and numbers."""
    out = []
    for operand in op.record.inputs:
        if operand.from_op is not None and operand.from_op in amax:
            out.append((amax[operand.from_op], None))
        elif operand.from_op is not None and operand.from_op in sizes.ops:
            out.append(sizes.ops[operand.from_op])
        elif operand.from_op is None and operand.from_call is not None and operand.from_call in sizes.calls:
            out.append((sizes.calls[operand.from_call], operand.from_call))
    out.extend((abs(v), None) for v in scalars(op))
    return out


def _origin(op: OpSeen, made: Dict[int, OpSeen], callers: Dict[int, str]) -> str:
    """What made the (scaled) input of ``op``: the ops of this call that only rescale it, back to
    an op that computes it, a module call or this module's input."""
    names, operand = [], op.record.inputs[0]
    while operand.from_op is not None and operand.from_op in made:
        maker = made[operand.from_op]
        from layerlab.mixed.causes import code

        names.append(f"{maker.record.op}{code(maker)}")
        if maker.record.op not in SCALE_OPS or len(maker.record.inputs) != 1:
            return ", ".join(names)
        operand = maker.record.inputs[0]
    if operand.from_op is None and operand.from_call is not None and operand.from_call in callers:
        names.append(f"the module that makes its input, {callers[operand.from_call]}")
    else:
        names.append("whatever makes this module's input")
    return ", ".join(names)


def sensitive(op: OpSeen, made: Dict[int, OpSeen], amax: Dict[int, float], sizes: Sizes,
              device_type: str) -> Optional["Cause"]:  # noqa: F821
    """An exp/softmax/sin/cos whose input is large enough that the dtype's rounding of it alone
    exceeds the bars: the fix is to build its input in float32 too, not only to run the op there."""
    from layerlab.mixed.causes import Cause, code, low

    name = op.record.op
    if (name not in EXP_LIKE and name not in PERIODIC) or not low(op) or not op.record.inputs:
        return None
    known = operand_sizes(op, amax, sizes)
    if not known or known[0][0] < SENSITIVE_FROM:
        return None
    size, half = known[0][0], op.record.out_dtypes[0]
    what = ("exp turns an absolute error δ of its input into a relative error of about δ of its output"
            if name in EXP_LIKE else f"{name} turns an absolute error δ of the angle into an error δ of an "
            "output of size 1 (the phase is wrong)")
    smaller = ("keep its input small (a larger temperature; in attention, scale q before the matmul)"
               if name in EXP_LIKE else "keep the angles small (smaller frequencies, or reduce them modulo 2π "
               "in float32)")
    text = (f"{name} runs in {half}{code(op)} on values up to |x| = {size:.3g} (float32), where {half}'s step is "
            f"{step(size, half):.3g}: {what}; the rounding of its input is enough to explain the error")
    fix = (f"keep {name} in float32 together with what makes its input ({_origin(op, made, sizes.callers)}): running "
           f"{name} alone in float32 cannot undo the rounding of its input; do them inside "
           f"`with torch.autocast(\"{device_type}\", enabled=False):` on .float() values, or {smaller}")
    return Cause("sensitive", text, fix, op.record.source)


def small_exponent(op: OpSeen, amax: Dict[int, float], sizes: Sizes) -> bool:
    """An exp/softmax whose input is known (float32 ``max |x|``) to stay below
    :data:`SENSITIVE_FROM`: the dtype's step there is at most 2ε, so its own rounding adds about an
    eps to its output, far below the bars; an error it shows was in its input already."""
    known = operand_sizes(op, amax, sizes) if op.record.inputs else []
    return bool(known) and math.isfinite(known[0][0]) and known[0][0] < SENSITIVE_FROM


def eps_underflow(op: OpSeen, device_type: str) -> Optional["Cause"]:  # noqa: F821
    """``x + 1e-12`` (or ``clamp(min=1e-12)``) in a dtype where that eps rounds to 0."""
    from layerlab.mixed.causes import Cause, code, flushed, keep_fp32, low

    name = op.record.op
    if not low(op):
        return None
    half = op.record.out_dtypes[0]
    if name in ADD_OPS:
        values = scalars(op)
    elif name in CLAMP_OPS:
        values = [float(v) for k, v in op.record.args.items() if k in ("min", "1") and isinstance(v, (int, float))]
    else:
        return None
    eps = next((v for v in values if 0.0 < abs(v) < flushed(half)), None)
    if eps is None:
        return None
    return Cause("eps-underflow",
                 f"{name} runs in {half}{code(op)}: its eps {eps:g} is 0 in {half} (values below {flushed(half):.2g} "
                 "round to 0), so it guards nothing: a statistic that is 0 (a constant or all-zero row) is divided "
                 "by 0, and 0/0 is NaN",
                 f"use an eps {half} can hold (1e-5, nn.LayerNorm's default, or larger), or compute the statistic "
                 f"and the division in float32 ({keep_fp32(device_type, 'them')})", op.record.source)


def absorbed(ops: List[OpSeen], ref_ops: List[OpSeen], sizes: Sizes) -> Optional["Cause"]:  # noqa: F821
    """The first add of a call (``ops``: its half-run ops, ``ref_ops``: the same in float32) whose
    smaller operand is below the larger one's step in the dtype: it is rounded away entirely."""
    from layerlab.mixed.causes import Cause, code, float32_amax, low

    amax = float32_amax(ops, ref_ops)
    for op in ops:
        if op.record.op not in ADD_OPS or not low(op):
            continue
        known = [s for s, _ in operand_sizes(op, amax, sizes)]
        if len(known) != 2 or min(known) == 0.0:
            continue
        big, small, half = max(known), min(known), op.record.out_dtypes[0]
        if small < step(big, half) / 2:
            return Cause("absorbed",
                         f"{op.record.op} runs in {half}{code(op)}: it adds values of at most |x| = {small:.3g} to "
                         f"values up to |x| = {big:.3g}, where {half}'s step is {step(big, half):.3g}: the small ones "
                         "are rounded away, so a running value that grows by them stays where it is",
                         "accumulate in float32: make the running value float32 where it is created, before anything "
                         "large is added to it (`h = h0.float() + offset`; float32 + half stays float32), or keep it "
                         "small (subtract its offset before accumulating)",
                         op.record.source)
    return None
