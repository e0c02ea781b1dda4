"""Cheap tensor statistics: read at once on CPU, kept as small tensors on accelerators.

The hot path (once per distinct module output) is a few fast reductions over the tensor — ``sum``,
the L2 norm, ``aminmax`` and a count of non-zeros (see :func:`count_nonzero`). On CPU reading a
value costs nothing, so the results are read as Python numbers right away: no small tensors to
stack and convert later, and some passes are skipped by what the first ones show (see
:func:`_moments_now`). On other devices nothing is read: the results stay on the tensor's device
until :func:`finish_stats` converts them all with one transfer.

mean and std come from the sum and the L2 norm (``std² = ‖x‖²/n − mean²``, population std): on
CPU these two passes are several times faster than ``torch.std_mean``'s Welford pass, and exact
enough for a diagnostic (digits are lost only when ``|mean| ≫ std``).

NaN/Inf: any NaN or Inf makes the sum non-finite. On CPU reading that one number costs nothing,
so exact counts, and statistics over the finite elements, are computed only when the sum is not
finite. On other devices reading it would stall the stream, so the two counts are computed for
every tensor instead and the statistics then cover all elements.

A nested tensor (``torch.nested``) has no single shape and few reductions: its statistics and
gradient norm are those of its components' elements, flattened into one tensor (padding, which it
does not hold, is never counted).
"""

from __future__ import annotations

import math
import struct
from typing import List, Optional

import numpy as np
import torch

from layerlab.probe.report import GradStats, Stats
from layerlab.probe.safe_norm import (checked_norm, checked_tensor, checked_tensors, deferred_norm, exact_sum,
                                      std_from_norm)

_HALF = (torch.float16, torch.bfloat16)
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}
_NEG_ZERO = {bits: torch.iinfo(bits).min for bits in set(_BITS.values())}  # the bits of -0.0


def _may_read(x: torch.Tensor) -> bool:
    """Whether reading a value of ``x`` on the host is free (CPU) rather than a device sync."""
    return x.device.type == "cpu"


def count_nonzero(x: torch.Tensor, may_read: Optional[bool] = None) -> torch.Tensor:
    """Elements that are not ±0, as a 0-d tensor.

    ``torch.count_nonzero`` on floats takes a slow path on CPU (about 20× a ``sum``); on the
    integer view of the same bits it is much faster, but counts ``-0.0`` (sign bit only, e.g.
    a negative value times a dropout zero) as non-zero. ``-0.0`` is the smallest integer of that
    view, so on CPU one more cheap reduction tells whether any is there; only then are the bits
    shifted left (dropping the sign) and counted again. Off CPU the shifted count is always used.
    """
    bits = _BITS.get(x.dtype)
    if bits is None:
        return torch.count_nonzero(x)
    view = x.view(bits)
    if not (_may_read(x) if may_read is None else may_read):
        return torch.count_nonzero(view << 1)
    if torch.aminmax(view).min.item() == _NEG_ZERO[bits]:  # a -0.0 somewhere
        return torch.count_nonzero(view << 1)
    return torch.tensor(_count_bits(view))


def _count_bits(view: torch.Tensor) -> int:
    """Non-zero elements of an integer view (so ``-0.0`` counts as non-zero), read on the host.

    A CPU tensor is counted by numpy: its SIMD count is about 2× faster per core than torch's
    scalar loop (measured from 4 K to 2 M elements), but runs on one thread. torch splits a large
    count over its intra-op threads: with two it wins from about 2¹⁹ elements (2 M: 265 µs against
    numpy's 368 µs), with three or more always. Below _NUMPY_COUNT_MIN elements the two cost the
    same (the fixed cost per call).
    """
    n = view.numel()
    if view.device.type == "cpu" and n >= _NUMPY_COUNT_MIN:
        threads = torch.get_num_threads()
        if threads == 1 or (threads == 2 and n < _TORCH_COUNT_MIN_TWO_THREADS):
            return int(np.count_nonzero(view.numpy()))
    return int(torch.count_nonzero(view))


