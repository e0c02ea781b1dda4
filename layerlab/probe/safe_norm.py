"""L2 norms and sums that neither underflow nor overflow: the one place every reported norm comes from.

A sum of squares in float32 loses a value below about 1e-19 (its square is under float32's smallest
normal number, 1.2e-38) and drops one below about 1e-23 entirely (its square rounds to 0), so a
gradient of 1e-24 in every element had a norm of exactly 0 and was reported as "exactly zero"; and
it overflows from about 1.8e19 (a square above 3.4e38), so a finite tensor got ``std = inf``. The
same happens in float16/bfloat16 (accumulated in float32) and, at 1e-154 / 1e154, in float64.

The fast kernels (``dot``, ``vector_norm``, ``_foreach_norm``) stay the common path: their result
is exact enough unless it is 0, ``inf``, or so small that its square was subnormal in the
accumulator. Only such a result — rare, and cheap to recognise once the number is read — is
recomputed as ``m · ‖x / m‖`` with ``m = max |x|``, in float64: exact to float64 rounding for any
finite tensor of any floating dtype, 0 exactly when every element is ``== 0``, ``inf`` only when an
element is ``±inf``, NaN when one is NaN. Where reading a number would stall a device stream,
:func:`deferred_norm` takes the scaled norm on the device instead (one extra elementwise pass, no
read).
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch

__all__ = ["trusted", "exact_norm", "checked_norm", "host_norm", "host_norms", "deferred_norm",
           "exact_sum", "accumulator", "checked_tensor", "checked_tensors", "std_from_norm"]

_HALF = (torch.float16, torch.bfloat16)


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype a norm of ``dtype`` values is accumulated in (float32 for the half types)."""
    return torch.float32 if dtype in _HALF else dtype


def _smallest_trusted(dtype: torch.dtype) -> float:
    """Below this norm its square was subnormal in ``dtype``: digits were lost, or all of them."""
    return math.sqrt(torch.finfo(dtype).tiny)


_SMALLEST = {d: _smallest_trusted(d) for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}


def trusted(value: float, acc: torch.dtype) -> bool:
    """Whether a fast norm ``value`` accumulated in ``acc`` can be kept as it is.

    NaN is trusted (a NaN element gives NaN either way); 0, ``inf`` and values whose square was
    subnormal are not (an underflow or overflow may have made them)."""
    if value != value:
        return True
    return _SMALLEST.get(acc, _SMALLEST[torch.float32]) <= value < math.inf


def _as_real(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    if x.is_complex():
        return x.abs()
    return x if x.is_floating_point() else x.double()


def exact_norm(x: torch.Tensor) -> float:
    """``‖x‖₂`` as ``m · ‖x / m‖`` in float64 with ``m = max |x|``: no underflow, no overflow.

    0.0 exactly when every element is ``== 0`` (or ``x`` is empty); ``inf`` when an element is
    ``±inf``; NaN when one is NaN. Costs a float64 copy of ``x``: only for the rare norm the fast
    kernel may have got wrong (see :func:`trusted`)."""
    if x.numel() == 0:
        return 0.0
    xd = _as_real(x).to(torch.float64)
    m = float(xd.abs().amax())  # NaN propagates
    if m == 0.0 or not math.isfinite(m):
        return m
    return m * float(torch.linalg.vector_norm(xd / m))


def checked_norm(x: torch.Tensor, value: float, acc: Optional[torch.dtype] = None) -> float:
    """``value`` (a fast norm of ``x`` accumulated in ``acc``, default: ``x``'s own accumulator) if it
    can be trusted, else :func:`exact_norm` of ``x``."""
    if acc is None:
        acc = accumulator(_as_real(x).dtype)
    return value if trusted(value, acc) else exact_norm(x)


def host_norm(x: torch.Tensor) -> float:
    """``‖x‖₂`` read on the host: the fast kernel, recomputed when it may have under/overflowed."""
    if x.numel() == 0:
        return 0.0
    real = _as_real(x)
    acc = accumulator(real.dtype)
    return checked_norm(real, float(torch.linalg.vector_norm(real, dtype=acc if acc != real.dtype else None)), acc)


def host_norms(tensors: List[torch.Tensor]) -> List[float]:
    """:func:`host_norm` of many tensors: one fused ``_foreach_norm`` (and one read) for all, then
    only the untrusted ones recomputed."""
    if not tensors:
        return []
    reals = [_as_real(t) for t in tensors]
    fused = [i for i, t in enumerate(reals) if t.numel() and t.layout == torch.strided]
    values: List[Optional[float]] = [None] * len(reals)
    if fused:
        with torch.no_grad():
            got = torch.stack([n.double() for n in torch._foreach_norm([reals[i] for i in fused])]).cpu().tolist()
        for i, v in zip(fused, got):
            values[i] = v
    for i, t in enumerate(reals):
        if values[i] is None or not trusted(values[i], t.dtype):  # _foreach_norm returns t's dtype
            values[i] = exact_norm(t)
    return values


def deferred_norm(x: torch.Tensor, absmax: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``‖x‖₂`` as a 0-d float64 tensor on ``x``'s device, nothing read: ``m · ‖x / m‖`` with ``m = max |x|``
    (``absmax`` if the caller has it) — the scaled form always, as whether the fast one under- or
    overflowed cannot be known without reading it. Squares of values in [-1, 1] cannot overflow,
    and an element small enough to underflow there is below 1e-19 of the largest (it does not
    show in the norm's digits)."""
    real = _as_real(x)
    acc = accumulator(real.dtype)
    m = real.abs().amax() if absmax is None else absmax.to(real.dtype)
    scale = torch.where((m > 0) & torch.isfinite(m), m, torch.ones_like(m))
    scaled = torch.linalg.vector_norm(real.to(acc) / scale.to(acc))  # divided in acc: bfloat16 would round
    return scaled.double() * scale.double()  # float64: ‖x‖ of finite float32 values can pass float32's max


def exact_sum(x: torch.Tensor) -> float:
    """The sum of a finite ``x`` in float64 (a float32 sum of finite values can overflow to inf)."""
    return float(_as_real(x).sum(dtype=torch.float64))


def checked_tensor(t: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """A CPU ``norm`` tensor of ``t`` as it is if it can be trusted, else the exact one as a float64
    tensor; reading it on CPU costs nothing."""
    value = norm.item()
    if trusted(value, norm.dtype):
        return norm
    return torch.tensor(exact_norm(t), dtype=torch.float64)


def checked_tensors(tensors: List[torch.Tensor], norms) -> List[torch.Tensor]:
    """:func:`checked_tensor` of many CPU norms, read with one conversion."""
    values = torch.stack(list(norms)).tolist()
    return [n if trusted(v, n.dtype) else torch.tensor(exact_norm(t), dtype=torch.float64)
            for t, n, v in zip(tensors, norms, values)]


def std_from_norm(norm: float, mean: float, m: int, scale: float) -> float:
    """Population std from ``‖x‖`` and the mean, both divided by ``max |x|`` first: ``‖x‖²`` of
    float64 values beyond 1e154 (or under 1e-154) would overflow (underflow) in the formula."""
    if not (0.0 < scale < math.inf):
        return math.sqrt(max(norm * norm / m - mean * mean, 0.0))
    n, u = norm / scale, mean / scale
    return scale * math.sqrt(max(n * n / m - u * u, 0.0))
