"""Layers that break in half precision the way real ones do (for configs/precision_*.yaml).

Each works in float32 and carries one planted half-precision bug; the docstring says what
``layerlab precision-check`` should name and the fix. Import them with ``--allow-import``.
"""

import torch
import torch.nn as nn


class SumOfSquaresNorm(nn.Module):
    """A hand-written normalisation whose variance is ``E[x²] − E[x]²`` in the input's dtype.

    Its input has a large mean (an un-centred residual stream, here a +8 offset), so ``E[x²]`` and
    ``E[x]²`` are nearly equal: in float16/bfloat16 their difference is mostly rounding, and can
    even come out negative (rsqrt → NaN). Fix: compute the statistics on ``x.float()``.
    """

    def __init__(self, features: int = 256, offset: float = 8.0, eps: float = 1e-6) -> None:
        super().__init__()
        self.offset, self.eps = offset, eps
        self.weight = nn.Parameter(torch.ones(features))

    def forward(self, x):                                         # x: (N, L, E)
        x = x + self.offset
        mean = x.mean(-1, keepdim=True)                           # (N, L, 1)
        var = x.pow(2).mean(-1, keepdim=True) - mean * mean       # the planted bug: cancels in low precision
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight


class VarianceBlock(nn.Module):
    """Linear → SumOfSquaresNorm → Linear: the norm is the first module to lose precision."""

    def __init__(self, features: int = 256, out_features: int = 16) -> None:
        super().__init__()
        self.fc_in = nn.Linear(features, features)
        self.norm = SumOfSquaresNorm(features)
        self.fc_out = nn.Linear(features, out_features)

    def forward(self, x):
        return self.fc_out(self.norm(self.fc_in(x)))


class LoudGate(nn.Module):
    """Scales its input by a large gain and divides it back out later: harmless in float32 and
    bfloat16, but the scaled activation passes float16's largest value (65504) and becomes inf.
    Fix: use bfloat16, or keep the scaled product in float32."""

    def __init__(self, features: int = 32, gain: float = 1e5) -> None:
        super().__init__()
        self.gain = gain
        self.proj = nn.Linear(features, features)

    def forward(self, x):
        loud = self.proj(x) * self.gain                           # |x| up to ~1e5: inf in float16
        return loud / self.gain


class OverflowBlock(nn.Module):
    """Linear → LoudGate → Linear."""

    def __init__(self, features: int = 32) -> None:
        super().__init__()
        self.fc_in = nn.Linear(features, features)
        self.gate = LoudGate(features)
        self.fc_out = nn.Linear(features, features)

    def forward(self, x):
        return self.fc_out(self.gate(self.fc_in(x)))


class HotAttention(nn.Module):
    """Single-head attention whose logits carry a large shared offset (an unscaled score plus a
    position bias of ~1000). softmax ignores a shift in exact arithmetic, but in float16 a logit
    near 1000 is rounded to a multiple of 0.5 (of 8 in bfloat16), so the weights come out wrong.
    Fix: keep the scores and the softmax in float32."""

    def __init__(self, features: int = 32, offset: float = 1000.0) -> None:
        super().__init__()
        self.offset = offset
        self.qkv = nn.Linear(features, 3 * features)
        self.out = nn.Linear(features, features)

    def forward(self, x):                                         # x: (N, L, E)
        q, k, v = self.qkv(x).chunk(3, dim=-1)                    # 3 × (N, L, E)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + self.offset   # (N, L, L)
        return self.out(scores.softmax(dim=-1) @ v)


class OffsetCentre(nn.Module):
    """Adds a large constant offset, then centres by subtracting the mean: in float32 the offset
    cancels exactly, but in bfloat16 ``h`` is rounded at magnitude ~50 (steps of 0.25), so
    ``h - h.mean()`` keeps only a few correct bits. (torch sums bfloat16 in float32: the mean is
    not the problem.) Fix: centre before adding the offset, or build ``h`` in float32."""

    def __init__(self, features: int = 16, offset: float = 50.0) -> None:
        super().__init__()
        self.offset = offset
        self.proj = nn.Linear(features, features)

    def forward(self, x):                                         # x: (N, E)
        h = self.proj(x) + self.offset
        return h - h.mean()                                       # the planted bug: cancels in low precision