_NUMPY_COUNT_MIN = 1 << 10
_TORCH_COUNT_MIN_TWO_THREADS = 1 << 19


_PACK = {torch.float64: ("<q", "<d"), torch.float32: ("<i", "<f"), torch.float16: ("<h", "<e")}


def _from_bits(dtype: torch.dtype, b: int) -> float:
    """The float whose bits, read as a signed integer, are ``b``."""
    if dtype == torch.bfloat16:  # the upper half of a float32
        return struct.unpack("<f", struct.pack("<i", b << 16))[0]
    int_format, float_format = _PACK[dtype]
    return struct.unpack(float_format, struct.pack(int_format, b))[0]


def _as_float(x: torch.Tensor) -> torch.Tensor:
    if x.is_complex():
        return x.abs()
    if not x.is_floating_point():
        return x.double()
    return x


def _norm(x: torch.Tensor, acc) -> torch.Tensor:
    if acc is None and x.is_contiguous() and x.dtype in (torch.float32, torch.float64):
        flat = x.view(-1)
        return torch.dot(flat, flat).sqrt()  # a little faster than vector_norm on CPU
    return torch.linalg.vector_norm(x, dtype=acc)


def _moments(x: torch.Tensor, s: torch.Tensor, acc, may_read: bool) -> tuple:
    """The deferred moments: the norm scaled by max |x| where the fast one may have under- or
    overflowed (see :mod:`layerlab.probe.safe_norm`), and a sum taken
    again in float64 where the fast one overflowed (nothing is read: ``torch.where``)."""
    mn, mx = torch.aminmax(x)
    fast = _norm(x, acc)  # as on the read path, where it can be trusted (the same digits)
    smallest = math.sqrt(torch.finfo(fast.dtype).tiny)
    norm = torch.where((fast >= smallest) & (fast < math.inf) | torch.isnan(fast), fast.double(),
                       deferred_norm(x, torch.maximum(-mn, mx)))
    s = torch.where(torch.isinf(s), x.sum(dtype=torch.float64), s.double())
    return torch.stack([s, norm, mn.double(), mx.double()]), count_nonzero(x, may_read)


def _moments_now(x: torch.Tensor, s: float, acc) -> tuple:
    """:func:`_moments` read at once: ``((sum, ‖x‖₂, min, max), nonzero)`` as Python numbers.

    ``x`` is finite. One ``aminmax`` of the integer view of its bits comes first: where no sign
    bit is set (ReLU outputs, probabilities) integer order is float order, so it is also the float
    min and max, and ``-0.0`` cannot occur; where every sign bit is set, the order is reversed.
    Only a tensor with both signs needs a float pass too, and only for its min (the integer max
    is the float max there): ``amin`` alone is about twice as fast as a float ``aminmax``. The count
    of non-zeros is skipped where the bits show that no element is ±0, and a ``-0.0`` (a negative
    times zero: hard-swish, dropout) is counted without shifting a copy of the bits (see
    :func:`_count_nonzero_signed`). The values are those of the deferred path.
    """
    norm = checked_norm(x, _norm(x, acc).item(), acc or x.dtype)  # recomputed only if it under/overflowed
    bits = _BITS.get(x.dtype)
    if bits is None:  # e.g. float8: the plain reductions
        mn, mx = (v.item() for v in torch.aminmax(x))
        return (s, norm, mn, mx), int(torch.count_nonzero(x))
    view = x.view(bits)
    mn, mx, imin, imax = _extremes(x, view)
    negative_zero = imin == _NEG_ZERO[bits]
    if imin >= 0:  # no sign bit set: min is +0.0 exactly when a zero is there
        nonzero = _count_bits(view) if imin == 0 else x.numel()
    elif imax < 0:  # every sign bit set: the only possible zero is -0.0
        nonzero = _count_nonzero_signed(x, view) if negative_zero else x.numel()
    else:
        nonzero = _count_nonzero_signed(x, view) if negative_zero else _count_bits(view)
    return (s, norm, mn, mx), nonzero


