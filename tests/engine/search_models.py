"""Broken models for the fix search and the oracles, each with its twin fixed by hand.

Every broken model raises in its forward (or computes something implausible once "fixed" the
tempting way); its twin is the same model written correctly, with the same parameter names, so
that a fixed copy's weights load into it and the two must compute the same outputs. Sizes are
distinct on every axis (B, T, C, heads …) so that no edit fits by a coincidence of sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Twin:
    """A broken model, its inputs, and the model fixed by hand (``hand``)."""

    name: str
    broken: Callable[[], nn.Module]
    hand: Callable[[], nn.Module]
    inputs: Callable[[], Tuple[tuple, dict]]


class _Switch(nn.Module):
    """A model whose forward differs between its broken and hand-fixed versions only where ``fixed`` says."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed


# -- gather with an index of the wrong rank ------------------------------------------------------------
class GatherPick(_Switch):
    """Pick K steps per sample from (B, T, C): the index needs the features' axis too."""

    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.head = nn.Linear(6, 3)

    def forward(self, x, idx):
        if self.fixed:
            picked = x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        else:
            picked = x.gather(1, idx)
        return self.head(picked)


# -- a decoder map one pixel short of its skip connection -------------------------------------------------
class SkipUp(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.mid = nn.Conv2d(8, 8, 3, padding=1)
        self.out = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        e = self.enc(x)
        u = F.interpolate(self.mid(F.max_pool2d(e, 2)), scale_factor=2.0)
        if self.fixed:
            u = F.interpolate(u, size=list(e.shape[2:]), mode="bilinear", align_corners=False)
        return self.out(torch.cat([u, e], dim=1))


# -- grouped-query attention: fewer key/value heads than query heads --------------------------------------
class GQA(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.q = nn.Linear(24, 24)
        self.kv = nn.Linear(24, 12)
        self.proj = nn.Linear(24, 24)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 6).transpose(1, 2)
        k = self.kv(x).view(b, t, 2, 6).transpose(1, 2)
        v = k * 2
        if self.fixed:
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, t, 24))


# -- a mean subtracted without keepdim ------------------------------------------------------------------
class Centre(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.fc = nn.Linear(10, 4)

    def forward(self, x):
        if self.fixed:
            x = x - x.mean(-1, keepdim=True)
        else:
            x = x - x.mean(-1)
        return self.fc(x)


# -- a bare squeeze() that eats a batch of 1 ------------------------------------------------------------
class SqueezeJoin(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.conv = nn.Conv1d(3, 1, 3, padding=1)
        self.fc = nn.Linear(16, 2)

    def forward(self, x, extra):
        h = self.conv(x)
        h = h.squeeze(1) if self.fixed else h.squeeze()
        return self.fc(torch.cat([h, extra], dim=1))


# -- attention weights multiplied in the wrong order --------------------------------------------------------
class WrongOrder(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = (q @ k.transpose(1, 2)).softmax(-1)
        out = attn @ v if self.fixed else v @ attn
        return self.proj(out)


# -- token ids made as floats ----------------------------------------------------------------------------
class FloatIds(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.emb = nn.Embedding(50, 12)
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        ids = (x * 49).floor()
        if self.fixed:
            ids = ids.long()
        return self.fc(self.emb(ids))


# -- a mean over the features where the time was meant ----------------------------------------------------
class PoolAxis(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.rnn = nn.GRU(5, 12, batch_first=True)
        self.fc = nn.Linear(12, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        pooled = out.mean(1) if self.fixed else out.mean(2)
        return self.fc(pooled)


# -- view of a transposed tensor ----------------------------------------------------------------------------
class ViewAfterTranspose(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.conv = nn.Conv1d(4, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 9, 2)

    def forward(self, x):
        h = self.conv(x).transpose(1, 2)
        h = h.reshape(h.shape[0], -1) if self.fixed else h.view(h.shape[0], -1)
        return self.fc(h)


# -- two feature vectors joined along the batch -------------------------------------------------------------
class JoinFeatures(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.a = nn.Linear(5, 4)
        self.b = nn.Linear(5, 6)
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        h = torch.cat([self.a(x), self.b(x)], dim=1 if self.fixed else 0)
        return self.fc(h)


# -- a transpose that the layer after it does not want ------------------------------------------------------
class ExtraTranspose(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.conv = nn.Conv1d(7, 5, 3)

    def forward(self, x):
        if not self.fixed:
            x = x.transpose(1, 2)
        return self.conv(x)


# -- a float mask given to masked_fill ----------------------------------------------------------------------
class FloatMask(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.score = nn.Linear(6, 1)

    def forward(self, x, mask):
        s = self.score(x).squeeze(-1)
        if self.fixed:
            mask = mask.bool()
        return s.masked_fill(mask, float("-inf")).softmax(-1)


# -- an LSTM left seq-first for a (B, T, C) batch with its own state ----------------------------------------
class SeqFirstLSTM(_Switch):
    def __init__(self, fixed=False):
        super().__init__(fixed)
        self.rnn = nn.LSTM(5, 7, batch_first=fixed)

    def forward(self, x, h0, c0):
        return self.rnn(x, (h0, c0))[0]


TWINS = [
    Twin("gather_index_rank", lambda: GatherPick(), lambda: GatherPick(True),
         lambda: ((torch.randn(3, 9, 6), torch.tensor([[0, 4], [8, 1], [2, 2]])), {})),
    Twin("interpolate_off_by_one", lambda: SkipUp(), lambda: SkipUp(True), lambda: ((torch.randn(2, 3, 15, 15),), {})),
    Twin("gqa_heads", lambda: GQA(), lambda: GQA(True), lambda: ((torch.randn(3, 5, 24),), {})),
    Twin("mean_keepdim", lambda: Centre(), lambda: Centre(True), lambda: ((torch.randn(3, 7, 10),), {})),
    Twin("squeeze_ate_batch", lambda: SqueezeJoin(), lambda: SqueezeJoin(True),
         lambda: ((torch.randn(1, 3, 12), torch.randn(1, 4)), {})),
    Twin("matmul_order", lambda: WrongOrder(), lambda: WrongOrder(True), lambda: ((torch.randn(3, 5, 8),), {})),
    Twin("float_ids", lambda: FloatIds(), lambda: FloatIds(True), lambda: ((torch.rand(3, 7),), {})),
    Twin("mean_axis", lambda: PoolAxis(), lambda: PoolAxis(True), lambda: ((torch.randn(3, 9, 5),), {})),
    Twin("view_non_contiguous", lambda: ViewAfterTranspose(), lambda: ViewAfterTranspose(True),
         lambda: ((torch.randn(3, 4, 9),), {})),
    Twin("cat_dim", lambda: JoinFeatures(), lambda: JoinFeatures(True), lambda: ((torch.randn(3, 5),), {})),
    Twin("extra_transpose", lambda: ExtraTranspose(), lambda: ExtraTranspose(True), lambda: ((torch.randn(3, 7, 11),), {})),
    Twin("mask_dtype", lambda: FloatMask(), lambda: FloatMask(True),
         lambda: ((torch.randn(3, 8, 6), (torch.arange(8) >= 6).float().expand(3, 8).clone()), {})),
    Twin("lstm_batch_first", lambda: SeqFirstLSTM(), lambda: SeqFirstLSTM(True),
         lambda: ((torch.randn(3, 9, 5), torch.zeros(1, 3, 7), torch.zeros(1, 3, 7)), {})),
]
