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
log of 0       log(sigmoid(z)), log(softmax(x)), log(nn.Sigmoid(…))   the probability underflows:
                                                                      σ(−20) = 2e-9 is 0 in fp16,
                                                                      log(0) = −inf
log rounded    the same, where float32's |log p| shows p stayed a     log p ≈ p − 1 near p = 1: the
               normal number (and the output is finite)               rounding of p is large next
                                                                      to it (not an underflow)
tiny squares   var, pow, x * x … whose float32 values are all below   they are subnormal (few bits)
               the dtype's smallest normal (fp16: 6.1e-5)             or 0: a variance with no eps
                                                                      divides by ~0
variance       var, std, pow, square, norm, x * x, nn.LayerNorm …     E[x²] − E[x]² cancels: the
                                                                      rounding of E[x²] is left
cancellation   sub/add whose float32 result is ≥ 16× smaller than     both operands were rounded at
               an operand (``h - h.mean()`` with a large mean)        their own magnitude; the
                                                                      difference keeps few bits
large value    any op whose float32 |x| exceeds the dtype's range     inf, then NaN downstream
=============  =====================================================  ============================

Near misses these rules step aside for (tests/precision_check/test_near_misses.py): an exp/softmax
whose input is known to stay below |x| = 4 (its own rounding adds about an eps: the error came in
with its input); a sub whose float32 result is exactly 0 (``h - h.detach()``: nothing cancels); an
eps that is 0 in the dtype where the output is finite (it only matters for a 0/0); an overflow
whose every use is a two-sided clamp (clamp(inf) is clamp(1e5)).

A call whose *input* already lost its spread (a large offset added before it) is
:mod:`layerlab.mixed.offsets`' business: the rules here only read the call's own ops.

No rule blames a long ``sum``/``mean``/``cumsum``: torch accumulates those in float32 for float16
and bfloat16 inputs (CPU and CUDA), so a sum of 8192 bfloat16 ones is 8192; only its result is
rounded, which is a cancellation's business when something subtracts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from layerlab.mixed.dtypes import FP16_MAX, HALF
from layerlab.mixed.runs import OpSeen

EXP_OPS = {"softmax", "F.softmax", "log_softmax", "F.log_softmax", "exp", "exp2", "logsumexp", "softmin", "F.softmin"}
SQUARE_OPS = {"var", "std", "var_mean", "std_mean", "pow", "square", "norm", "linalg_vector_norm", "vector_norm",
              "F.normalize", "rsqrt", "__pow__"}
CANCEL_OPS = {"sub", "__sub__", "__rsub__", "subtract", "add", "__add__", "__radd__", "__iadd__", "__isub__"}
MUL_OPS = {"mul", "__mul__", "multiply"}
LOG_OPS = {"log", "log2", "log10"}
#: what the log of each producer's output should have been (computed without forming the probability)
LOG_FIXES = {
    "sigmoid": "F.logsigmoid(z) (log σ(z) = −softplus(−z): no probability is formed, so nothing rounds to 0)",
    "F.sigmoid": "F.logsigmoid(z) (log σ(z) = −softplus(−z): no probability is formed, so nothing rounds to 0)",
    "softmax": "F.log_softmax(x, dim) (x − logsumexp(x): no probability is formed, so nothing rounds to 0)",
    "F.softmax": "F.log_softmax(x, dim) (x − logsumexp(x): no probability is formed, so nothing rounds to 0)",
    "exp": "the exponent itself (log(exp(x)) is x), or torch.logsumexp for a log of a sum of exps",
}
#: modules whose output is a probability: their op-level counterpart in LOG_FIXES
LOG_MODULES = {"Sigmoid": "sigmoid", "Softmax": "softmax"}
EXP_MODULES = {"Softmax", "LogSoftmax", "Softmin", "Softmax2d"}
NORM_MODULES = {"LayerNorm", "GroupNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
                "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm"}
#: a sum or difference this many times smaller (float32 max |x|) than an operand has cancelled
CANCELLED = 16.0
LOW = {"float16", "bfloat16"}


