"""Silent shape bugs in vision, graph, recommender, RL and generative models.

Each twin comes first; its buggy sibling subclasses it and overrides only the forward that holds
the bug, so both have the same parameter names.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .case import SilentBugCase, generator, seeded


# vision: NHWC images permuted (0, 3, 2, 1), which swaps H and W (H == W hides it)
class NHWCPermuteTwin(nn.Module):
    def __init__(self, channels=3, size=8, classes=4):
        super().__init__()
        self.conv = nn.Conv2d(channels, 4, 3, padding=1)
        self.head = nn.Linear(4 * size * size, classes)

    def forward(self, images):
        x = images.permute(0, 3, 1, 2)
        return self.head(torch.relu(self.conv(x)).flatten(1))


class NHWCPermuteBuggy(NHWCPermuteTwin):
    def forward(self, images):
        x = images.permute(0, 3, 2, 1)
        return self.head(torch.relu(self.conv(x)).flatten(1))


# vision: NHWC satellite tiles reshaped to (B, C, H, W), interleaving pixels and bands
class TileReshapeTwin(nn.Module):
    def __init__(self, bands=4, classes=6):
        super().__init__()
        self.conv = nn.Conv2d(bands, 8, 3, padding=1)
        self.head = nn.Linear(8, classes)

    def forward(self, tiles):
        x = tiles.permute(0, 3, 1, 2)
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class TileReshapeBuggy(TileReshapeTwin):
    def forward(self, tiles):
        B, H, W, C = tiles.shape
        x = tiles.reshape(B, C, H, W)
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


# vision (multiple-instance learning): attention scores flattened, so the softmax runs over every
# patch of every slide in the batch instead of per slide
class MILPoolTwin(nn.Module):
    def __init__(self, features=8, classes=2):
        super().__init__()
        self.score = nn.Linear(features, 1)
        self.head = nn.Linear(features, classes)

    def forward(self, patches):
        a = torch.softmax(self.score(patches).squeeze(-1), dim=1).unsqueeze(-1)
        return self.head((a * patches).sum(dim=1))


class MILPoolBuggy(MILPoolTwin):
    def forward(self, patches):
        B, N, _ = patches.shape
        a = torch.softmax(self.score(patches).flatten(), dim=0).view(B, N, 1)
        return self.head((a * patches).sum(dim=1))


# graphs: a graph-level readout averaged over the batch of graphs (B == nodes)
class GraphReadoutTwin(nn.Module):
    def __init__(self, features=5, hidden=8, classes=3):
        super().__init__()
        self.lin = nn.Linear(features, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, adj, x):
        h = torch.relu(adj @ self.lin(x))
        return self.head(h.mean(dim=1))


class GraphReadoutBuggy(GraphReadoutTwin):
    def forward(self, adj, x):
        h = torch.relu(adj @ self.lin(x))
        return self.head(h.mean(dim=0))


# graphs: degree normalisation broadcast over the columns (divides by each neighbour's degree)
class MeanAggregateTwin(nn.Module):
    def __init__(self, features=5, hidden=8):
        super().__init__()
        self.lin = nn.Linear(features, hidden)

    def forward(self, adj, x):
        deg = adj.sum(dim=-1)
        return torch.relu((adj / deg.unsqueeze(-1)) @ self.lin(x))


class MeanAggregateBuggy(MeanAggregateTwin):
    def forward(self, adj, x):
        deg = adj.sum(dim=-1)
        return torch.relu((adj / deg.unsqueeze(1)) @ self.lin(x))


# RL: Q(s, a) gathered along the batch axis
class QGatherTwin(nn.Module):
    def __init__(self, obs=6, actions=4):
        super().__init__()
        self.q = nn.Linear(obs, actions)

    def forward(self, obs, actions):
        return self.q(obs).gather(1, actions.unsqueeze(1)).squeeze(1)


class QGatherBuggy(QGatherTwin):
    def forward(self, obs, actions):
        return self.q(obs).gather(0, actions.unsqueeze(1)).squeeze(1)


# RL: the DQN target's max taken over the batch (B == actions)
class DQNLossTwin(nn.Module):
    def __init__(self, obs=6, actions=4, gamma=0.9):
        super().__init__()
        self.gamma = gamma
        self.q = nn.Linear(obs, actions)
        self.target = nn.Linear(obs, actions).requires_grad_(False)   # synced from q, never trained

    def forward(self, obs, actions, rewards, next_obs):
        q_sa = self.q(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        q_next = self.target(next_obs).detach()
        td = rewards + self.gamma * q_next.max(dim=1).values
        return F.smooth_l1_loss(q_sa, td)


class DQNLossBuggy(DQNLossTwin):
    def forward(self, obs, actions, rewards, next_obs):
        q_sa = self.q(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        q_next = self.target(next_obs).detach()
        td = rewards + self.gamma * q_next.max(dim=0).values
        return F.smooth_l1_loss(q_sa, td)


# recommenders: a softmax over the batch of users instead of over the items
class NextItemTwin(nn.Module):
    def __init__(self, users=10, items=20, dim=8):
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)

    def forward(self, user_ids):
        scores = self.user(user_ids) @ self.item.weight.t()
        return F.log_softmax(scores, dim=-1)


class NextItemBuggy(NextItemTwin):
    def forward(self, user_ids):
        scores = self.user(user_ids) @ self.item.weight.t()
        return F.log_softmax(scores, dim=0)


# recommenders: a two-tower dot product summed over the batch (B == embedding dim)
class TwoTowerTwin(nn.Module):
    def __init__(self, users=10, items=20, dim=8):
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)

    def forward(self, user_ids, item_ids):
        return (self.user(user_ids) * self.item(item_ids)).sum(dim=1)


class TwoTowerBuggy(TwoTowerTwin):
    def forward(self, user_ids, item_ids):
        return (self.user(user_ids) * self.item(item_ids)).sum(dim=0)


# generative (diffusion): the first sample's time embedding added to every sample
class TimeEmbedBlockTwin(nn.Module):
    def __init__(self, channels=4, tdim=6):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.t_mlp = nn.Linear(tdim, channels)

    def forward(self, x, t_emb):
        temb = self.t_mlp(t_emb)
        return torch.relu(self.conv(x) + temb[:, :, None, None])


class TimeEmbedBlockBuggy(TimeEmbedBlockTwin):
    def forward(self, x, t_emb):
        temb = self.t_mlp(t_emb)
        return torch.relu(self.conv(x) + temb[0][:, None, None])


# generative (diffusion): per-sample alpha_bar (B,) broadcast against the image width (B == W)
class NoisingLossTwin(nn.Module):
    def __init__(self, channels=3, steps=50):
        super().__init__()
        self.register_buffer("alpha_bar", torch.linspace(0.99, 0.02, steps))
        self.eps = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x0, t, noise):
        a = self.alpha_bar[t].view(-1, 1, 1, 1)
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(self.eps(x_t), noise)


class NoisingLossBuggy(NoisingLossTwin):
    def forward(self, x0, t, noise):
        a = self.alpha_bar[t]
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(self.eps(x_t), noise)


def _normal(*shape, seed=0):
    return torch.randn(*shape, generator=generator(seed))


def _ids(shape, high, seed=0):
    return torch.randint(0, high, shape, generator=generator(seed))


def _graphs(batch, nodes, features, seed=0):
    adj = (torch.rand(batch, nodes, nodes, generator=generator(seed)) < 0.4).float()
    adj = adj + torch.eye(nodes)          # self-loops: every degree ≥ 1
    return adj, _normal(batch, nodes, features, seed=seed + 1)


STRUCTURED_CASES = [
    SilentBugCase("vision_permute_swaps_h_and_w", "vision", seeded(NHWCPermuteBuggy),
                  seeded(NHWCPermuteTwin), lambda: (_normal(2, 8, 8, 3),), "permute",
                  "images.permute(0, 3, 2, 1)", "NHWC to NCHW: images.permute(0, 3, 1, 2)"),
    SilentBugCase("vision_nhwc_reshaped_to_nchw", "vision", seeded(TileReshapeBuggy),
                  seeded(TileReshapeTwin), lambda: (_normal(2, 6, 6, 4),), "reshape",
                  "x = tiles.reshape(B, C, H, W)", "NHWC to NCHW: tiles.permute(0, 3, 1, 2)"),
    SilentBugCase("vision_mil_softmax_across_slides", "vision", seeded(MILPoolBuggy),
                  seeded(MILPoolTwin), lambda: (_normal(3, 5, 8),), "flatten",
                  "self.score(patches).flatten(), dim=0)",
                  "attention weights over each slide's patches: softmax(scores, dim=1) per sample",
                  aliases=("softmax",)),
    SilentBugCase("graph_readout_mean_over_batch", "graphs", seeded(GraphReadoutBuggy),
                  seeded(GraphReadoutTwin), lambda: _graphs(6, 6, 5), "mean",
                  "self.head(h.mean(dim=0))", "average each graph's nodes: h.mean(dim=1)"),
    SilentBugCase("graph_degree_norm_wrong_axis", "graphs", seeded(MeanAggregateBuggy),
                  seeded(MeanAggregateTwin), lambda: _graphs(3, 6, 5), "div",
                  "(adj / deg.unsqueeze(1))", "average over each node's neighbours: deg.unsqueeze(-1)",
                  aliases=("truediv", "divide", "/", "broadcast")),
    SilentBugCase("rl_gather_along_batch", "RL", seeded(QGatherBuggy), seeded(QGatherTwin),
                  lambda: (_normal(8, 6), _ids((8,), 4, seed=1)), "gather",
                  "self.q(obs).gather(0,", "pick each sample's taken action: gather(1, actions[:, None])"),
    SilentBugCase("rl_dqn_max_over_batch", "RL", seeded(DQNLossBuggy), seeded(DQNLossTwin),
                  lambda: (_normal(4, 6), _ids((4,), 4, seed=1), _normal(4, seed=2), _normal(4, 6, seed=3)),
                  "max", "q_next.max(dim=0)", "the best next action per sample: q_next.max(dim=1)"),
    SilentBugCase("rec_log_softmax_over_users", "recommenders", seeded(NextItemBuggy),
                  seeded(NextItemTwin), lambda: (_ids((8,), 10),), "log_softmax",
                  "F.log_softmax(scores, dim=0)", "a distribution over the items per user: dim=-1"),
    SilentBugCase("rec_two_tower_sum_over_batch", "recommenders", seeded(TwoTowerBuggy),
                  seeded(TwoTowerTwin), lambda: (_ids((8,), 10), _ids((8,), 20, seed=1)), "sum",
                  ".sum(dim=0)", "one dot product per (user, item) pair: sum(dim=1)"),
    SilentBugCase("gen_time_embedding_first_sample", "generative", seeded(TimeEmbedBlockBuggy),
                  seeded(TimeEmbedBlockTwin), lambda: (_normal(3, 4, 5, 5), _normal(3, 6, seed=1)),
                  "__getitem__", "temb[0][:, None, None]",
                  "add each sample's own time embedding: temb[:, :, None, None]",
                  aliases=("getitem", "temb[0]", "[0]")),
    SilentBugCase("gen_alpha_bar_broadcast_on_width", "generative", seeded(NoisingLossBuggy),
                  seeded(NoisingLossTwin),
                  lambda: (_normal(8, 3, 8, 8), _ids((8,), 50, seed=1), _normal(8, 3, 8, 8, seed=2)),
                  "mul", "x_t = a.sqrt() * x0", "scale each sample by its own alpha_bar: a.view(-1, 1, 1, 1)",
                  aliases=("multiply", "*", "broadcast")),
]