def _extremes(x: torch.Tensor, view: torch.Tensor) -> tuple:
    """``(min, max, imin, imax)`` of a finite ``x`` from ``aminmax`` of its integer ``view``:
    where no sign bit is set integer order is float order; where every one is set it is reversed;
    with both signs only the min needs a float pass (the largest integer is the largest float)."""
    imin, imax = (v.item() for v in torch.aminmax(view))
    if imin >= 0:
        return _from_bits(x.dtype, imin), _from_bits(x.dtype, imax), imin, imax
    if imax < 0:
        return _from_bits(x.dtype, imax), _from_bits(x.dtype, imin), imin, imax
    mn, mx = x.amin().item(), _from_bits(x.dtype, imax)
    if mn == 0 or mx == 0:  # +0.0 and -0.0 tie: which one is reported is aminmax's choice
        mn, mx = (v.item() for v in torch.aminmax(x))  # (as on the deferred path)
    return mn, mx, imin, imax


def abs_max(x: torch.Tensor) -> float:
    """``max |x|``: NaN if any element is NaN, inf if any is ±inf; 0.0 for an empty tensor.

    A float ``aminmax`` is one pass as slow as two integer ones. On CPU ``aminmax`` of the integer
    bits comes first: where no sign bit is set (ReLU outputs, probabilities), or every one is, the
    largest integer is the element of largest magnitude, and one pass says everything (an integer
    beyond the bits of ±inf is a NaN). Only with both signs does ``amin`` (which propagates NaN)
    find the most negative element. Elsewhere, one float ``aminmax``."""
    if x.numel() == 0:
        return 0.0
    bits = _BITS.get(x.dtype)
    if bits is None or x.device.type != "cpu":
        lo, hi = torch.stack(torch.aminmax(x)).tolist()  # one conversion to Python, not four
        return math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi)
    lo, hi = torch.stack(torch.aminmax(x.view(bits))).tolist()
    pos_inf, neg_inf = _INF_BITS[x.dtype]
    if lo >= 0 or hi < 0:  # one sign: the largest integer is the largest magnitude
        inf_bits = pos_inf if lo >= 0 else neg_inf
        if hi > inf_bits:
            return math.nan
        return math.inf if hi == inf_bits else abs(_from_bits(x.dtype, hi))
    if hi > pos_inf:
        return math.nan
    low = x.amin().item()
    if math.isnan(low):
        return math.nan
    return max(-low, math.inf if hi == pos_inf else _from_bits(x.dtype, hi))


def _inf_bits(dtype: torch.dtype) -> tuple:
    """The bits of +inf and -inf in ``dtype``, read as signed integers."""
    pair = torch.tensor([math.inf, -math.inf], dtype=dtype).view(_BITS[dtype]).tolist()
    return pair[0], pair[1]


_INF_BITS = {dtype: _inf_bits(dtype) for dtype in _BITS}


def _count_nonzero_signed(x: torch.Tensor, view: torch.Tensor) -> int:
    """Elements of ``x`` that are not ±0, where a ``-0.0`` is known to be there.

    numpy's float ``== 0`` (true for both zeros) and count of the booleans take two fast passes;
    torch's count of the shifted bits takes a copy and a slow count (about 3× the time).
    """
    if x.dtype in _DOT_DTYPES and x.device.type == "cpu" and torch.get_num_threads() <= 2:
        return x.numel() - int(np.count_nonzero(x.numpy() == 0))
    return int(torch.count_nonzero(view << 1))


