"""Which axis of a module's output holds its channels (features, units), and per-channel views.

The module that made a tensor settles its layout (see :mod:`layerlab.probe.layout`): Conv,
BatchNorm and pooling put channels on dim 1, (N, C, *spatial); Linear, LayerNorm, Embedding and
attention put features last, (N, …, C). For a tensor whose maker says nothing (an activation, a
dropout, a functional call) the rank decides: 2-D → last (= dim 1), 4-D and 5-D → dim 1 (torch's
NCHW convention), 3-D → the side of the tensor it was computed from when that is known, else last
(the (B, T, C) of sequence models) and the row says ``guess``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from layerlab.probe.layout import CHANNELS_FIRST, ELEMENTWISE, FEATURES_LAST

__all__ = ["SERIES_CAP", "axis_for", "capped", "maker_side", "rows_by_channel"]

#: Per-channel series longer than this are kept as this many bins (each bin the mean of its channels).
SERIES_CAP = 512


def maker_side(class_name: str) -> Optional[str]:
    """``"first"`` / ``"last"`` for a module class that fixes its output's layout; ``None`` for an
    elementwise module (its output has its input's layout) or an unknown one."""
    if class_name in FEATURES_LAST:
        return "last"
    if class_name in CHANNELS_FIRST:
        return "first"
    return None


def is_elementwise(class_name: str) -> bool:
    return class_name in ELEMENTWISE


def axis_for(ndim: int, side: Optional[str]) -> Tuple[Optional[int], str]:
    """``(axis, label)``: the channel axis of an ``ndim``-D tensor whose maker puts its channels on
    ``side``, and how it was chosen (shown in the probe's table: ``C=dim 1``, ``C last (guess)``)."""
    if ndim < 2:
        return None, "no channel axis"
    if ndim == 2:
        return 1, "C last"
    if side == "first":
        return 1, "C=dim 1"
    if side == "last":
        return ndim - 1, "C last"
    if ndim >= 4:
        return 1, "C=dim 1"
    return ndim - 1, "C last (guess)"


def rows_by_channel(x: Any, axis: int) -> Any:
    """``x`` as (samples, C): the channel axis last, every other axis flattened into samples."""
    return x.movedim(axis, -1).reshape(-1, x.shape[axis])


def capped(values: Any, cap: int = SERIES_CAP) -> Tuple[List[float], Optional[str]]:
    """A 1-D tensor as a list of at most ``cap`` floats (binned means beyond), and a note when binned."""
    n = values.numel()
    if n <= cap:
        return [float(v) for v in values.tolist()], None
    import torch

    size = -(-n // cap)
    pad = size * cap - n
    padded = torch.cat([values.float(), values.new_full((pad,), float("nan"), dtype=torch.float32)])
    binned = padded.view(cap, size).nanmean(dim=1)
    return [float(v) for v in binned.tolist()], f"{n} channels binned into {cap} groups of {size} (mean of each)"
