"""Models that run and compute the wrong thing, for the silent-bug example specs (--allow-import)."""

import torch.nn as nn


class HeadsMergedWithoutTranspose(nn.Module):
    """Multi-head self-attention whose heads are merged back without moving the time axis first:
    (N, h, L, d) → reshape(N, L, E) runs, and mixes positions and heads in every row."""

    def __init__(self, embed_dim: int = 32, num_heads: int = 4) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        N, L, E = x.shape
        q, k, v = self.qkv(x).split(E, dim=-1)
        q, k, v = (t.reshape(N, L, self.num_heads, E // self.num_heads).transpose(1, 2) for t in (q, k, v))
        weights = (q @ k.transpose(-2, -1) / (E // self.num_heads) ** 0.5).softmax(dim=-1)
        y = (weights @ v).reshape(N, L, E)  # BUG: needs .transpose(1, 2) first
        return self.proj(y)