def tensor_stats(x: torch.Tensor, may_read: Optional[bool] = None) -> Optional[tuple]:
    """Start the statistics of ``x`` (any dtype); ``None`` for an empty or data-less (meta) tensor.

    Returns a raw record ``(numel, finite_numel, moments, nonzero, bad)``, where ``moments`` is
    ``[sum, ‖x‖₂, min, max]`` over the finite elements and ``bad`` is ``[nan, inf]`` counts or
    ``None`` (none found). ``may_read`` (default: on CPU) allows reading values on the host: they
    are then Python numbers (``moments`` a tuple); without it they are small tensors on the
    tensor's device, and nothing is read until :func:`finish_stats`.
    """
    if x.is_nested:
        x = nested_elements(x)
    n = x.numel()
    if n == 0 or x.is_meta or x.layout != torch.strided:  # sparse layouts: no reductions to read them with
        return None
    x = _as_float(x.detach())
    acc = torch.float32 if x.dtype in _HALF else None
    s = x.sum(dtype=acc)
    may_read = _may_read(x) if may_read is None else may_read
    if not may_read:
        bad = torch.stack([torch.isnan(x).sum(), torch.isinf(x).sum()])
        return (n, n, *_moments(x, s, acc, may_read), bad)
    total = s.item()  # on CPU a plain read: no device to wait for
    if math.isfinite(total):
        return (n, n, *_moments_now(x, total, acc), None)
    bad = (int(torch.isnan(x).sum()), int(torch.isinf(x).sum()))
    if bad == (0, 0):  # finite elements whose sum overflowed
        return (n, n, *_moments_now(x, exact_sum(x), acc), None)
    finite = x[torch.isfinite(x)]
    if finite.numel() == 0:
        return (n, 0, None, None, bad)
    total = finite.sum(dtype=acc).item()
    return (n, finite.numel(), *_moments_now(finite, total if math.isfinite(total) else exact_sum(finite), acc), bad)


def nested_elements(x: torch.Tensor) -> torch.Tensor:
    """Every element of a nested tensor's components, as one flat (ordinary) tensor."""
    parts = [c.detach().reshape(-1) for c in x.unbind()]
    return torch.cat(parts) if parts else x.new_empty(0)


def finish_stats(raws: List[Optional[tuple]]) -> List[Optional[Stats]]:
    """Turn raw records from :func:`tensor_stats` into :class:`Stats`, with one transfer for all
    the ones still on a device (records read at once on CPU are already numbers)."""
    live = [r for r in raws if r is not None and isinstance(r[2], torch.Tensor)]
    moments = iter(torch.stack([r[2].double().cpu() for r in live]).tolist() if live else [])
    nonzeros = iter(torch.stack([r[3].cpu() for r in live]).tolist() if live else [])
    out: List[Optional[Stats]] = []
    for raw in raws:
        if raw is None:
            out.append(None)
            continue
        n, m, vec, nonzero, bad = raw
        if bad is None:
            nan_count, inf_count = 0, 0
        elif isinstance(bad, torch.Tensor):
            nan_count, inf_count = (int(v) for v in bad.tolist())
        else:
            nan_count, inf_count = bad
        if vec is None:
            nan = float("nan")
            out.append(Stats(nan, nan, nan, nan, 0.0, nan_count, inf_count, n))
            continue
        if isinstance(vec, tuple):
            s, norm, mn, mx = vec
        else:
            s, norm, mn, mx = next(moments)
            nonzero = next(nonzeros)
        mean = s / m
        std = std_from_norm(norm, mean, m, max(abs(mn), abs(mx)))
        zeros = (m - int(nonzero)) / n
        out.append(Stats(mean, std, mn, mx, zeros, nan_count, inf_count, n))
    return out


def l2_norm(g: torch.Tensor) -> Optional[torch.Tensor]:
    """The L2 norm of a gradient (or weight) as a 0-d tensor (no sync); NaN if it holds a NaN, Inf for Inf.

    ``None`` for a meta tensor (no data).
    """
    if g.is_meta:
        return None
    g = nested_elements(g) if g.is_nested else g.detach()
    if g.is_complex():
        g = g.abs()
    if g.layout != torch.strided or g.numel() == 0:
        return torch.linalg.vector_norm(g, dtype=torch.float32 if g.dtype in _HALF else None)
    if not _may_read(g):
        return deferred_norm(g)
    return checked_tensor(g, torch.linalg.vector_norm(g, dtype=torch.float32 if g.dtype in _HALF else None))