@dataclass
class Cause:
    """``what``: exp | sensitive | log-underflow | log-rounded | tiny-squares | eps-underflow | variance | cancellation |
    swamped | absorbed | overflow (:mod:`~layerlab.mixed.magnitude` has sensitive, eps-underflow, absorbed);
    ``text``: the sentence; ``fix``; ``source``: ``file:line``."""

    what: str
    text: str
    fix: str
    source: Optional[str] = None
    operand_call: Optional[int] = None  # a cancellation's large operand made by this module call (its index)


def keep_fp32(device_type: str, op: str) -> str:
    return (f"keep {op} in float32: run it inside `with torch.autocast(\"{device_type}\", enabled=False):` "
            "on x.float() (cast back with .to(x.dtype) if the next op needs it)")


def code(op: OpSeen) -> str:
    """`` (`var = x.pow(2).mean(-1)`)``: the source line without its comment, or nothing."""
    code = (op.record.code or "").split("  #")[0].split(" # ")[0].strip()
    return f" (`{' '.join(code.split())}`)" if code else ""


def _square(op: OpSeen) -> bool:
    """``x * x`` (both operands the same tensor: same producer, same shape)."""
    ins = op.record.inputs
    return (op.record.op in MUL_OPS and len(ins) == 2 and ins[0].shape == ins[1].shape
            and (ins[0].from_op, ins[0].from_call) == (ins[1].from_op, ins[1].from_call)
            and (ins[0].from_op is not None or ins[0].from_call is not None))


def _cancelled(op: OpSeen, amax: dict,
               sizes: Optional["Sizes"] = None) -> Optional[Tuple[float, Optional[int]]]:  # noqa: F821
    """How many times larger (float32 max |x|) an operand is than this add/sub's result, and the
    module call that made that operand (``None``: an op of this call or a number), or ``None``
    (not an add/sub of two operands, or magnitudes unknown). Operands: this call's own ops
    (``amax``: op index in this run → the float32 run's max |output| of the same op), other
    calls' ops and module calls' outputs (``sizes``: :class:`~layerlab.mixed.magnitude.Sizes`)
    and Python numbers (``1 - cos``)."""
    from layerlab.mixed.magnitude import Sizes, operand_sizes, scalars

    if op.record.op not in CANCEL_OPS or len(op.record.inputs) + len(scalars(op)) != 2:
        return None
    out = amax.get(op.record.index)
    ins = [(a, c) for a, c in operand_sizes(op, amax, sizes or Sizes()) if math.isfinite(a)]
    if out is None or not ins or not math.isfinite(out):
        return None
    if out == 0.0:  # exactly 0 in float32 (``h - h.detach()``): equal operands, 0 in any dtype too
        return None
    size, maker = max(ins, key=lambda p: p[0])
    return size / out, maker


def _squares_behind(op: OpSeen, made: Dict[int, OpSeen]) -> Optional[OpSeen]:
    """The square op (pow, x * x, …) an operand of this add/sub was made from, through means and
    sums: ``x.pow(2).mean() - m * m`` is a variance written as E[x²] − E[x]²."""
    for operand in op.record.inputs:
        index = operand.from_op
        while index is not None and index in made:
            maker = made[index]
            if maker.record.op in SQUARE_OPS or _square(maker):
                return maker
            if maker.record.op not in ("mean", "sum", "nanmean", "nansum") or not maker.record.inputs:
                break
            index = maker.record.inputs[0].from_op
    return None


def tiny(dtype: str) -> float:
    """The dtype's smallest normal number: below it, a value is subnormal (fewer bits) or 0."""
    return float(torch.finfo(HALF[dtype]).smallest_normal)


def flushed(dtype: str) -> float:
    """Below this a value rounds to 0 in the dtype: half its smallest subnormal."""
    info = torch.finfo(HALF[dtype])
    return float(info.smallest_normal) * float(info.eps) / 2


def _log_near_one(op: OpSeen, p_name: str, where: str, half: str, deepest: float) -> Cause:
    """A log of a probability that stayed a normal number (float32 ``|log p| ≤ deepest``): nothing
    underflowed; near p = 1, log p ≈ p − 1 is small and the rounding of p (its step there) is large
    next to it."""
    return Cause("log-rounded",
                 f"{op.record.op}{code(op)} takes the log of {p_name}'s output{where} in {half}: its smallest value "
                 f"is {math.exp(-deepest):.4g} in float32, so nothing underflows; where p is near 1, log p ≈ p − 1 is "
                 f"small and {half}'s rounding of p (a step of {float(torch.finfo(HALF[half]).eps) / 2:.2g} below 1) "
                 "is a large part of it",
                 f"replace {op.record.op}({p_name}(…)) with {LOG_FIXES[p_name]}", op.record.source)


