"""Broken models for the fix-ambiguity and upstream-argument tests, each with hand-fixed twins.

Every twin is plain torch with the broken model's parameter names, so a fixed copy's weights load
into it and the two must compute the same outputs. Sizes are distinct on every axis.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class PointTransform(nn.Module):
    """A learned 3×3 transform ``t`` (B, 3, 3) applied to points ``x`` (B, 3, N): ``bmm(x, t)`` fails.
    ``reading`` = "swap": ``t @ x``; "around": ``(xᵀ t)ᵀ`` (the PointNet idiom, ``tᵀ`` applied)."""

    def __init__(self, reading: str = "") -> None:
        super().__init__()
        self.reading = reading
        self.tnet = nn.Linear(3, 9)
        self.conv = nn.Conv1d(3, 8, 1)

    def forward(self, x):
        t = self.tnet(x.mean(-1)).view(-1, 3, 3)
        if self.reading == "swap":
            x = torch.bmm(t, x)
        elif self.reading == "around":
            x = torch.bmm(x.transpose(1, 2), t).transpose(1, 2)
        else:
            x = torch.bmm(x, t)
        return self.conv(x)


class VideoHead(nn.Module):
    """A Conv3d built without ``padding=1``: the flattened features are 3·4·12·12 = 1728, not the
    4·5·14·14 = 3920 the head was built for (no pool: only the conv's padding reaches that size)."""

    def __init__(self, padding: int = 0) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(3, 4, 3, padding=padding)
        self.head = nn.Linear(4 * 5 * 14 * 14, 6)

    def forward(self, x):
        return self.head(torch.relu(self.conv1(x)).flatten(1))


class VideoPool(nn.Module):
    """Conv3d then MaxPool3d(2): 4·3·7·7 = 588 features where the head was built for 4·4·8·8 = 1024.
    The conv's ``padding=1`` is the fix; the pool's ``padding=1`` reaches 1024 too, but is not a value
    an author writes for an even kernel (``pool_padding`` only builds that model for the premise)."""

    def __init__(self, conv_padding: int = 0, pool_padding: int = 0) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(3, 4, 3, padding=conv_padding)
        self.pool = nn.MaxPool3d(2, padding=pool_padding)
        self.head = nn.Linear(4 * 4 * 8 * 8, 5)

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.conv1(x))).flatten(1))


class TwoConvs(nn.Module):
    """Two 3×3 convs without padding on 16×16: 12×12 reach the head built for 14×14 (4·14·14 = 784).
    ``padding=1`` on either conv gives 14×14: two models, two readings."""

    def __init__(self, p1: int = 0, p2: int = 0) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=p1)
        self.c2 = nn.Conv2d(4, 4, 3, padding=p2)
        self.head = nn.Linear(4 * 14 * 14, 5)

    def forward(self, x):
        return self.head(torch.relu(self.c2(torch.relu(self.c1(x)))).flatten(1))


class StridedImage(nn.Module):
    """A Conv2d built with ``stride=2`` where the head was built for the full map (4·9·9 = 324)."""

    def __init__(self, stride: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=stride, padding=1)
        self.head = nn.Linear(4 * 9 * 9, 7)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


class WrongHead(nn.Module):
    """A head built for the wrong feature size: the conv's 4·6·6 = 144 features meet ``Linear(150)``.
    No padding, stride or ceil_mode of the conv gives 150: resizing the head is the fix."""

    def __init__(self, in_features: int = 150) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(in_features, 7)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


class ExtraTranspose(nn.Module):
    """``conv(x.transpose(1, 2))`` on (B, C, L): dropping the transpose and permuting the conv's input
    back are two edits that compute the same output (one meaning)."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv1d(7, 5, 3)

    def forward(self, x):
        return self.conv(x if self.fixed else x.transpose(1, 2))