def grad_norm(g: torch.Tensor) -> Optional[torch.Tensor]:
    """:func:`l2_norm` of a gradient arriving in backward; a CPU float tensor in one piece takes
    ``sqrt(⟨g, g⟩)``: torch's full ``vector_norm`` runs on one thread there, ``dot`` on all of them
    (3× faster on a 2M-element gradient with two), and rounds less (relative error about 4e-6
    against 3e-5 on 2M float32 values). The same NaN, Inf and overflow behaviour.
    """
    if g.device.type == "cpu" and g.dtype in _DOT_DTYPES and not g.is_nested and g.is_contiguous():
        flat = g.detach().view(-1)
        return checked_tensor(flat, torch.dot(flat, flat).sqrt())
    return l2_norm(g)


_DOT_DTYPES = (torch.float32, torch.float64)


def l2_norms(tensors: List[torch.Tensor]) -> List[Optional[torch.Tensor]]:
    """:func:`l2_norm` of many tensors (one fused kernel where torch has it; on CPU as
    :func:`l2_norms_of`, so that a weight's norm is the same with or without a backward pass)."""
    if tensors and _FOREACH and all(t.device.type == "cpu" and _plain(t) for t in tensors):
        return l2_norms_of([t.detach() for t in tensors])[0]
    if tensors and all(_plain(t) for t in tensors):  # on a device: scaled, nothing read
        with torch.no_grad():
            return [deferred_norm(t) for t in tensors]
    return [l2_norm(t) if t.numel() else None for t in tensors]


_FOREACH = hasattr(torch, "_foreach_norm")


def _plain(t: torch.Tensor) -> bool:
    return not t.is_meta and not t.is_complex() and t.numel() > 0


def l2_norms_of(*groups: List[torch.Tensor]) -> List[List[Optional[torch.Tensor]]]:
    """:func:`l2_norms` of each group, the same values; on CPU all groups together (see below)."""
    flat = [t for group in groups for t in group]
    if not (flat and _FOREACH and all(t.device.type == "cpu" and _plain(t) for t in flat)):
        return [l2_norms(group) for group in groups]
    # a large tensor by sqrt(⟨t, t⟩), as grad_norm: it uses all intra-op threads where the fused
    # norm uses one (GPT-2's 124 M weights and their gradients: 10 % less time with one thread, 50 %
    # with two), and it rounds far less (relative error 4e-5 against 2e-3 on GPT-2's 38.6 M-value
    # embedding, whose norm the fused kernel got wrong in the third digit); the many small ones
    # fused (one call: a Python call each would cost more than the reduction)
    by_dot = [t.numel() >= _DOT_NORM_MIN and _dot_norm_ok(t) for t in flat]
    small = [t for t, dot in zip(flat, by_dot) if not dot]
    with torch.no_grad():
        fused = iter(checked_tensors(small, torch._foreach_norm(small)) if small else ())
        norms = [grad_norm(t) if dot else next(fused) for t, dot in zip(flat, by_dot)]
    out, start = [], 0
    for group in groups:
        out.append(norms[start:start + len(group)])
        start += len(group)
    return out


#: From this many elements a norm is taken by ``dot`` (below it the fused call is cheaper).
_DOT_NORM_MIN = 1 << 16


def _dot_norm_ok(t: torch.Tensor) -> bool:
    return t.dtype in _DOT_DTYPES and t.is_contiguous() and not t.is_nested


def finish_norms(norms: List[Optional[torch.Tensor]]) -> List[Optional[float]]:
    """Convert many 0-d norm tensors to floats with one transfer (``None`` stays ``None``).

    On CPU no transfer is needed: the values are read where they are (exactly the same floats).
    """
    present = [t for t in norms if t is not None]
    if not present:
        return [None] * len(norms)
    if all(t.device.type == "cpu" for t in present):
        return [None if t is None else t.item() for t in norms]
    values = iter(torch.stack([t.double().cpu() for t in present]).tolist())
    return [None if t is None else next(values) for t in norms]


def grad_stats(norm: Optional[float]) -> Optional[GradStats]:
    """:class:`GradStats` from a finished norm: a NaN norm means NaN present, Inf means Inf."""
    if norm is None:
        return None
    return GradStats(norm, nan=math.isnan(norm), inf=math.isinf(norm))
