"""Sequence and embedding models of the second corpus: contrastive InfoNCE, protein pair-bias
attention and a hand-written selective scan. Each twin is written first; the broken class
subclasses it and overrides only the wrong part, marked ``# BUG(case)``."""

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- contrastive learning: NT-Xent over two views with in-batch negatives ---------------------
class NTXentTwin(nn.Module):
    def __init__(self, d_in=20, d=16, tau=0.5):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, 32))
        self.proj = nn.Sequential(nn.ReLU(), nn.Linear(32, d))
        self.tau = tau

    def embed_views(self, v1, v2):
        """Both views stacked along the batch: (2B, d), view 1 first."""
        return torch.cat([self.proj(self.encoder(v1)), self.proj(self.encoder(v2))], dim=0)

    def forward(self, v1, v2):
        b = v1.shape[0]
        z = F.normalize(self.embed_views(v1, v2), dim=1)
        sim = (z @ z.t()) / self.tau
        sim = sim.masked_fill(torch.eye(sim.shape[0], dtype=torch.bool), float("-inf"))
        positives = torch.cat([torch.arange(b) + b, torch.arange(b)])  # i's positive is its other view
        return F.cross_entropy(sim, positives)


class NTXentBroken(NTXentTwin):
    def embed_views(self, v1, v2):
        return torch.cat([self.proj(self.encoder(v1)), self.proj(self.encoder(v2))], dim=1)  # BUG(infonce_views_cat_dim)


# --- protein structure: attention over residues with a bias from the pair representation ------
class PairBiasAttentionTwin(nn.Module):
    def __init__(self, d=32, c=8, heads=4):
        super().__init__()
        self.left, self.right = nn.Linear(d, c), nn.Linear(d, c)
        self.pair_bias = nn.Linear(c, heads, bias=False)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.heads = heads

    def bias(self, pair):  # (B, L, L, c) -> (B, H, L, L)
        return self.pair_bias(pair).permute(0, 3, 1, 2)

    def forward(self, s):  # s: (B, L, d) residue features
        b, length, d = s.shape
        pair = self.left(s)[:, :, None, :] + self.right(s)[:, None, :, :]  # (B, L, L, c), i-major
        q, k, v = self.qkv(s).view(b, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5 + self.bias(pair)
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, length, d)
        return self.out(y)


class PairBiasAttentionBroken(PairBiasAttentionTwin):
    def bias(self, pair):
        return self.pair_bias(pair)  # BUG(protein_pair_bias_heads)


# --- a Mamba-like selective scan written by hand ------------------------------------------------
class SelectiveScanTwin(nn.Module):
    def __init__(self, d=16, n=4):
        super().__init__()
        self.in_proj, self.dt_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.B_proj, self.C_proj = nn.Linear(d, n), nn.Linear(d, n)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1).float()).repeat(d, 1))  # (d, n)
        self.out_proj = nn.Linear(d, d)

    def step(self, h, x_t, dt_t, b_t, c_t, a):
        """One recurrence step; h is (B, d, n), the others are one time step of their sequence."""
        decay = torch.exp(dt_t[:, :, None] * a)  # (B, d, n)
        drive = dt_t[:, :, None] * b_t[:, None, :] * x_t[:, :, None]  # (B, d, n)
        h = decay * h + drive
        return h, (h * c_t[:, None, :]).sum(-1)  # y_t: (B, d)

    def forward(self, x):  # (B, L, d)
        u, dt = F.silu(self.in_proj(x)), F.softplus(self.dt_proj(x))
        bm, cm = self.B_proj(x), self.C_proj(x)
        a = -torch.exp(self.A_log)
        h = x.new_zeros(x.shape[0], x.shape[2], a.shape[1])
        ys = []
        for t in range(x.shape[1]):
            h, y = self.step(h, u[:, t], dt[:, t], bm[:, t], cm[:, t], a)
            ys.append(y)
        return self.out_proj(torch.stack(ys, 1))


class SelectiveScanBroken(SelectiveScanTwin):
    def step(self, h, x_t, dt_t, b_t, c_t, a):
        decay = torch.exp(dt_t[:, :, None] * a)
        drive = dt_t[:, :, None] * b_t[:, :, None] * x_t[:, :, None]  # BUG(mamba_scan_b_axis)
        h = decay * h + drive
        return h, (h * c_t[:, None, :]).sum(-1)
