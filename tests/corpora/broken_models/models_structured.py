"""Broken models and their hand-fixed twins: graphs (message passing, pooling), mixture of
experts, normalising flows, Perceiver and RL policy heads.

Twin first (what the author meant, plain torch), then the broken class (a subclass wherever the
same state_dict can load into both). The wrong line carries ``# BUG(case-name)`` (``# ALSO(case-name)``
for a second line that is part of the same fix). Sizes are tiny: the whole corpus runs in seconds.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- graphs -----------------------------------------------------------------------------------

class MPNNTwin(nn.Module):
    """Sum-aggregated messages from src to dst, then an update on [x, aggregate]."""

    def __init__(self):
        super().__init__()
        self.msg = nn.Linear(8, 8)
        self.upd = nn.Linear(16, 8)

    def forward(self, x, edge_index):
        src, dst = edge_index
        m = self.msg(x[src])                                             # (E, F)
        agg = torch.zeros_like(x).index_add(0, dst, m)                   # (N, F)
        return self.upd(torch.cat([x, agg], dim=-1))


class MPNNBroken(MPNNTwin):
    def forward(self, x, edge_index):
        src, dst = edge_index
        m = self.msg(x[src])
        agg = torch.zeros_like(x).index_add(1, dst, m)  # BUG(gnn_index_add_dim)
        return self.upd(torch.cat([x, agg], dim=-1))


class GraphMaxPoolTwin(nn.Module):
    """Global max pool per graph with a PyG-style batch vector, via scatter_reduce."""

    def __init__(self, num_graphs=2):
        super().__init__()
        self.num_graphs = num_graphs
        self.lin = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x, batch):
        h = F.relu(self.lin(x))
        idx = batch.unsqueeze(1).expand(-1, h.size(1))
        pooled = h.new_zeros(self.num_graphs, h.size(1)).scatter_reduce(
            0, idx, h, "amax", include_self=False)
        return self.head(pooled)


class GraphMaxPoolBroken(GraphMaxPoolTwin):
    def forward(self, x, batch):
        h = F.relu(self.lin(x))
        pooled = h.new_zeros(self.num_graphs, h.size(1)).scatter_reduce(0, batch, h, "amax", include_self=False)  # BUG(gnn_scatter_reduce_index_rank)
        return self.head(pooled)


class MeanGCNTwin(nn.Module):
    """Mean aggregation over in-edges; the same class serves the broken case (float edge list)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, edge_index):
        h = self.lin(x)
        src, dst = edge_index
        deg = torch.zeros(x.size(0)).index_add(0, dst, torch.ones(dst.numel()))
        agg = torch.zeros_like(h).index_add(0, dst, h[src])
        return F.relu(agg / deg.clamp(min=1)[:, None])


# --- mixture of experts -----------------------------------------------------------------------

class MoETwin(nn.Module):
    """Top-2 routing over 4 experts, weights renormalised over the chosen two."""

    def __init__(self, d=8, n_experts=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, n_experts)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(n_experts)])

    def route(self, h, dim):
        w, idx = self.router(h).softmax(-1).topk(self.k, dim=dim)  # ALSO(moe_topk_dim)
        return w / w.sum(-1, keepdim=True), idx

    def select(self, h, idx):
        allout = torch.stack([e(h) for e in self.experts], dim=1)        # (BT, E, D)
        return allout.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.size(-1)))

    def forward(self, x):
        B, T, D = x.shape
        h = x.reshape(-1, D)
        w, idx = self.route(h, -1)                                       # (BT, k)
        y = (w.unsqueeze(-1) * self.select(h, idx)).sum(1)
        return y.view(B, T, D)


class MoECombineBroken(MoETwin):
    def forward(self, x):
        B, T, D = x.shape
        h = x.reshape(-1, D)
        w, idx = self.route(h, -1)
        y = (w * self.select(h, idx)).sum(1)  # BUG(moe_combine_weights_unsqueeze)
        return y.view(B, T, D)


class MoETopkDimBroken(MoETwin):
    def forward(self, x):
        B, T, D = x.shape
        h = x.reshape(-1, D)
        w, idx = self.route(h, 0)  # BUG(moe_topk_dim)
        y = (w.unsqueeze(-1) * self.select(h, idx)).sum(1)
        return y.view(B, T, D)


# --- normalising flows ------------------------------------------------------------------------

class CouplingFlowTwin(nn.Module):
    """RealNVP affine coupling; returns the per-sample negative log-likelihood (B,)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 4))

    def couple(self, x):
        xa, xb = x.chunk(2, dim=1)
        s, t = self.net(xa).chunk(2, dim=1)
        s = torch.tanh(s)
        return torch.cat([xa, xb * torch.exp(s) + t], dim=1), s

    def nll(self, z, logdet):
        log_pz = -0.5 * (z ** 2).sum(dim=1) - 0.5 * z.size(1) * math.log(2 * math.pi)
        return -(log_pz + logdet)

    def forward(self, x):
        z, s = self.couple(x)
        return self.nll(z, s.sum(dim=1))


class CouplingFlowBroken(CouplingFlowTwin):
    def forward(self, x):
        z, s = self.couple(x)
        logdet = s.sum(dim=0)  # BUG(flow_logdet_reduce_dim)
        return self.nll(z, logdet)


# --- Perceiver --------------------------------------------------------------------------------

class PerceiverTwin(nn.Module):
    """Learned latents cross-attend to the projected inputs."""

    def __init__(self):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(4, 16))
        self.inp = nn.Linear(6, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        kv = self.inp(x)
        lat = self.latents.unsqueeze(0).expand(x.size(0), -1, -1)
        out, _ = self.attn(lat, kv, kv)
        return self.head(out.mean(1))


class PerceiverLatentsBroken(PerceiverTwin):
    def forward(self, x):
        kv = self.inp(x)
        lat = self.latents.unsqueeze(1)  # BUG(perceiver_latents_unsqueeze)
        out, _ = self.attn(lat, kv, kv)
        return self.head(out.mean(1))


class PerceiverProjUnusedBroken(PerceiverTwin):
    def forward(self, x):
        kv = x  # BUG(perceiver_input_proj_unused)
        lat = self.latents.unsqueeze(0).expand(x.size(0), -1, -1)
        out, _ = self.attn(lat, kv, kv)
        return self.head(out.mean(1))


# --- RL policy / value heads ------------------------------------------------------------------

class MaskedPolicyTwin(nn.Module):
    """Actor-critic head; `legal` is a float 0/1 mask, 1 = the action is allowed."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.pi = nn.Linear(16, 4)
        self.v = nn.Linear(16, 1)

    def forward(self, obs, legal):
        h = torch.tanh(self.body(obs))
        logits = self.pi(h).masked_fill(legal == 0, -1e9)
        return torch.log_softmax(logits, -1), self.v(h).squeeze(-1)


class MaskedPolicyBroken(MaskedPolicyTwin):
    def forward(self, obs, legal):
        h = torch.tanh(self.body(obs))
        logits = self.pi(h).masked_fill(legal, -1e9)  # BUG(rl_action_mask_float)
        return torch.log_softmax(logits, -1), self.v(h).squeeze(-1)


class PolicyMLP(nn.Module):
    """Plain policy logits; the bug of its case is in the loss."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, obs):
        return self.net(obs)


def pg_loss_twin(logits, actions, adv):
    logp = F.log_softmax(logits, -1).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(logp * adv).mean()


def pg_loss_broken(logits, actions, adv):
    logp = F.log_softmax(logits, -1).gather(1, actions.unsqueeze(1)).squeeze(1)  # BUG(rl_actions_float_gather)
    return -(logp * adv).mean()
