"""Why a module call loses precision, read from the ops it ran, and what to change.

The rules look at what the op trace recorded for the call in the half run (the model's own ops
with their output dtypes) and, for overflow, at the float32 run's ``max |output|`` of the same ops.
A torch.nn module's internal ops are not traced: its class says what it computes (``nn.Softmax``
exponentiates, the norms take a variance). Each rule names the op and its ``file:line``; when no
rule fits, :func:`explain` returns no cause, and the finding says what it sees and that it cannot
tell why — a named op is only ever one that ran in low precision in this call.

=============  =====================================================  ============================
what           ops                                                    why it hurts in low precision
=============  =====================================================  ============================
exp/softmax    softmax, log_softmax, exp, logsumexp, nn.Softmax …     an absolute error δ in a logit
                                                                      is a relative error δ in exp:
                                                                      logits of 1000 carry δ ≈ 4 in
                                                                      bf16, 0.5 in fp16
variance       var, std, pow, square, norm, x * x, nn.LayerNorm …     E[x²] − E[x]² cancels: the
                                                                      rounding of E[x²] is left
cancellation   sub/add whose float32 result is ≥ 16× smaller than     both operands were rounded at
               an operand (``h - h.mean()`` with a large mean)        their own magnitude; the
                                                                      difference keeps few bits
large value    any op whose float32 |x| exceeds the dtype's range     inf, then NaN downstream
=============  =====================================================  ============================

No rule blames a long ``sum``/``mean``/``cumsum``: torch accumulates those in float32 for float16
and bfloat16 inputs (CPU and CUDA), so a sum of 8192 bfloat16 ones is 8192; only its result is
rounded, which is a cancellation's business when something subtracts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

from layerlab.mixed.dtypes import FP16_MAX
from layerlab.mixed.runs import OpSeen

EXP_OPS = {"softmax", "F.softmax", "log_softmax", "F.log_softmax", "exp", "exp2", "logsumexp", "softmin", "F.softmin"}
SQUARE_OPS = {"var", "std", "var_mean", "std_mean", "pow", "square", "norm", "linalg_vector_norm", "vector_norm",
              "F.normalize", "rsqrt", "__pow__"}
CANCEL_OPS = {"sub", "__sub__", "__rsub__", "subtract", "add", "__add__", "__radd__", "__iadd__", "__isub__"}
MUL_OPS = {"mul", "__mul__", "multiply"}
EXP_MODULES = {"Softmax", "LogSoftmax", "Softmin", "Softmax2d"}
NORM_MODULES = {"LayerNorm", "GroupNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
                "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm"}
#: a sum or difference this many times smaller (float32 max |x|) than an operand has cancelled
CANCELLED = 16.0
LOW = {"float16", "bfloat16"}


@dataclass
class Cause:
    """``what``: exp | variance | cancellation | overflow; ``text``: the sentence; ``fix``; ``source``: ``file:line``."""

    what: str
    text: str
    fix: str
    source: Optional[str] = None


def _keep_fp32(device_type: str, op: str) -> str:
    return (f"keep {op} in float32: run it inside `with torch.autocast(\"{device_type}\", enabled=False):` "
            "on x.float() (cast back with .to(x.dtype) if the next op needs it)")


def _code(op: OpSeen) -> str:
    """`` (`var = x.pow(2).mean(-1)`)``: the source line without its comment, or nothing."""
    code = (op.record.code or "").split("  #")[0].split(" # ")[0].strip()
    return f" (`{' '.join(code.split())}`)" if code else ""


def _square(op: OpSeen) -> bool:
    """``x * x`` (both operands the same tensor: same producer, same shape)."""
    ins = op.record.inputs
    return (op.record.op in MUL_OPS and len(ins) == 2 and ins[0].shape == ins[1].shape
            and (ins[0].from_op, ins[0].from_call) == (ins[1].from_op, ins[1].from_call)
            and (ins[0].from_op is not None or ins[0].from_call is not None))


def _cancelled(op: OpSeen, amax: dict) -> Optional[float]:
    """How many times larger (float32 max |x|) an operand made by this call's own ops is than this
    add/sub's result, or ``None`` (not an add/sub, or magnitudes unknown). ``amax``: op index in
    this run → the float32 run's max |output| of the same op."""
    if op.record.op not in CANCEL_OPS or len(op.record.inputs) != 2:
        return None
    out = amax.get(op.record.index)
    ins = [amax.get(i.from_op) for i in op.record.inputs if i.from_op is not None]
    ins = [a for a in ins if a is not None and math.isfinite(a)]
    if out is None or not ins or not math.isfinite(out):
        return None
    return max(ins) / out if out > 0 else math.inf


