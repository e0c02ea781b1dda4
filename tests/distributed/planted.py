"""Models and losses for the DDP check, at module level so spawned ranks can import them.

Healthy: :func:`mlp`, :func:`cnn` (stock torch.nn layers). Planted, one DDP pitfall each:
:class:`UnusedBranch`, :class:`RankBranch`, :func:`batchnorm_mlp`, :func:`summed_loss`,
:func:`rank_scaled_loss`, :class:`BufferOnRankZero`, :class:`HangsOnRankOne`, :class:`RaisesOnRankOne`.
Rank checks are guarded with ``dist.is_initialized()`` so the single-process side runs them as rank 0
would not matter: in one process there is no rank.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
                         nn.GroupNorm(2, 8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def batchnorm_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


class _Planted(nn.Module):
    """A ``Linear(16, 8)`` body built from seed 0 (every rank and the one-process run get the same
    weights) and, for the branch cases, a second ``Linear(8, 8)`` called ``extra``."""

    with_extra = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(16, 8)
        if self.with_extra:
            self.extra = nn.Linear(8, 8)


class UnusedBranch(_Planted):
    """``aux`` is built but never called: DDP without find_unused_parameters raises at the next step."""

    def __init__(self) -> None:
        super().__init__()
        self.aux = nn.Linear(16, 8)

    def forward(self, x):
        return self.body(x)


class RankBranch(_Planted):
    """``extra`` runs on rank 1 only: rank-dependent control flow."""

    with_extra = True

    def forward(self, x):
        h = self.body(x)
        if _rank() == 1:
            h = self.extra(h)
        return h


class BufferOnRankZero(_Planted):
    """A step counter that only rank 0 increments: the ranks' buffers disagree after the step."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        if _rank() == 0:
            self.seen += x.shape[0]
        return self.body(x)


class HangsOnRankOne(_Planted):
    """Rank 1 sleeps in its forward, far past any timeout: the other rank waits in a collective."""

    def forward(self, x):
        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(600)
        return self.body(x)


class RaisesOnRankOne(_Planted):
    """Rank 1 raises in its forward."""

    def forward(self, x):
        if dist.is_initialized() and dist.get_rank() == 1:
            raise ValueError("planted failure on rank 1")
        return self.body(x)


def summed_loss(output, inputs):
    """A per-rank *sum*: DDP's average over ranks divides it by the world size."""
    return (output * torch.linspace(-1, 1, output.shape[-1])).sum()


def rank_scaled_loss(output, inputs):
    """A mean scaled by (rank + 1): rank 1's gradient is twice what its samples give."""
    return (output * torch.linspace(-1, 1, output.shape[-1])).mean() * (1 + _rank())


def weighted_mean_loss(output, inputs):
    """A per-sample mean with fixed weights: what a healthy DDP step must reproduce exactly."""
    return (output * torch.linspace(-1, 1, output.shape[-1])).mean()


class DecidedOnTheBatch(_Planted):
    """``extra`` runs when the *batch's* mean of feature 0 is positive: a branch on a batch-level value."""

    with_extra = True

    def forward(self, x):
        h = self.body(x)
        if x[:, 0].mean() > 0:
            h = self.extra(h)
        return h


class Router(_Planted):
    """Per-sample routing (a parameter used only on some inputs): ``extra`` for samples with x[:, 0] > 0."""

    with_extra = True

    def forward(self, x):
        h = self.body(x)
        mask = x[:, 0] > 0
        if mask.any():
            h = h.clone()
            h[mask] = self.extra(h[mask])
        return h


class RankInForward(nn.Module):
    """Calls ``dist.get_rank()`` in forward, unguarded: it cannot run without a process group."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(16, 4)

    def forward(self, x):
        return self.body(x) * (1 + dist.get_rank())


class SeqHead(nn.Module):
    """LSTM (batch_first=False, as torch's default) with a linear head over every step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(8, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


class DictToTuple(nn.Module):
    """A dict of inputs in, a tuple out (the shape of many data loaders and model APIs)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(4, 8)

    def forward(self, batch):
        h = torch.tanh(self.a(batch["x"]) + self.b(batch["y"]))
        return h, h.sum(-1)


class BagOfEmbeddings(nn.Module):
    """Integer token ids in: an Embedding, a mean over positions, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def masked_mean_loss(output, inputs):
    """A mean over the rows whose x[:, 0] > 0 (padding-style masking): each rank divides by its own count."""
    keep = next(iter(inputs.values()))[:, 0] > 0
    return (output[keep] * torch.linspace(-1, 1, output.shape[-1])).sum() / keep.sum()