def log_of_underflow(ops: List[OpSeen], non_finite: bool,
                     modules: Optional[Dict[int, str]] = None, amax: Optional[dict] = None) -> Optional[Cause]:
    """A low-precision ``log`` of the output of a sigmoid/softmax/exp (an op of the same call, or
    an ``nn.Sigmoid``/``nn.Softmax`` call: ``modules`` maps a call's index to its class): the
    probability underflows to 0 (``log(0) = -inf``) where the dtype's range ends."""
    made = {op.record.index: op for op in ops}
    for op in ops:
        if op.record.op not in LOG_OPS or not low(op) or not op.record.inputs:
            continue
        operand = op.record.inputs[0]
        producer = made.get(operand.from_op)
        if producer is not None and producer.record.op in LOG_FIXES and low(producer):
            p_name = producer.record.op
            where = "" if producer.record.source in (None, op.record.source) else f" at {producer.record.source}"
        elif operand.from_op is None and (modules or {}).get(operand.from_call) in LOG_MODULES:
            p_name, where = LOG_MODULES[modules[operand.from_call]], f" (nn.{modules[operand.from_call]})"
        else:
            continue
        half = op.record.out_dtypes[0]
        deepest = (amax or {}).get(op.record.index)  # float32 max |log p|: the smallest p is exp(−deepest)
        if not non_finite and deepest is not None and deepest < -math.log(tiny(half)):
            return _log_near_one(op, p_name, where, half, deepest)
        outcome = ("in this run some of it rounded to 0 and log(0) = -inf" if non_finite else
                   "small ones keep few bits (subnormal) or round to 0, where log gives -inf")
        text = (f"{op.record.op}{code(op)} takes the log of {p_name}'s output{where}, which underflows in {half}: "
                f"values below {flushed(half):.2g} round to 0 and values below {tiny(half):.2g} are subnormal; "
                f"{outcome}")
        return Cause("log-underflow", text, f"replace {op.record.op}({p_name}(…)) with {LOG_FIXES[p_name]}",
                     op.record.source)
    return None


def _tiny_squares(op: OpSeen, label: str, amax: dict, device_type: str, non_finite: bool) -> Optional[Cause]:
    """Squares (or a variance) whose float32 values are all below the dtype's smallest normal:
    they are subnormal or 0 in it, so a normalisation without eps divides by ~0."""
    half = op.record.out_dtypes[0]
    biggest = amax.get(op.record.index)
    if biggest is None or not math.isfinite(biggest) or not 0.0 < biggest < tiny(half):
        return None
    return Cause("tiny-squares",
                 f"{label} runs in {half}{code(op)}: its values are at most {biggest:.2g} in float32, below {half}'s "
                 f"smallest normal {tiny(half):.2g}, so they are subnormal (few bits) or flushed to 0 (below "
                 f"{flushed(half):.2g}): a statistic of them is mostly rounding or 0"
                 + (", and dividing by its square root gives inf/NaN" if non_finite else "")
                 + " — the squares are too small, not a cancellation",
                 "add an eps larger than them where the statistic is divided by, as nn.LayerNorm does "
                 "(`torch.sqrt(var + 1e-5)`, or use nn.LayerNorm / F.layer_norm), and/or compute the statistics in "
                 f"float32 ({keep_fp32(device_type, label)})", op.record.source)


def float32_amax(ops: List[OpSeen], ref_ops: List[OpSeen]) -> dict:
    """Op index in the half run → the float32 run's max |output| of the same op (the call's ops
    pair up one by one when both runs ran the same ops; else nothing is known)."""
    if len(ops) != len(ref_ops) or any(a.record.op != b.record.op for a, b in zip(ops, ref_ops)):
        return {}
    return {a.record.index: b.amax for a, b in zip(ops, ref_ops) if b.amax is not None}


