"""Near misses of the older failure-blame rules (rounds 1–4): broken models that raise the same torch
error as the case a rule was written for, but whose right fix is another one.

Each ``build(fixed)`` returns ``(model, inputs)``; ``fixed=True`` is the hand-fixed twin with the same
parameter names, the truth checked with plain torch. The comment above each case says which rule it is
a near miss of, and why that rule's fix would run and compute something else.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


# layer_rules.conv (layout): a causal conv's trimmed map (N, 8, 16) into Conv1d(in_channels=16). The
# slice hid the conv that made it, and 16 sits on the last dim by chance: x.transpose(1, 2) ran and
# convolved over the channels. Truth: in_channels=8.
class CausalStack(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 3, padding=2)
        self.c2 = nn.Conv1d(8 if fixed else 16, 6, 3, padding=1)

    def forward(self, x):
        y = self.c1(x)[..., :-2]                                      # causal trim: (N, 8, 16)
        return self.c2(torch.relu(y))


def conv_after_trim(fixed=False):
    torch.manual_seed(0)
    return CausalStack(fixed), (torch.randn(2, 4, 16),)


# layer_rules.linear (layout): token embeddings joined with per-token features, (N, T=8, 12 + 4), into
# Linear(in_features=8): T is 8 by chance, and moving it last mixes the positions. Truth: in_features=16.
class TokFeat(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.emb = nn.Embedding(20, 12)
        self.head = nn.Linear(16 if fixed else 8, 5)

    def forward(self, ids, feats):
        return self.head(torch.cat([self.emb(ids), feats], dim=-1))   # (N, 8, 16)


def linear_after_cat(fixed=False):
    torch.manual_seed(0)
    return TokFeat(fixed), (torch.randint(0, 20, (2, 8)), torch.randn(2, 8, 4))


# layer_rules.batch_norm (layout): a conv map cropped to (N, 8, 16) into BatchNorm1d(16): normalizing
# the positions as channels runs. Truth: num_features=8.
class CropNorm(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.c = nn.Conv1d(4, 8, 3, padding=2)
        self.bn = nn.BatchNorm1d(8 if fixed else 16)

    def forward(self, x):
        return self.bn(self.c(x)[..., 1:-1])                          # (N, 8, 16)


def bn_after_crop(fixed=False):
    torch.manual_seed(0)
    return CropNorm(fixed), (torch.randn(2, 4, 16),)


# layer_rules.layer_norm (layout): a Linear's (N, 9, 16) output without its CLS row, (N, 8, 16), into
# LayerNorm(8): normalizing over the tokens runs. Truth: normalized_shape=16.
class DropCls(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.proj = nn.Linear(6, 16)
        self.norm = nn.LayerNorm(16 if fixed else 8)

    def forward(self, x):
        return self.norm(self.proj(x)[:, 1:])


def ln_after_slice(fixed=False):
    torch.manual_seed(0)
    return DropCls(fixed), (torch.randn(2, 9, 6),)


# layer_rules.rnn (layout): embeddings + features (N, T=8, 16) into LSTM(input_size=8, batch_first):
# transposing runs a 16-step sequence of 8 "features". Truth: input_size=16.
class TokLSTM(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.emb = nn.Embedding(20, 12)
        self.rnn = nn.LSTM(16 if fixed else 8, 6, batch_first=True)

    def forward(self, ids, feats):
        return self.rnn(torch.cat([self.emb(ids), feats], dim=-1))[0]


def lstm_after_cat(fixed=False):
    torch.manual_seed(0)
    return TokLSTM(fixed), (torch.randint(0, 20, (2, 8)), torch.randn(2, 8, 4))


# layer_rules.group_norm (layout): a padded conv map (N, 8, 16) into GroupNorm(4, 16). Truth: num_channels=8.
class PadGN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.c = nn.Conv1d(4, 8, 3)
        self.gn = nn.GroupNorm(4, 8 if fixed else 16)

    def forward(self, x):
        return self.gn(F.pad(self.c(x), (1, 1)))


def gn_after_pad(fixed=False):
    torch.manual_seed(0)
    return PadGN(fixed), (torch.randn(2, 4, 16),)


# rnn_state_rules.hidden_state (batch_first): seq-first data (T=5, N=3, C) and an h0 the model built
# from x.size(0): batch_first=True runs with 5 sequences of 3 steps. Truth: h0 from x.size(1).
class SeqFirstGRU(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.rnn = nn.GRU(4, 6)

    def forward(self, x):
        h0 = torch.zeros(1, x.size(1) if self.fixed else x.size(0), 6)
        return self.rnn(x, h0)[0]


def gru_h0_wrong_batch(fixed=False):
    torch.manual_seed(0)
    return SeqFirstGRU(fixed), (torch.randn(5, 3, 4),)


# op_rules.cat (cat-dim): two conv branches joined on their channels; the 5-tap branch lost a pixel of
# padding each side (14 vs 16). cat(dim=2) "works" and joins the branches along time. Truth: padding=2.
class TwoBranch(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.b3 = nn.Conv1d(4, 8, 3, padding=1)
        self.b5 = nn.Conv1d(4, 8, 5, padding=2 if fixed else 1)
        self.head = nn.Conv1d(16, 6, 1)

    def forward(self, x):
        return self.head(torch.cat([self.b3(x), self.b5(x)], dim=1))


def cat_branch_length(fixed=False):
    torch.manual_seed(0)
    return TwoBranch(fixed), (torch.randn(2, 4, 16),)


# channel_rules.video_frames_first: a Conv3d's map (N, 8, D=16, H, W) into Conv3d(in_channels=16): the
# depth is 16 by chance, transpose(1, 2) convolves over the channels. Truth: in_channels=8.
class Conv3dStack(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.a = nn.Conv3d(1, 8, 3, padding=1)
        self.b = nn.Conv3d(8 if fixed else 16, 4, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def conv3d_depth_is_channels(fixed=False):
    torch.manual_seed(0)
    return Conv3dStack(fixed), (torch.randn(1, 1, 16, 6, 6),)


# mask_rules.mask_dtype: a Hugging Face attention_mask (1 = real token) of a batch padded to max_length,
# so its 1s are the minority: the majority reading "1 = hide" gave mask.bool(), which hides the tokens.
class KeepMaskMHA(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x, attention_mask):
        kpm = attention_mask == 0 if self.fixed else attention_mask
        return self.attn(x, x, x, key_padding_mask=kpm)[0]


def mha_int_mask_max_length(fixed=False):
    torch.manual_seed(0)
    am = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]])
    return KeepMaskMHA(fixed), (torch.randn(2, 8, 8), am)


# mask_rules.sdpa (padding mask): a bool padding mask (True = pad) of a batch padded to max_length, so
# True is the majority: read as "True = token" and only reshaped, SDPA attends to the padding only.
class PadSDPA(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.qkv = nn.Linear(8, 24)

    def forward(self, x, pad):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 4).permute(2, 0, 3, 1, 4)
        m = ~pad[:, None, None, :] if self.fixed else pad
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def sdpa_pad_mask_max_length(fixed=False):
    torch.manual_seed(0)
    pad = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 1]]).bool()
    return PadSDPA(fixed), (torch.randn(2, 8, 8), pad)


# upstream_rules.reduced_wrong_axis: global average pooling over time (right), then a head sized for
# the length (16) instead of the channels (8): mean(dim=1) would pool the channels away.
class PoolHead(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.head = nn.Linear(8 if fixed else 16, 3)

    def forward(self, x):
        return self.head(self.conv(x).mean(dim=2))


def pooled_head_wrong_size(fixed=False):
    torch.manual_seed(0)
    return PoolHead(fixed), (torch.randn(2, 4, 16),)


# groups_rules.depthwise: an inverted residual whose *expansion* is the wrong width (64 for 96); the
# depthwise and the projection after it agree on 96. Rebuilding the depthwise for 64 (then the projection)
# runs, a narrower block. Truth: expand out_channels=96.
class InvResExpand(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.expand = nn.Conv2d(16, 96 if fixed else 64, 1)
        self.dw = nn.Conv2d(96, 96, 3, padding=1, groups=96)
        self.project = nn.Conv2d(96, 24, 1)

    def forward(self, x):
        return self.project(F.relu6(self.dw(F.relu6(self.expand(x)))))


def depthwise_expand_wrong(fixed=False):
    torch.manual_seed(0)
    return InvResExpand(fixed), (torch.randn(2, 16, 8, 8),)


# -- near misses the numbers cannot tell from the rule's own case (a hint names the other reading) ----
# upstream_rules.pixel_shuffle: the conv sized for ×2 (3·2² = 12) and the shuffle built ×3 by mistake —
# the very numbers of round 6's ESPCN, where the conv is the bug. Truth here: PixelShuffle(2).
class SubPixel(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2 if fixed else 3)

    def forward(self, x):
        return self.shuffle(self.conv(x))


def pixel_shuffle_wrong_factor(fixed=False):
    torch.manual_seed(0)
    return SubPixel(fixed), (torch.randn(2, 3, 8, 8),)


# layer_rules._linear_on_channels_first: a conv classifier that forgot its pooling — the same graph as
# the corpus's ConvTagger, where the transpose is right. Truth here: h.mean(-1) before the head.
class ConvClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        return self.head(h.mean(-1) if self.fixed else h)


def conv_classifier_no_pool(fixed=False):
    torch.manual_seed(0)
    return ConvClassifier(fixed), (torch.randn(2, 4, 20),)


CASES = {f.__name__: f for f in (
    conv_after_trim, linear_after_cat, bn_after_crop, ln_after_slice, lstm_after_cat, gn_after_pad,
    gru_h0_wrong_batch, cat_branch_length, conv3d_depth_is_channels, mha_int_mask_max_length,
    sdpa_pad_mask_max_length, pooled_head_wrong_size, depthwise_expand_wrong,
    pixel_shuffle_wrong_factor, conv_classifier_no_pool,
)}
