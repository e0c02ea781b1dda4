"""Layers written the way users write them, for the example specs (import with --allow-import)."""

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with its own q/k/v split: x (N, L, E) → (N, L, E)."""

    def __init__(self, embed_dim: int = 32, num_heads: int = 4) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        N, L, E = x.shape
        q, k, v = self.qkv(x).split(E, dim=-1)                                # 3 × (N, L, E)
        q = q.reshape(N, L, self.num_heads, E // self.num_heads).transpose(1, 2)  # (N, h, L, d)
        k = k.reshape(N, L, self.num_heads, E // self.num_heads).transpose(1, 2)
        v = v.reshape(N, L, self.num_heads, E // self.num_heads).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / (E // self.num_heads) ** 0.5        # (N, h, L, L)
        future = torch.ones(L, L, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(N, L, E)                     # (N, L, E)
        return self.proj(y)


class LayerNorm(nn.Module):
    """A LayerNorm written from the paper. BUG (a common one): ``x.var()`` is the *unbiased*
    variance (divides by N−1); layer norm divides by N, as torch.nn.LayerNorm does."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5):
        super().__init__()
        self.normalized_shape, self.eps = (normalized_shape,), eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True)  # the bug: unbiased=True by default
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