def low(op: OpSeen) -> bool:
    return bool(op.record.out_dtypes) and op.record.out_dtypes[0] in LOW


def overflow(class_name: str, amax: Optional[float], ref_ops: List[OpSeen], dtype: str,
             device_type: str) -> Optional[Cause]:
    """The op (or the module's output) whose float32 magnitude is beyond float16's range."""
    if dtype != "float16":
        return None
    big = [op for op in ref_ops if op.amax is not None and op.amax > FP16_MAX and not _clamped(op, ref_ops)]
    if big:
        op = big[0]
        line = code(op)
        return Cause("overflow", f"{op.record.op}{line} reaches |x| = {op.amax:.3g} in float32, above float16's "
                                 f"largest value {FP16_MAX:g}: it is inf in float16",
                     _rewrite(op, ref_ops) + _overflow_fix(device_type, op.record.op), op.record.source)
    if amax is not None and amax > FP16_MAX:
        return Cause("overflow", f"its output reaches |x| = {amax:.3g} in float32, above float16's largest value "
                                 f"{FP16_MAX:g}", _overflow_fix(device_type, class_name))
    return None


#: ops that bound their input: clamp(±inf, lo, hi) is clamp(±1e5, lo, hi), an overflow there is harmless
BOUND_OPS = {"clamp", "clip", "clamp_", "clip_", "F.hardtanh", "hardtanh"}


def _bound(op: OpSeen) -> bool:
    """A clamp with both bounds, finite numbers within float16's range."""
    args = op.record.args
    lo, hi = args.get("min", args.get("1")), args.get("max", args.get("2"))
    if op.record.op in ("F.hardtanh", "hardtanh"):
        lo, hi = args.get("min_val", args.get("1", -1.0)), args.get("max_val", args.get("2", 1.0))
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= FP16_MAX for v in (lo, hi))


def _clamped(op: OpSeen, ops: List[OpSeen]) -> bool:
    """Every use of ``op``'s output in this call is a two-sided clamp: its inf is clamped to the
    same bound as float32's large value, so the overflow changes nothing."""
    used = [o for o in ops if any(i.from_op == op.record.index for i in o.record.inputs)]
    return bool(used) and all(o.record.op in BOUND_OPS and _bound(o) for o in used)


#: products whose result is often scaled down right after (attention's ``q @ k.T / √d``)
PRODUCT_OPS = {"matmul", "__matmul__", "bmm", "mm", "einsum", "baddbmm"}
SCALED_BY = {"div", "__truediv__", "true_divide", "mul", "__mul__", "__rmul__"}


def _rewrite(op: OpSeen, ops: List[OpSeen]) -> str:
    """A rewrite that never forms the large value, where the code has a known one: an exp whose
    large values a max subtraction (softmax, logsumexp, softplus) avoids; a product scaled down
    only after it was formed."""
    name = op.record.op
    if name in ("exp", "exp2"):
        return ("never form exp of a large value: subtract the max first (`x - x.amax(dim, keepdim=True)`) — "
                "torch.softmax, torch.logsumexp, F.softplus (for log(1 + exp(z))) and torch.logaddexp do — ; ")
    if name in PRODUCT_OPS:
        used = [o for o in ops if any(i.from_op == op.record.index for i in o.record.inputs)]
        if used and used[0].record.op in SCALED_BY and len(used[0].record.inputs) == 1:
            return ("scale an operand before the product instead of the product after it (`(q * d ** -0.5) @ "
                    "k.transpose(-2, -1)`, not `(q @ k.transpose(-2, -1)) / d ** 0.5`), or use "
                    "F.scaled_dot_product_attention, which does; ")
    return ""


def _overflow_fix(device_type: str, op: str) -> str:
    return (f"use bfloat16 (float32's range, 3.4e38), or {keep_fp32(device_type, op)}, or scale the "
            "activation down (a smaller init, a normalisation before it)")


