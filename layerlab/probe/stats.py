"""Cheap tensor statistics, kept as small tensors during the run and converted once at the end.

The hot path (once per distinct module output) is four fast reductions over the tensor — ``sum``,
the L2 norm, ``aminmax`` and a count of non-zeros (see :func:`count_nonzero`) — with no host synchronisation on accelerators:
the results stay on the tensor's device until :func:`finish_stats` converts them.

mean and std come from the sum and the L2 norm (``std² = ‖x‖²/n − mean²``, population std): on
CPU these two passes are several times faster than ``torch.std_mean``'s Welford pass, and exact
enough for a diagnostic (digits are lost only when ``|mean| ≫ std``).

NaN/Inf: any NaN or Inf makes the sum non-finite. On CPU reading that one number costs nothing,
so exact counts, and statistics over the finite elements, are computed only when the sum is not
finite. On other devices reading it would stall the stream, so the two counts are computed for
every tensor instead and the statistics then cover all elements.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch

from layerlab.probe.report import GradStats, Stats

_HALF = (torch.float16, torch.bfloat16)
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


def _may_read(x: torch.Tensor) -> bool:
    """Whether reading a value of ``x`` on the host is free (CPU) rather than a device sync."""
    return x.device.type == "cpu"


def count_nonzero(x: torch.Tensor, may_read: Optional[bool] = None) -> torch.Tensor:
    """Elements that are not ±0, as a 0-d tensor.

    ``torch.count_nonzero`` on floats takes a slow path on CPU (about 20× a ``sum``); on the
    integer view of the same bits it is as fast as a sum, but counts ``-0.0`` (sign bit only, e.g.
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
    if view.min().item() != torch.iinfo(bits).min:  # no -0.0 anywhere
        return torch.count_nonzero(view)
    return torch.count_nonzero(view << 1)


def _as_float(x: torch.Tensor) -> torch.Tensor:
    if x.is_complex():
        return x.abs()
    if not x.is_floating_point():
        return x.double()
    return x


def _moments(x: torch.Tensor, s: torch.Tensor, acc, may_read: bool) -> tuple:
    mn, mx = torch.aminmax(x)
    if acc is None and x.is_contiguous() and x.dtype in (torch.float32, torch.float64):
        flat = x.view(-1)
        norm = torch.dot(flat, flat).sqrt()  # a little faster than vector_norm on CPU
    else:
        norm = torch.linalg.vector_norm(x, dtype=acc)
    return torch.stack([s, norm, mn.to(s.dtype), mx.to(s.dtype)]), count_nonzero(x, may_read)


def tensor_stats(x: torch.Tensor, may_read: Optional[bool] = None) -> Optional[tuple]:
    """Start the statistics of ``x`` (any dtype); ``None`` for an empty or data-less (meta) tensor.

    Returns a raw record ``(numel, finite_numel, moments, nonzero, bad)`` of small tensors, where
    ``moments`` is ``[sum, ‖x‖₂, min, max]`` over the finite elements and ``bad`` is
    ``[nan, inf]`` counts or ``None`` (none found). ``may_read`` (default: on CPU) allows reading
    a value on the host to skip work; without it nothing is read until :func:`finish_stats`.
    """
    n = x.numel()
    if n == 0 or x.is_meta:
        return None
    x = _as_float(x.detach())
    acc = torch.float32 if x.dtype in _HALF else None
    s = x.sum(dtype=acc)
    may_read = _may_read(x) if may_read is None else may_read
    if not may_read:
        bad = torch.stack([torch.isnan(x).sum(), torch.isinf(x).sum()])
        return (n, n, *_moments(x, s, acc, may_read), bad)
    if math.isfinite(s.item()):  # on CPU a plain read: no device to wait for
        return (n, n, *_moments(x, s, acc, may_read), None)
    bad = torch.stack([torch.isnan(x).sum(), torch.isinf(x).sum()])
    finite = x[torch.isfinite(x)]
    if finite.numel() == 0:
        return (n, 0, None, None, bad)
    return (n, finite.numel(), *_moments(finite, finite.sum(dtype=acc), acc, may_read), bad)


def finish_stats(raws: List[Optional[tuple]]) -> List[Optional[Stats]]:
    """Turn raw records from :func:`tensor_stats` into :class:`Stats`, with one transfer for all."""
    live = [r for r in raws if r is not None and r[2] is not None]
    moments = iter(torch.stack([r[2].double().cpu() for r in live]).tolist() if live else [])
    nonzeros = iter(torch.stack([r[3].cpu() for r in live]).tolist() if live else [])
    out: List[Optional[Stats]] = []
    for raw in raws:
        if raw is None:
            out.append(None)
            continue
        n, m, vec, _, bad = raw
        nan_count, inf_count = (0, 0) if bad is None else (int(v) for v in bad.tolist())
        if vec is None:
            nan = float("nan")
            out.append(Stats(nan, nan, nan, nan, 0.0, nan_count, inf_count, n))
            continue
        s, norm, mn, mx = next(moments)
        mean = s / m
        std = math.sqrt(max(norm * norm / m - mean * mean, 0.0))
        zeros = (m - int(next(nonzeros))) / n
        out.append(Stats(mean, std, mn, mx, zeros, nan_count, inf_count, n))
    return out


def l2_norm(g: torch.Tensor) -> Optional[torch.Tensor]:
    """The L2 norm of a gradient (or weight) as a 0-d tensor (no sync); NaN if it holds a NaN, Inf for Inf.

    ``None`` for a meta tensor (no data).
    """
    if g.is_meta:
        return None
    g = g.detach()
    if g.is_complex():
        g = g.abs()
    return torch.linalg.vector_norm(g, dtype=torch.float32 if g.dtype in _HALF else None)


def l2_norms(tensors: List[torch.Tensor]) -> List[Optional[torch.Tensor]]:
    """:func:`l2_norm` of many tensors (one fused kernel where torch has it)."""
    plain = [t for t in tensors if not t.is_meta and not t.is_complex() and t.numel()]
    if plain and len(plain) == len(tensors) and hasattr(torch, "_foreach_norm"):
        with torch.no_grad():
            return list(torch._foreach_norm([t.detach() for t in tensors]))
    return [l2_norm(t) if t.numel() else None for t in tensors]


def finish_norms(norms: List[Optional[torch.Tensor]]) -> List[Optional[float]]:
    """Convert many 0-d norm tensors to floats with one transfer (``None`` stays ``None``)."""
    present = [t.double().cpu() for t in norms if t is not None]
    values = iter(torch.stack(present).tolist() if present else [])
    return [None if t is None else next(values) for t in norms]


def grad_stats(norm: Optional[float]) -> Optional[GradStats]:
    """:class:`GradStats` from a finished norm: a NaN norm means NaN present, Inf means Inf."""
    if norm is None:
        return None
    return GradStats(norm, nan=math.isnan(norm), inf=math.isinf(norm))
