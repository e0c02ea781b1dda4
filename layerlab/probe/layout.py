"""Axis arithmetic for layout diagnoses: where does the size a layer wants sit, and which
``permute`` / ``transpose`` puts it where the layer reads it.

A layer that reads its features from one axis (Conv and BatchNorm: dim 1; Linear, LayerNorm,
RNN, MultiheadAttention: the last) and finds the wrong size there very often got the right data
in another layout: (N, L, C) from an Embedding where Conv1d wants (N, C, L), NHWC where Conv2d
wants NCHW. When the wanted size sits on exactly one other axis, moving that axis is the fix;
changing the layer's size instead makes the model run and compute garbage.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

#: Module classes whose output puts the features on the last axis: a tensor they made is
#: (N, …, features), whatever its sizes say.
FEATURES_LAST = (
    "Embedding", "Linear", "LayerNorm", "RMSNorm", "MultiheadAttention", "TransformerEncoderLayer",
    "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "Transformer",
    "LSTM", "GRU", "RNN", "Bilinear", "LazyLinear",
)
#: ... and on axis 1: (N, C, *spatial).
CHANNELS_FIRST = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
                  "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
                  "AvgPool1d", "AvgPool2d", "AvgPool3d")


def axes_with(shape: Sequence[int], size: int, skip: Iterable[int] = ()) -> List[int]:
    """The axes of ``shape`` (non-negative indices) whose size is ``size``, except ``skip``."""
    skipped = {s % len(shape) for s in skip} if shape else set()
    return [k for k, n in enumerate(shape) if n == size and k not in skipped]


def move_axis(ndim: int, src: int, dst: int) -> List[int]:
    """The ``permute`` order that moves axis ``src`` to position ``dst`` (others keep their order)."""
    src, dst = src % ndim, dst % ndim
    dims = [k for k in range(ndim) if k != src]
    dims.insert(dst, src)
    return dims


def inverse(dims: Sequence[int]) -> List[int]:
    out = [0] * len(dims)
    for position, axis in enumerate(dims):
        out[axis] = position
    return out


def permute_code(var: str, dims: Sequence[int]) -> str:
    """``x.transpose(1, 2)`` for a swap of two axes, ``x.permute(0, 3, 1, 2)`` otherwise."""
    moved = [k for k, d in enumerate(dims) if d != k]
    if len(moved) == 2:
        return f"{var}.transpose({moved[0]}, {moved[1]})"
    return f"{var}.permute({', '.join(map(str, dims))})"


def permuted(shape: Sequence[int], dims: Sequence[int]) -> List[int]:
    return [shape[d] for d in dims]


def one_axis(candidates: List[int], prefer: Sequence[int] = ()) -> Optional[int]:
    """The one candidate axis, or the preferred one among several (``None``: can't tell)."""
    if len(candidates) == 1:
        return candidates[0]
    for axis in prefer:
        if axis in candidates:
            return axis
    return None


def axis_list(axes: Sequence[int]) -> str:
    names = [f"dim {a}" for a in axes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