def explain(class_name: str, ops: List[OpSeen], dtype: str, device_type: str, library: bool,
            ref_ops: Optional[List[OpSeen]] = None, non_finite: bool = False,
            modules: Optional[Dict[int, str]] = None, sizes: Optional["Sizes"] = None) -> Optional[Cause]:  # noqa: F821
    """The first op of the call, in the order it ran, that a rule of the table above covers
    (``ref_ops``: the same call's ops in the float32 run, for their magnitudes; ``non_finite``:
    the call's output is inf/NaN in this run; ``modules``: call index → class, for the producer of
    a log's input; ``sizes``: float32 magnitudes of what other calls made,
    :class:`~layerlab.mixed.magnitude.Sizes`). A log of an underflowing probability comes first:
    the exp/softmax before it is then not the cause, the log of its zeros is."""
    from layerlab.mixed import magnitude

    amax = float32_amax(ops, ref_ops or [])
    sizes = sizes or magnitude.Sizes()
    callers = sizes.callers
    found = log_of_underflow(ops, non_finite, modules, amax)
    if found is not None:
        return found
    made = {op.record.index: op for op in ops}
    # the add/subs that cancel (result ≥ CANCELLED× smaller than an operand): a square op is only
    # blamed as a variance when one of them subtracts what it made (E[x²] − E[x]²); a pow or norm
    # alone is as precise as its output's rounding (torch sums half precision in float32)
    cancelling = []
    for op in ops:
        found = _cancelled(op, amax, sizes) if low(op) else None
        if found is not None and found[0] >= CANCELLED:
            cancelling.append((op, found))
    for op in ops:
        if not low(op):
            continue
        name, src, in_dtype = op.record.op, op.record.source, op.record.out_dtypes[0]
        line = code(op)
        found = (magnitude.eps_underflow(op, device_type) if non_finite else None) or \
            magnitude.sensitive(op, made, amax, sizes, device_type)
        if found is not None:
            return found
        if name in EXP_OPS and not magnitude.small_exponent(op, amax, sizes):
            return Cause("exp", f"{name} runs in {in_dtype}{line}: exponentials turn the rounding of large inputs "
                                "into large relative errors", keep_fp32(device_type, name), src)
        if name in SQUARE_OPS or _square(op):
            label = "x * x" if name in MUL_OPS else name
            small = _tiny_squares(op, label, amax, device_type, non_finite)
            if small is not None:
                return small
            if any(_squares_behind(c, made) is op for c, _ in cancelling):
                return Cause("variance", f"{label} runs in {in_dtype}{line}: a sum of squares / variance cancels "
                                         "(E[x²] − E[x]²), leaving mostly rounding",
                             keep_fp32(device_type, label) + "; normalisations written by hand: compute the "
                             "statistics on x.float() as Hugging Face's LlamaRMSNorm does", src)
        hit = next((f for c, f in cancelling if c is op), None)
        if hit is not None:
            ratio, maker = hit
            made_by = f" (the large one made by {callers[maker]}, rounded there)" if maker in callers else ""
            return Cause("cancellation", f"{name} runs in {in_dtype}{line}: its result is {ratio:.3g}× smaller than "
                                         f"an operand{made_by}, and both operands were rounded to {in_dtype} at "
                                         "their own magnitude, so the difference keeps few correct bits",
                         "the rounding happened where the operands were made: build them and subtract in "
                         f"float32 (those lines inside `with torch.autocast(\"{device_type}\", enabled=False):` on "
                         ".float() inputs), or remove the large common offset earlier", src, operand_call=maker)
    if library and class_name in EXP_MODULES:
        return Cause("exp", f"nn.{class_name} runs in {dtype}: exponentials turn the rounding of large inputs "
                            "into large relative errors", keep_fp32(device_type, f"nn.{class_name}"))
    if library and class_name in NORM_MODULES:
        return Cause("variance", f"nn.{class_name} takes its statistics of a {dtype} input whose mean is large "
                                 "next to its spread (the variance cancels)",
                     f"feed it a float32 input ({keep_fp32(device_type, 'the norm')}), or remove the large "
                     "offset before it")
    return None


def unexplained_fix(device_type: str) -> str:
    return ("to confirm, run this module in float32: wrap its forward in "
            f"`torch.autocast(\"{device_type}\", enabled=False)` and cast its inputs with .float()")


def underflow_fix(dtype: str) -> str:
    return ("scale the loss with torch.amp.GradScaler (precision-check --grad-scaler shows the effect), "
            "or train in bfloat16 (float32's exponent range)" if dtype == "float16" else
            "keep this gradient's computation in float32")
