"""Near misses of the failure-blame rules of rounds 5–7: broken models that raise the same torch error
as the case a rule was written for, but whose right fix is another one.

Each ``build(fixed)`` returns ``(model, inputs)``; ``fixed=True`` is the hand-fixed twin with the same
parameter names (``load_state_dict`` carries the weights), the truth checked with plain torch. The
comment above each case says which rule it is a near miss of, and why that rule's fix would be wrong.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


# trailing_axes_rules: a query mask (B, T) times scores (B, H, T, S) with H == T by chance.
# The missing axes are not all trailing: the mask belongs on dim 2, mask[:, None, :, None];
# mask[:, :, None, None] runs and masks heads instead of queries.
class QueryMaskedScores(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.q = nn.Linear(8, 16)
        self.k = nn.Linear(8, 16)

    def forward(self, x, ctx, qmask):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, 4, 4).transpose(1, 2)                 # (B, H=4, T=4, 4)
        k = self.k(ctx).view(B, ctx.shape[1], 4, 4).transpose(1, 2)    # (B, 4, S=6, 4)
        scores = q @ k.transpose(-2, -1)                               # (B, 4, 4, 6)
        m = qmask[:, None, :, None] if self.fixed else qmask
        return scores * m


def trailing_query_mask(fixed=False):
    torch.manual_seed(0)
    qmask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    return QueryMaskedScores(fixed), (torch.randn(2, 4, 8), torch.randn(2, 6, 8), qmask)


# edge_index_rules: (N, 2) integer pixel coordinates into a feature volume (H, W, C), read with a row
# index where the 2-D lookup vol[pos[:, 0], pos[:, 1]] was meant; pos.t() gathers whole rows (N, W, C).
class PointLookup(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.vol = nn.Parameter(torch.randn(6, 5, 3))

    def forward(self, pos, w):
        vals = self.vol[pos[:, 0], pos[:, 1]] if self.fixed else self.vol[pos[0]]
        return vals * w[:, None]


def edge_coordinates(fixed=False):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    pos = torch.stack([torch.randint(0, 6, (6,), generator=g), torch.randint(0, 5, (6,), generator=g)], dim=1)
    return PointLookup(fixed), (pos, torch.rand(6))


# cache_axis_rules: two segments joined along the sequence (right), then a positional table built for
# one segment (the bug: max_len too short). Joining along the batch instead runs (the table broadcasts
# over dim 0) and doubles the batch.
class TwoSegmentEncoder(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 10 if fixed else 5, 8))
        self.out = nn.Linear(8, 3)

    def forward(self, a, b):
        x = torch.cat([a, b], dim=1)                                   # (B, 2T, D)
        return self.out(x + self.pos)


def cache_two_segments(fixed=False):
    torch.manual_seed(0)
    return TwoSegmentEncoder(fixed), (torch.randn(2, 5, 8), torch.randn(2, 5, 8))


# cache_axis_rules: a KV cache grown correctly along the sequence, but the query projection is twice
# as wide (2H heads): joining the cache along the heads would make the matmul run.
class WideQueryCache(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.q = nn.Linear(16, 16 if fixed else 32)
        self.kv = nn.Linear(16, 32)

    def forward(self, x, past_k):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, -1, 4).transpose(1, 2)               # (B, 8, T, 4): should be 4 heads
        k = self.kv(x)[..., :16].view(B, T, 4, 4).transpose(1, 2)     # (B, 4, T, 4)
        k = torch.cat([past_k, k], dim=2)                             # (B, 4, 2T, 4): right
        return (q @ k.transpose(-2, -1)).softmax(-1)


def cache_wide_query(fixed=False):
    torch.manual_seed(0)
    return WideQueryCache(fixed), (torch.randn(2, 3, 16), torch.randn(2, 4, 3, 4))


# einsum_label_rules: the equation is right; the value was projected from the query stream (Tq rows)
# instead of the context (Tk rows). Relabelling v as 'bhqd' runs and sums the attention over keys alone.
class CrossAttentionValueFromQuery(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)
        self.v = nn.Linear(16, 16)

    def forward(self, x, ctx):
        B, Tq, _ = x.shape
        Tk = ctx.shape[1]
        q = self.q(x).view(B, Tq, 2, 8).transpose(1, 2)
        k = self.k(ctx).view(B, Tk, 2, 8).transpose(1, 2)
        src = ctx if self.fixed else x
        v = self.v(src).view(B, src.shape[1], 2, 8).transpose(1, 2)
        attn = torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)
        return torch.einsum("bhqk,bhkd->bhqd", attn, v)


def einsum_value_from_query(fixed=False):
    torch.manual_seed(0)
    return CrossAttentionValueFromQuery(fixed), (torch.randn(2, 5, 16), torch.randn(2, 7, 16))


# reduced_batch_rules: an unbatched query (D,) against prototypes stored as columns (D, K): the cosine
# over dim 0 is meant. The class weights were sized D instead of K; dim=1 runs on per-feature numbers.
class PrototypeScores(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.protos = nn.Parameter(torch.randn(12, 5))                # (D, K)
        self.class_weight = nn.Parameter(torch.rand(5 if fixed else 12))

    def forward(self, q):
        sim = F.cosine_similarity(q[:, None], self.protos, dim=0)     # (K,)
        return sim * self.class_weight


def reduced_unbatched(fixed=False):
    torch.manual_seed(0)
    return PrototypeScores(fixed), (torch.randn(12),)


# cat_operand_rules.reshape_factor: the class conv was built for 2 anchors (10 channels), not 3 (15).
# Regrouping the *box* tensor by 6 makes the rows agree and runs with nonsense boxes.
class TwoAnchorClassHead(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.cls = nn.Conv2d(8, 15 if fixed else 10, 1)
        self.box = nn.Conv2d(8, 12, 1)

    def forward(self, feat):
        B = feat.shape[0]
        box = self.box(feat).permute(0, 2, 3, 1).reshape(B, -1, 4)    # (B, H·W·3, 4)
        cls = self.cls(feat).permute(0, 2, 3, 1).reshape(B, -1, 5)    # (B, H·W·2, 5)
        return torch.cat([box, cls], dim=-1)


def cat_wrong_anchor_count(fixed=False):
    torch.manual_seed(0)
    return TwoAnchorClassHead(fixed), (torch.randn(2, 8, 4, 4),)


# cat_operand_rules.unflattened_map: per-token features (B, T, D) joined with a per-sample vector
# (B, F); the next Linear takes D + F per token: the vector is to be repeated over the tokens, not the
# sequence flattened.
class TokenConditioning(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(20, 8)
        self.mix = nn.Linear(8 + 4, 6)

    def forward(self, ids, cond):
        h = self.emb(ids)                                             # (B, T, 8)
        if self.fixed:
            cond = cond[:, None].expand(-1, h.shape[1], -1)
        return self.mix(torch.cat([h, cond], dim=-1))


def cat_sequence_with_vector(fixed=False):
    torch.manual_seed(0)
    return TokenConditioning(fixed), (torch.randint(0, 20, (2, 5)), torch.randn(2, 4))


# head_dim_rules: a feature map (B, C, H, W) scaled per column by a Linear built C·W wide instead of W:
# no heads anywhere, the Linear's size is the bug.
class ColumnScale(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.scale = nn.Linear(6, 8 if fixed else 32)

    def forward(self, x, cond):
        return self.conv(x) * self.scale(cond)[:, None, None, :]


def head_dim_not_heads(fixed=False):
    torch.manual_seed(0)
    return ColumnScale(fixed), (torch.randn(2, 3, 8, 8), torch.randn(2, 6))


# prefix_token_rules: question and context joined along the sequence, padding mask built for the
# question only. The context has padding of its own: "keep" columns would attend to it.
class PairEncoder(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(30, 16, padding_idx=0)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, question, context):
        x = torch.cat([self.emb(question), self.emb(context)], dim=1)  # (B, Tq + Tc, E)
        mask = question == 0
        if self.fixed:
            mask = torch.cat([mask, context == 0], dim=1)
        return self.attn(x, x, x, key_padding_mask=mask)[0]


def prefix_second_sequence(fixed=False):
    torch.manual_seed(0)
    question = torch.tensor([[5, 7, 9, 3, 2, 0], [4, 8, 2, 6, 0, 0]])
    context = torch.tensor([[6, 0, 0], [3, 9, 0]])
    return PairEncoder(fixed), (question, context)


# short_sequence_rules: a batch-first text CNN given seq-first ids (T, N) = (6, 2): the convs read the
# batch of 2 as time. Padding "the sentences" pads the batch axis and runs.
class SeqFirstTextCNN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(50, 8, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(8, 4, k) for k in (3, 4))
        self.fc = nn.Linear(8, 2)

    def forward(self, ids):
        if self.fixed:
            ids = ids.t()
        x = self.emb(ids).transpose(1, 2)
        return self.fc(torch.cat([torch.relu(c(x)).amax(-1) for c in self.convs], 1))


def short_seq_first_ids(fixed=False):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return SeqFirstTextCNN(fixed), (torch.randint(1, 50, (6, 2), generator=g),)


# split_axis_rules: two views stacked along the batch by the data loader, chunked along dim 0 on
# purpose; the projection head was built for half the features.
class TwoViewHead(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.enc = nn.Linear(10, 16)
        self.head = nn.Linear(16 if fixed else 8, 4)

    def forward(self, views):
        a, b = self.enc(views).chunk(2, dim=0)                       # the two views: right
        return (self.head(a) * self.head(b)).sum(-1)


def split_two_views(fixed=False):
    torch.manual_seed(0)
    return TwoViewHead(fixed), (torch.randn(6, 10),)


# window_rules: a channels-first map (B, C, H, W) given to a Swin window partition that unpacks
# (B, H, W, C): 96 channels "are not a multiple of 7". Padding the channels runs; the layout is the bug.
class ChannelsFirstWindows(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.ws = 7

    def forward(self, x):
        if self.fixed:
            x = x.permute(0, 2, 3, 1)
        B, H, W, C = x.shape
        ws = self.ws
        x = x.view(B, H // ws, ws, W // ws, ws, C)
        return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)


def window_channels_first(fixed=False):
    torch.manual_seed(0)
    return ChannelsFirstWindows(fixed), (torch.randn(1, 96, 14, 14),)


# sampling_grid_rules: sample points given as (x, y, z) for a 2-D image: grid (N, 2, P, 3) with
# H_out = 2 rows of points. Moving dim 1 last runs; the bug is the third coordinate.
class PointSampler(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, img, pts):
        grid = pts[..., :2] if self.fixed else pts
        return F.grid_sample(img, grid, align_corners=False)


def grid_three_coords(fixed=False):
    torch.manual_seed(0)
    return PointSampler(fixed), (torch.randn(2, 3, 8, 8), torch.rand(2, 2, 5, 3) * 2 - 1)


# shortcut_rules: an FPN merge, lateral 1×1 conv of c4 plus the coarser top-down map of c5; the top map
# is to be upsampled (F.interpolate), not the lateral strided: that runs at the coarse size.
class FPNMerge(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.lateral = nn.Conv2d(8, 16, 1)
        self.top = nn.Conv2d(32, 16, 1)

    def forward(self, c4, c5):
        top = self.top(c5)
        if self.fixed:
            top = F.interpolate(top, scale_factor=2.0, mode="nearest")
        return self.lateral(c4) + top


def shortcut_fpn_merge(fixed=False):
    torch.manual_seed(0)
    return FPNMerge(fixed), (torch.randn(2, 8, 16, 16), torch.randn(2, 32, 8, 8))


# sequence_target_rules: a padded batch (padding_idx 0 at the end of the shorter rows): the last step of
# a padded row is padding; the sequence's vector is its last *real* step, out[i, lengths[i] - 1].
class PaddedGRUClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(20, 8, padding_idx=0)
        self.rnn = nn.GRU(8, 12, batch_first=True)
        self.fc = nn.Linear(12, 3)

    def forward(self, ids, target):
        out, _ = self.rnn(self.emb(ids))
        if self.fixed:
            last = (ids != 0).sum(1) - 1
            out = out[torch.arange(ids.shape[0]), last]
        return F.cross_entropy(self.fc(out), target)


def sequence_target_padded(fixed=False):
    torch.manual_seed(0)
    ids = torch.tensor([[3, 5, 7, 2, 0, 0], [4, 9, 1, 6, 8, 2], [5, 5, 0, 0, 0, 0]])
    return PaddedGRUClassifier(fixed), (ids, torch.tensor([0, 2, 1]))


CASES = {f.__name__: f for f in (
    trailing_query_mask, edge_coordinates, cache_two_segments, cache_wide_query, einsum_value_from_query,
    reduced_unbatched, cat_wrong_anchor_count, cat_sequence_with_vector, head_dim_not_heads,
    prefix_second_sequence, short_seq_first_ids, split_two_views, window_channels_first, grid_three_coords,
    shortcut_fpn_merge, sequence_target_padded)}