def float32_amax(ops: List[OpSeen], ref_ops: List[OpSeen]) -> dict:
    """Op index in the half run → the float32 run's max |output| of the same op (the call's ops
    pair up one by one when both runs ran the same ops; else nothing is known)."""
    if len(ops) != len(ref_ops) or any(a.record.op != b.record.op for a, b in zip(ops, ref_ops)):
        return {}
    return {a.record.index: b.amax for a, b in zip(ops, ref_ops) if b.amax is not None}


def _low(op: OpSeen) -> bool:
    return bool(op.record.out_dtypes) and op.record.out_dtypes[0] in LOW


def overflow(class_name: str, amax: Optional[float], ref_ops: List[OpSeen], dtype: str,
             device_type: str) -> Optional[Cause]:
    """The op (or the module's output) whose float32 magnitude is beyond float16's range."""
    if dtype != "float16":
        return None
    big = [op for op in ref_ops if op.amax is not None and op.amax > FP16_MAX]
    if big:
        op = big[0]
        code = _code(op)
        return Cause("overflow", f"{op.record.op}{code} reaches |x| = {op.amax:.3g} in float32, above float16's largest "
                                 f"value {FP16_MAX:g}: it is inf in float16", _overflow_fix(device_type, op.record.op),
                     op.record.source)
    if amax is not None and amax > FP16_MAX:
        return Cause("overflow", f"its output reaches |x| = {amax:.3g} in float32, above float16's largest value "
                                 f"{FP16_MAX:g}", _overflow_fix(device_type, class_name))
    return None


def _overflow_fix(device_type: str, op: str) -> str:
    return (f"use bfloat16 (float32's range, 3.4e38), or {_keep_fp32(device_type, op)}, or scale the "
            "activation down (a smaller init, a normalisation before it)")


def explain(class_name: str, ops: List[OpSeen], dtype: str, device_type: str, library: bool,
            ref_ops: Optional[List[OpSeen]] = None) -> Optional[Cause]:
    """The first op of the call, in the order it ran, that a rule of the table above covers
    (``ref_ops``: the same call's ops in the float32 run, for their magnitudes)."""
    amax = float32_amax(ops, ref_ops or [])
    for op in ops:
        if not _low(op):
            continue
        name, src, in_dtype = op.record.op, op.record.source, op.record.out_dtypes[0]
        code = _code(op)
        if name in EXP_OPS:
            return Cause("exp", f"{name} runs in {in_dtype}{code}: exponentials turn the rounding of large inputs "
                                "into large relative errors", _keep_fp32(device_type, name), src)
        if name in SQUARE_OPS or _square(op):
            label = "x * x" if name in MUL_OPS else name
            return Cause("variance", f"{label} runs in {in_dtype}{code}: a sum of squares / variance cancels "
                                     "(E[x²] − E[x]²), leaving mostly rounding",
                         _keep_fp32(device_type, label) + "; normalisations written by hand: compute the "
                         "statistics on x.float() as Hugging Face's LlamaRMSNorm does", src)
        ratio = _cancelled(op, amax)
        if ratio is not None and ratio >= CANCELLED:
            return Cause("cancellation", f"{name} runs in {in_dtype}{code}: its result is {ratio:.3g}× smaller than "
                                         f"an operand, and both operands were rounded to {in_dtype} at their own "
                                         "magnitude, so the difference keeps few correct bits",
                         "the rounding happened where the operands were made: build them and subtract in "
                         f"float32 (those lines inside `with torch.autocast(\"{device_type}\", enabled=False):` on "
                         ".float() inputs), or remove the large common offset earlier", src)
    if library and class_name in EXP_MODULES:
        return Cause("exp", f"nn.{class_name} runs in {dtype}: exponentials turn the rounding of large inputs "
                            "into large relative errors", _keep_fp32(device_type, f"nn.{class_name}"))
    if library and class_name in NORM_MODULES:
        return Cause("variance", f"nn.{class_name} takes its statistics of a {dtype} input whose mean is large "
                                 "next to its spread (the variance cancels)",
                     f"feed it a float32 input ({_keep_fp32(device_type, 'the norm')}), or remove the large "
                     "offset before it")
    return None


def unexplained_fix(device_type: str) -> str:
    return ("to confirm, run this module in float32: wrap its forward in "
            f"`torch.autocast(\"{device_type}\", enabled=False)` and cast its inputs with .float()")


def underflow_fix(dtype: str) -> str:
    return ("scale the loss with torch.amp.GradScaler (precision-check --grad-scaler shows the effect), "
            "or train in bfloat16 (float32's exponent range)" if dtype == "float16" else
            "keep this gradient's computation in float32")
