"""Broken models whose tempting fix *runs* and computes the wrong thing, each with its hand-fixed twin.

* a causal TCN whose chomp ``x[:, :-k]`` cuts the channels instead of the time: resizing the next
  conv (``in_channels=30``) runs, keeps the padded steps and reads padding at its last step;
* a bare ``squeeze()`` that ate a batch of 1 before a BatchNorm1d: ``num_features=20`` runs for
  this batch only and normalises the time axis;
* a seq-first ``key_padding_mask`` (T, B) given to a batch-first MultiheadAttention:
  ``batch_first=False`` runs and attends across the batch;
* a classifier that flattens (T, C) where it should pool: ``in_features=T·C`` ties ``fc`` to T;
* a hand-written causal attention whose ``v @ attn`` is fixed by transposing ``v`` (runs, anti-causal);
* a forward that runs but whose backward does not (an in-place op on a saved tensor).
"""

from __future__ import annotations

import torch
import torch.nn as nn


class Chomp(nn.Module):
    def __init__(self, k: int, fixed: bool = False) -> None:
        super().__init__()
        self.k, self.fixed = k, fixed

    def forward(self, x):
        if self.fixed:
            return x[:, :, :-self.k]
        return x[:, :-self.k]  # @chomp


class TCN(nn.Module):
    """Two causal conv blocks (padding 2, chomp 2) and a head on the last step."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.c1, self.ch1 = nn.Conv1d(8, 32, 3, padding=2), Chomp(2, fixed)
        self.c2, self.ch2 = nn.Conv1d(32, 32, 3, padding=2), Chomp(2, fixed)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        h = torch.relu(self.ch1(self.c1(x)))
        h = torch.relu(self.ch2(self.c2(h)))
        return self.head(h[:, :, -1])


class SqueezeNorm(nn.Module):
    """(N, 4, 20, 3) → conv over the last axis to width 1 → squeeze → BatchNorm1d(32) → (N, 32, 20)."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv2d(4, 32, (1, 3))
        self.bn = nn.BatchNorm1d(32)

    def forward(self, x):
        h = self.conv(x)
        h = h.squeeze(3) if self.fixed else h.squeeze()  # @squeeze
        return self.bn(h)


class MaskedAttention(nn.Module):
    """A batch-first attention given a padding mask laid out (T, B)."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x, mask):
        if self.fixed:
            mask = mask.t()
        return self.attn(x, x, x, key_padding_mask=mask, need_weights=False)[0]


class FlattenHead(nn.Module):
    """Per-sequence logits from (B, T, C) features: the pooling over T was forgotten (flatten)."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.rnn = nn.GRU(6, 16, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out.mean(1) if self.fixed else out.flatten(1))


class CausalAttention(nn.Module):
    """Hand-written causal attention; ``v @ attn`` should be ``attn @ v``."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(6, 18)
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        t = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        attn = (q @ k.transpose(1, 2)).masked_fill(mask, float("-inf")).softmax(-1)
        out = v @ attn  # @causal
        return self.proj(out.transpose(1, 2))


class InPlaceSigmoid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.sigmoid(self.fc(x))
        h.mul_(2)  # sigmoid saved its output for backward: this breaks it
        return h


class FlatTextCNN(nn.Module):
    """A text CNN that flattens (C, L') into its head, built for one length (``fc_in``): a fixed
    length by design, so resizing ``fc`` for this length is a fix (the near miss of ``FlattenHead``)."""

    def __init__(self, fc_in: int = 384) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8)
        self.conv = nn.Conv1d(8, 16, 3)
        self.fc = nn.Linear(fc_in, 2)

    def forward(self, ids):
        h = torch.relu(self.conv(self.emb(ids).transpose(1, 2)))
        return self.fc(h.flatten(1))


class EdgeSum(nn.Module):
    """Message passing: each node adds its neighbours' features (samples = nodes, mixed by design)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x, edge_index):
        src, dst = edge_index
        return self.lin(x).index_add(0, dst, self.lin(x)[src])
