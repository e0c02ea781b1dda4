"""A corpus of realistic broken models, each with what ``layerlab.inspect`` must say about it.

Every case is a small model as people write them, with one (or two) of the mistakes that make a
forward raise, and the answer a careful human would give: where it failed, why (``cause``), the
one mechanical fix (or none, where no fix is mechanical or the evidence is ambiguous), what
re-running with that fix gives, and — where the fix is mechanical and the model then runs — the
same model written correctly by hand (``hand``), whose parameter names match so that the fixed
copy's weights load into it and the two must compute the same outputs.

The models live in this file so that the op trace's source lines point here: an op location is
written ``"@tag"`` and means the line of this file that carries the comment ``# @tag``
(:func:`site` turns it into the ``file:line`` layerlab reports).

Sizes are chosen so that no size sits on two axes by accident unless the case is about exactly
that (the ``*_coincides`` cases: a layer's size equals another axis of a correctly laid-out input,
where a layout "fix" would run and compute garbage).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

Fix = Tuple[str, str, str]  # (kind, where, code)


@dataclass(frozen=True)
class Case:
    """One broken model and the expected diagnosis.

    Attributes:
        path: the module call that raised (``failure.path``; ``""`` is the root).
        cause: ``failure.diagnosis.cause``.
        fix: ``(kind, where, code)`` of ``diagnosis.fix``, ``None`` when no fix may be offered.
            ``where`` is a module path, or ``"@tag"`` for an op's line in this file.
        status: ``diagnosis.verified.status`` (``None`` when there is no fix to verify).
        op: ``(op name, "@tag")`` when an op of the model's own code raised, else ``None`` (then
            ``failure.op`` must be ``None``: a torch.nn layer raised).
        hand: the model fixed by hand (same parameter names), when the fix is mechanical and runs.
        tempting: for layout cases, the size change that runs but computes garbage — it must not
            be the fix, and where listed as an alternative it must carry a caveat.
        then: the failures met while verifying, in order: ``(where contains, fix or None)``.
    """

    name: str
    model: Callable[[], nn.Module]
    inputs: Callable[[], Tuple[tuple, dict]]
    path: str
    cause: str
    fix: Optional[Fix] = None
    status: Optional[str] = None
    op: Optional[Tuple[str, str]] = None
    hand: Optional[Callable[[], nn.Module]] = None
    tempting: Optional[str] = None
    then: Tuple[Tuple[str, Optional[Fix]], ...] = ()


# -- where ops sit ----------------------------------------------------------------------------------
_FILE = os.path.abspath(__file__)
_LINES: Dict[str, int] = {}


def line_of(tag: str) -> int:
    if not _LINES:
        with open(_FILE, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if "# @" in text:
                    _LINES[text.rsplit("# @", 1)[1].split()[0]] = number
    return _LINES[tag]


def site(where: str) -> str:
    """``"@tag"`` → ``"tests/probe/corpus.py:41"`` (relative to the working directory, as layerlab
    prints it); a module path is returned as it is."""
    if not where.startswith("@"):
        return where
    rel = os.path.relpath(_FILE)
    shown = rel if not rel.startswith("..") else os.path.basename(_FILE)
    return f"{shown}:{line_of(where[1:])}"


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype)


def _ids(high, *shape, seed=0):
    return torch.randint(0, high, shape, generator=_gen(seed))


# ==================================================================================================
# layout: the data is right, on another axis than the layer reads
# ==================================================================================================
class TextCNN(nn.Module):
    """Embedding → Conv1d without the transpose: Conv1d reads (B, E, T), gets (B, T, E)."""

    def __init__(self, vocab=50, emb=16, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.conv = nn.Conv1d(emb, 32, kernel_size=3, padding=1)
        self.fc = nn.Linear(32, classes)

    def forward(self, ids):
        x = self.emb(ids)
        x = F.relu(self.conv(x))
        return self.fc(x.amax(dim=-1))


class TextCNNHand(TextCNN):
    def forward(self, ids):
        x = self.emb(ids).transpose(1, 2)
        x = F.relu(self.conv(x))
        return self.fc(x.amax(dim=-1))


class SmallCNN(nn.Module):
    """Images straight from PIL/numpy are (N, H, W, 3); Conv2d reads NCHW."""

    def __init__(self, classes=4):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, img):
        x = F.relu(self.conv(img))
        return self.fc(self.pool(x).flatten(1))


class SmallCNNHand(SmallCNN):
    def forward(self, img):
        x = F.relu(self.conv(img.permute(0, 3, 1, 2)))
        return self.fc(self.pool(x).flatten(1))


class ConvLSTM(nn.Module):
    """Conv features (B, C, T) into an LSTM(batch_first=True), which reads (B, T, C)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(6, 24, 3, padding=1)
        self.lstm = nn.LSTM(24, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h = F.relu(self.conv(x))
        out, _ = self.lstm(h)
        return self.head(out[:, -1])


class ConvLSTMHand(ConvLSTM):
    def forward(self, x):
        h = F.relu(self.conv(x))
        out, _ = self.lstm(h.transpose(1, 2))
        return self.head(out[:, -1])


class ConvGRU(nn.Module):
    """Conv features (B, C, T) into a GRU with the default batch_first=False: it reads (T, B, C)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(5, 24, 3, padding=1)
        self.gru = nn.GRU(24, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h = F.relu(self.conv(x))
        out, _ = self.gru(h)
        return self.head(out[-1])


class ConvGRUHand(ConvGRU):
    def forward(self, x):
        h = F.relu(self.conv(x))
        out, _ = self.gru(h.permute(2, 0, 1))
        return self.head(out[-1])


class ConvBlockLN(nn.Module):
    """LayerNorm(C) after a Conv2d: LayerNorm normalizes the last dim (W), not C."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return F.gelu(self.norm(self.conv(x)))


class ConvBlockLNHand(ConvBlockLN):
    def forward(self, x):
        y = self.conv(x)
        return F.gelu(self.norm(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


class TokenMLP(nn.Module):
    """BatchNorm1d on per-token features (B, T, C): it normalizes dim 1 (T)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        h = self.bn(self.proj(x))
        return self.out(F.relu(h)).mean(1)


class TokenMLPHand(TokenMLP):
    def forward(self, x):
        h = self.bn(self.proj(x).transpose(1, 2)).transpose(1, 2)
        return self.out(F.relu(h)).mean(1)


class PatchMixer(nn.Module):
    """GroupNorm on channels-last patches (B, H, W, C) from a Linear patch embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(12, 32)
        self.norm = nn.GroupNorm(4, 32)
        self.head = nn.Linear(32, 3)

    def forward(self, patches):
        h = self.norm(self.embed(patches))
        return self.head(h.mean((1, 2)))


class PatchMixerHand(PatchMixer):
    def forward(self, patches):
        h = self.embed(patches)
        h = self.norm(h.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.head(h.mean((1, 2)))


class ConvTagger(nn.Module):
    """A per-time-step Linear on conv features (B, C, T): Linear reads the last dim."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 32, 3, padding=1)
        self.tag = nn.Linear(32, 5)

    def forward(self, x):
        h = F.relu(self.conv(x))
        return self.tag(h)


class ConvTaggerHand(ConvTagger):
    def forward(self, x):
        h = F.relu(self.conv(x))
        return self.tag(h.transpose(1, 2))


class PaddedEncoder(nn.Module):
    """nn.MultiheadAttention defaults to batch_first=False; (B, T, E) inputs and a (B, T) padding
    mask give it away."""

    def __init__(self, batch_first=False):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=batch_first)
        self.head = nn.Linear(16, 2)

    def forward(self, ids, pad):
        x = self.emb(ids)
        y, _ = self.attn(x, x, x, key_padding_mask=pad)
        return self.head(y.mean(1))


# ==================================================================================================
# size: the layout is right (the producer says so) and a size argument is wrong
# ==================================================================================================
class ConvClassifier(nn.Module):
    """in_features computed for a padded conv: 8·8·8, the input is 8·7·7 after Flatten."""

    def __init__(self, in_features=8 * 8 * 8, padding=0):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=padding), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(in_features, 10)

    def forward(self, x):
        return self.classifier(self.features(x))


class TwoConvs(nn.Module):
    def __init__(self, mid_in=8):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(mid_in, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(F.relu(self.c1(x)))


class ConvBN(nn.Module):
    def __init__(self, bn_features=32):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(bn_features)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Conv1dStack(nn.Module):
    """c2's in_channels equals c1's output *length* (8): the input is channels-first (a conv made
    it), so the size is wrong — transposing would run and mix time steps into channels."""

    def __init__(self, c2_in=8):
        super().__init__()
        self.c1 = nn.Conv1d(4, 16, 3)
        self.c2 = nn.Conv1d(c2_in, 8, 3)

    def forward(self, x):
        return self.c2(F.relu(self.c1(x)))


class ConvReLUConv(nn.Module):
    """As Conv1dStack inside a Sequential: the provenance goes through the nn.ReLU module."""

    def __init__(self, c2_in=8):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(4, 16, 3), nn.ReLU(), nn.Conv1d(c2_in, 8, 3))

    def forward(self, x):
        return self.net(x)


class ConvNoPool(nn.Module):
    """Linear(C) on (N, C, H, W) conv features: pool first? flatten? per pixel? Nothing says."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)))


class ConvBN1d(nn.Module):
    """BatchNorm1d(8) after a conv whose output length is 8: channels are dim 1 (16)."""

    def __init__(self, bn_features=8):
        super().__init__()
        self.conv = nn.Conv1d(4, 16, 3)
        self.bn = nn.BatchNorm1d(bn_features)

    def forward(self, x):
        return self.bn(self.conv(x))


class ProjLSTM(nn.Module):
    """LSTM(input_size=10) after a Linear(6, 12) on (B, T=10, 6): the Linear puts its 12 features
    last, so the LSTM's size is wrong — transposing would feed time steps as features."""

    def __init__(self, lstm_in=10):
        super().__init__()
        self.proj = nn.Linear(6, 12)
        self.lstm = nn.LSTM(lstm_in, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        out, _ = self.lstm(torch.tanh(self.proj(x)))
        return self.head(out[:, -1])


class TokenHead(nn.Module):
    """Linear(20, 5) after Linear(16, 32) on (B, T=20, 16): in_features was set to T."""

    def __init__(self, out_in=20):
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.out = nn.Linear(out_in, 5)

    def forward(self, x):
        return self.out(F.relu(self.proj(x)))


class FFNorm(nn.Module):
    """LayerNorm(12) after Linear(16, 24) on (B, T=12, 16): normalized_shape was set to T."""

    def __init__(self, norm_dim=12):
        super().__init__()
        self.proj = nn.Linear(16, 24)
        self.norm = nn.LayerNorm(norm_dim)

    def forward(self, x):
        return self.norm(self.proj(x))


class ResidualMLP(nn.Module):
    """x + ff(x) where the branch ends at 48 features instead of 32."""

    def __init__(self, dim=32, hidden=64, out=48):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, out))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x + self.ff(x))  # @residual


class BagOfWords(nn.Module):
    def __init__(self, vocab=40):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.fc = nn.Linear(8, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


class BagOfWordsHand(BagOfWords):
    def forward(self, ids):
        return self.fc(self.emb(ids.long()).mean(1))


# ==================================================================================================
# rank: a dim is missing or extra
# ==================================================================================================
class FrameEncoder3d(nn.Module):
    """A video model (N, C, D, H, W) given single frames (N, C, H, W)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, clip):
        return self.fc(self.pool(F.relu(self.conv(clip))).flatten(1))


class FrameEncoder3dHand(FrameEncoder3d):
    def forward(self, clip):
        return self.fc(self.pool(F.relu(self.conv(clip.unsqueeze(2)))).flatten(1))


class MnistNet(nn.Module):
    """Conv2d(1, …) given (N, H, W) grayscale images without the channel dim."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 5 * 5, 10)

    def forward(self, x):
        return self.fc(self.pool(F.relu(self.conv(x))).flatten(1))


class MnistNetHand(MnistNet):
    def forward(self, x):
        return self.fc(self.pool(F.relu(self.conv(x.unsqueeze(1)))).flatten(1))


class ConvHeadNoFlatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.pool(F.relu(self.conv(x))))


class ConvHeadNoFlattenHand(ConvHeadNoFlatten):
    def forward(self, x):
        return self.fc(self.pool(F.relu(self.conv(x))).flatten(1))


class FrameCNN(nn.Module):
    """Video (B, T, 3, H, W) through a Conv2d: folding T into the batch would make the model run
    and return B·T rows instead of B — not a mechanical fix."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, video):
        return self.fc(self.pool(F.relu(self.conv(video))).flatten(1))


class Cifar(nn.Module):
    """in_channels set to the image size (32) on (N, 3, 32, 32): 32 sits on H and W alike."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


# ==================================================================================================
# ops of the model's own code
# ==================================================================================================
class TwoBranch(nn.Module):
    """Two conv branches joined along time (dim 2) where the fuse conv wants their channels."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(4, 8, 3, padding=1)
        self.b = nn.Conv1d(4, 8, 5, padding=2)
        self.fuse = nn.Conv1d(16, 8, 1)
        self.head = nn.Linear(8, 2)

    def forward(self, x, dim=2):
        h = torch.cat([self.a(x), self.b(x)], dim=dim)  # @cat_before_conv
        return self.head(self.fuse(h).mean(-1))


class TwoBranchHand(TwoBranch):
    def forward(self, x):
        return super().forward(x, dim=1)


class FuseEncoders(nn.Module):
    """Text and audio features (B, T, ·) joined along time where their features differ."""

    def __init__(self):
        super().__init__()
        self.text = nn.Linear(10, 16)
        self.audio = nn.Linear(6, 8)
        self.head = nn.Linear(24, 3)

    def forward(self, t, a, dim=1):
        h = torch.cat([self.text(t), self.audio(a)], dim=dim)  # @cat_features
        return self.head(h).mean(1)


class FuseEncodersHand(FuseEncoders):
    def forward(self, t, a):
        return super().forward(t, a, dim=-1)


class MultiScalePool(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 3)
        self.c2 = nn.Conv1d(4, 8, 5)

    def forward(self, x):
        feats = torch.stack([self.c1(x), self.c2(x)], dim=1)  # @stack
        return feats.mean(-1)


class SelfAttention(nn.Module):
    """Heads merged with .view after .transpose (non-contiguous)."""

    def __init__(self, dim=16, heads=4, merge="view"):
        super().__init__()
        self.heads, self.merge = heads, merge
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(B, T, self.heads, E // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(E // self.heads)
        y = att.softmax(-1) @ v
        if self.merge == "view":
            y = y.transpose(1, 2).view(B, T, E)  # @view_after_transpose
        else:
            y = y.transpose(1, 2).reshape(B, T, E)
        return self.out(y)


class FlattenByHand(nn.Module):
    """fc sized for a 4·4 map; the conv leaves 3·3: .view cannot make 64 of 72 elements."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        h = F.relu(self.conv(x))
        return self.fc(h.view(x.size(0), 64))  # @view_count


class AttentionScores(nn.Module):
    """q @ k instead of q @ kᵀ."""

    def __init__(self, transpose=False):
        super().__init__()
        self.transpose = transpose
        self.q, self.k, self.v = nn.Linear(16, 8), nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.transpose:
            k = k.transpose(-2, -1)
        att = torch.softmax(q @ k / math.sqrt(8), dim=-1)  # @qk
        return att @ v


class AttentionPool(nn.Module):
    """bmm(weights (B, T, 1), h (B, T, H)) — the weights must be (B, 1, T)."""

    def __init__(self, transpose=False):
        super().__init__()
        self.transpose = transpose
        self.score = nn.Linear(12, 1)
        self.out = nn.Linear(12, 3)

    def forward(self, h):
        w = torch.softmax(self.score(h), dim=1)
        if self.transpose:
            w = w.transpose(1, 2)
        pooled = torch.bmm(w, h)  # @bmm
        return self.out(pooled.squeeze(1))


class EinsumAttention(nn.Module):
    """k left as (B, T, H, D) where the einsum reads it as (b, h, k, d)."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, 4, 4).transpose(1, 2)
        k = self.k(x).view(B, T, 4, 4)
        return torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)  # @einsum


class CausalScores(nn.Module):
    """A causal mask built as int64 ones above the diagonal (1 = future) for masked_fill."""

    def __init__(self, cast=False):
        super().__init__()
        self.cast = cast
        self.qk = nn.Linear(8, 16)

    def forward(self, x):
        T = x.size(1)
        q, k = self.qk(x).chunk(2, -1)
        scores = q @ k.transpose(-2, -1)
        future = torch.triu(torch.ones(T, T, dtype=torch.long), diagonal=1)
        if self.cast:
            future = future.bool()
        return scores.masked_fill(future, float("-inf")).softmax(-1)  # @masked_fill


class SDPAEncoder(nn.Module):
    """F.scaled_dot_product_attention with a Hugging Face attention_mask (int64, 1 = token)."""

    def __init__(self, cast=False, expand=True):
        super().__init__()
        self.cast, self.expand = cast, expand
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, x, attention_mask):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
        mask = attention_mask[:, None, None, :] if self.expand else attention_mask
        if self.cast:
            mask = mask.bool()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # @sdpa
        return self.out(y.transpose(1, 2).reshape(B, T, E))


class HFStyleEncoder(nn.Module):
    """nn.MultiheadAttention given the tokenizer's attention_mask (int64, 1 = keep) as
    key_padding_mask, where True means *ignore*: the fix is mask == 0, not mask.bool()."""

    def __init__(self, cast=False):
        super().__init__()
        self.cast = cast
        self.emb = nn.Embedding(30, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, ids, attention_mask):
        x = self.emb(ids)
        mask = attention_mask == 0 if self.cast else attention_mask
        y, _ = self.attn(x, x, x, key_padding_mask=mask)
        return self.head(y.mean(1))


class CausalMHA(nn.Module):
    """nn.MultiheadAttention given an int64 causal mask (1 = future): here 1 means hide."""

    def __init__(self, cast=False):
        super().__init__()
        self.cast = cast
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        T = x.size(1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.long), diagonal=1)
        if self.cast:
            causal = causal.bool()
        y, _ = self.attn(x, x, x, attn_mask=causal)
        return y


class TokenNLL(nn.Module):
    """gather with labels that still hold the ignore index -100."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 5)

    def forward(self, h, labels):
        logp = self.head(h).log_softmax(-1)
        picked = logp.gather(-1, labels.unsqueeze(-1))  # @gather
        return -picked.mean()


class TabularMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


class TabularMLPHand(TabularMLP):
    def forward(self, x):
        return self.net(x.float())


class TiedProjection(nn.Module):
    """A hand-rolled layer that stores its weight (in, out), then calls F.linear (which wants
    (out, in))."""

    def __init__(self, transpose=False):
        super().__init__()
        self.transpose = transpose
        self.weight = nn.Parameter(torch.randn(16, 10) * 0.1)

    def forward(self, x):
        w = self.weight.t() if self.transpose else self.weight
        return F.linear(x, w)  # @f_linear


class TiedProjectionHead(TiedProjection):
    """As TiedProjection, with an nn.Linear called on the same line: the fix must replace the
    user's F.linear there, not the one inside nn.Linear's forward."""

    def __init__(self, transpose=False):
        super().__init__(transpose)
        self.proj = nn.Linear(10, 3)

    def forward(self, x):
        w = self.weight.t() if self.transpose else self.weight
        return self.proj(F.linear(x, w))  # @f_linear_nested


class SharedEmbedding(nn.Module):
    """F.embedding with float ids (e.g. ids that went through a float collate)."""

    def __init__(self, cast=False):
        super().__init__()
        self.cast = cast
        self.weight = nn.Parameter(torch.randn(20, 8))

    def forward(self, ids):
        if self.cast:
            ids = ids.long()
        return F.embedding(ids, self.weight).sum(1)  # @f_embedding


class ManualLinear(nn.Module):
    """x @ W in the model's own code with float64 x (from numpy) and float32 W."""

    def __init__(self, cast=False):
        super().__init__()
        self.cast = cast
        self.w = nn.Parameter(torch.randn(6, 4) * 0.1)
        self.b = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        if self.cast:
            x = x.float()
        return x @ self.w + self.b  # @matmul_dtype


class PosEncoder(nn.Module):
    """A learned position table (1, 12, E) added without slicing it to the sequence length."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.pos = nn.Parameter(torch.zeros(1, 12, 16))

    def forward(self, ids):
        return self.emb(ids) + self.pos  # @pos_add


class Seq2Vec(nn.Module):
    """(h0, c0) built batch-first: states are (num_layers, B, H) even with batch_first=True."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        B = x.size(0)
        h0 = torch.zeros(B, 2, 16)
        c0 = torch.zeros(B, 2, 16)
        out, _ = self.lstm(x, (h0, c0))
        return self.head(out[:, -1])


class GRUWithState(nn.Module):
    """A GRU given an h0 built batch-first (B, num_layers, H)."""

    def __init__(self, swap=False):
        super().__init__()
        self.swap = swap
        self.gru = nn.GRU(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x, h0):
        if self.swap:
            h0 = h0.transpose(0, 1)
        out, _ = self.gru(x, h0)
        return self.head(out[:, -1])


# ==================================================================================================
# chains: the first fix leads to a second failure
# ==================================================================================================
class TextCNNFlat(nn.Module):
    """Conv1d on the embedding (no transpose), and fc sized for T = 12 where the unpadded conv
    leaves 10: after the transpose, the Linear fails and gets its own fix."""

    def __init__(self, fc_in=32 * 12):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.conv = nn.Conv1d(16, 32, 3)
        self.fc = nn.Linear(fc_in, 4)

    def forward(self, ids):
        x = F.relu(self.conv(self.emb(ids)))
        return self.fc(x.flatten(1))


class TextCNNFlatHand(TextCNNFlat):
    def forward(self, ids):
        x = F.relu(self.conv(self.emb(ids).transpose(1, 2)))
        return self.fc(x.flatten(1))


class TextCNNWide(nn.Module):
    """Conv1d on the embedding without the transpose *and* in_channels 20 where E = 16: the layout
    is fixed first (the Embedding settles it), then in_channels on the same layer."""

    def __init__(self, conv_in=20):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.conv = nn.Conv1d(conv_in, 8, 3, padding=1)

    def forward(self, ids):
        return self.conv(self.emb(ids)).amax(-1)


class TextCNNWideHand(TextCNNWide):
    def forward(self, ids):
        return self.conv(self.emb(ids).transpose(1, 2)).amax(-1)


class TextCNNView(nn.Module):
    """As TextCNNFlat, but flattened with .view(B, 8·T): after the transpose, the view cannot
    make 8·12 of 8·10 elements, and no mechanical fix exists for that."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.conv = nn.Conv1d(16, 8, 3)
        self.fc = nn.Linear(8 * 12, 2)

    def forward(self, ids):
        B, T = ids.shape
        x = F.relu(self.conv(self.emb(ids)))
        return self.fc(x.view(B, 8 * T))  # @view_chain


# ==================================================================================================
# the corpus
# ==================================================================================================
def _pad_mask(B, T, lengths):
    """Hugging Face attention_mask: int64, 1 for a token, 0 for padding."""
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()


def _with_pad():
    ids = _ids(30, 3, 5)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, 3:] = True
    return (ids, pad), {}


def _labels():
    labels = _ids(5, 2, 6, seed=1)
    labels[:, -2:] = -100
    return (_randn(2, 6, 8), labels), {}


def _ids_with(high, value, *shape):
    ids = _ids(high, *shape)
    ids[0, 3] = value
    return ids


CASES: List[Case] = [
    # -- layout ------------------------------------------------------------------------------------
    Case("conv1d_on_embedding", TextCNN, lambda: ((_ids(50, 2, 10),), {}),
         path="conv", cause="layout", fix=("permute-input", "conv", "x.transpose(1, 2)"), status="runs",
         hand=TextCNNHand, tempting="in_channels=10"),
    Case("conv2d_fed_nhwc", SmallCNN, lambda: ((_randn(2, 12, 12, 3),), {}),
         path="conv", cause="layout", fix=("permute-input", "conv", "x.permute(0, 3, 1, 2)"), status="runs",
         hand=SmallCNNHand, tempting="in_channels=12"),
    Case("lstm_batch_first_fed_conv_features", ConvLSTM, lambda: ((_randn(2, 6, 20),), {}),
         path="lstm", cause="layout", fix=("permute-input", "lstm", "x.transpose(1, 2)"), status="runs",
         hand=ConvLSTMHand, tempting="input_size=20"),
    Case("gru_seq_first_fed_conv_features", ConvGRU, lambda: ((_randn(2, 5, 20),), {}),
         path="gru", cause="layout", fix=("permute-input", "gru", "x.permute(2, 0, 1)"), status="runs",
         hand=ConvGRUHand, tempting="input_size=20"),
    Case("layernorm_on_nchw", ConvBlockLN, lambda: ((_randn(2, 3, 6, 6),), {}),
         path="norm", cause="layout",
         fix=("permute-input", "norm", "norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)"), status="runs",
         hand=ConvBlockLNHand, tempting="normalized_shape=6"),
    Case("batchnorm1d_on_btc", TokenMLP, lambda: ((_randn(4, 10, 16),), {}),
         path="bn", cause="layout", fix=("permute-input", "bn", "bn(x.transpose(1, 2)).transpose(1, 2)"),
         status="runs", hand=TokenMLPHand, tempting="num_features=10"),
    Case("groupnorm_channels_last", PatchMixer, lambda: ((_randn(2, 5, 5, 12),), {}),
         path="norm", cause="layout",
         fix=("permute-input", "norm", "norm(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)"), status="runs",
         hand=PatchMixerHand, tempting="num_channels=5"),
    Case("linear_on_conv_features", ConvTagger, lambda: ((_randn(2, 4, 20),), {}),
         path="tag", cause="layout", fix=("permute-input", "tag", "x.transpose(1, 2)"), status="runs",
         hand=ConvTaggerHand, tempting="in_features=20"),
    Case("mha_batch_first_mismatch", PaddedEncoder, _with_pad,
         path="attn", cause="layout", fix=("set-attr", "attn", "batch_first=True"), status="runs",
         hand=lambda: PaddedEncoder(batch_first=True)),
    Case("lstm_h0_batch_first", Seq2Vec, lambda: ((_randn(3, 7, 8),), {}),
         path="lstm", cause="layout"),
    Case("gru_h0_batch_first", GRUWithState, lambda: ((_randn(3, 7, 8), torch.zeros(3, 2, 16)), {}),
         path="gru", cause="layout", fix=("permute-input", "gru", "h0.transpose(0, 1)"), status="runs",
         hand=lambda: GRUWithState(swap=True)),
    # -- size: the producer fixes the layout, so the layer's size argument is what is wrong --------
    Case("linear_after_flatten_in_features", ConvClassifier, lambda: ((_randn(2, 3, 16, 16),), {}),
         path="classifier", cause="size", fix=("set-attr", "features.0", "padding=1"), status="runs",
         hand=lambda: ConvClassifier(padding=1)),  # built for the padded conv; in_features=392 is the other reading
    Case("conv_in_channels_after_conv", TwoConvs, lambda: ((_randn(2, 3, 10, 10),), {}),
         path="c2", cause="size", fix=("set-arg", "c2", "in_channels=16"), status="runs",
         hand=lambda: TwoConvs(mid_in=16)),
    Case("batchnorm2d_num_features", ConvBN, lambda: ((_randn(2, 3, 8, 8),), {}),
         path="bn", cause="size", fix=("set-arg", "bn", "num_features=16"), status="runs",
         hand=lambda: ConvBN(bn_features=16)),
    Case("conv_in_channels_length_coincides", Conv1dStack, lambda: ((_randn(2, 4, 10),), {}),
         path="c2", cause="size", fix=("set-arg", "c2", "in_channels=16"), status="runs",
         hand=lambda: Conv1dStack(c2_in=16)),
    Case("conv_after_relu_module_length_coincides", ConvReLUConv, lambda: ((_randn(2, 4, 10),), {}),
         path="net.2", cause="size", fix=("set-arg", "net.2", "in_channels=16"), status="runs",
         hand=lambda: ConvReLUConv(c2_in=16)),
    Case("batchnorm1d_num_features_length_coincides", ConvBN1d, lambda: ((_randn(2, 4, 10),), {}),
         path="bn", cause="size", fix=("set-arg", "bn", "num_features=16"), status="runs",
         hand=lambda: ConvBN1d(bn_features=16)),
    Case("lstm_input_size_time_coincides", ProjLSTM, lambda: ((_randn(2, 10, 6),), {}),
         path="lstm", cause="size", fix=("set-arg", "lstm", "input_size=12"), status="runs",
         hand=lambda: ProjLSTM(lstm_in=12)),
    Case("linear_in_features_time_coincides", TokenHead, lambda: ((_randn(2, 20, 16),), {}),
         path="out", cause="size", fix=("set-arg", "out", "in_features=32"), status="runs",
         hand=lambda: TokenHead(out_in=32)),
    Case("layernorm_size_time_coincides", FFNorm, lambda: ((_randn(2, 12, 16),), {}),
         path="norm", cause="size", fix=("set-arg", "norm", "normalized_shape=24"), status="runs",
         hand=lambda: FFNorm(norm_dim=24)),
    Case("residual_width_mismatch", ResidualMLP, lambda: ((_randn(2, 5, 32),), {}),
         path="", op=("add", "@residual"), cause="broadcast",
         fix=("set-arg", "ff.2", "out_features=32"), status="runs", hand=lambda: ResidualMLP(out=32)),
    Case("embedding_index_out_of_range", BagOfWords, lambda: ((_ids_with(40, 40, 2, 6),), {}),
         path="emb", cause="index-range", fix=("set-arg", "emb", "num_embeddings=41"), status="runs",
         hand=lambda: BagOfWords(vocab=41)),
    # -- rank --------------------------------------------------------------------------------------
    Case("conv3d_given_4d_lacks_depth", FrameEncoder3d, lambda: ((_randn(2, 3, 16, 16),), {}),
         path="conv", cause="rank", fix=("reshape-input", "conv", "x.unsqueeze(2)"), status="runs",
         hand=FrameEncoder3dHand),
    Case("conv2d_in1_given_nhw", MnistNet, lambda: ((_randn(4, 12, 12),), {}),
         path="conv", cause="rank", fix=("reshape-input", "conv", "x.unsqueeze(1)"), status="runs",
         hand=MnistNetHand),
    Case("linear_on_nchw_without_flatten", ConvHeadNoFlatten, lambda: ((_randn(2, 3, 8, 8),), {}),
         path="fc", cause="rank", fix=("reshape-input", "fc", "x.flatten(1)"), status="runs",
         hand=ConvHeadNoFlattenHand),
    Case("conv2d_given_video_frames", FrameCNN, lambda: ((_randn(2, 3, 3, 8, 8),), {}),
         path="conv", cause="rank"),
    # -- ambiguous ---------------------------------------------------------------------------------
    Case("conv2d_in_channels_equals_image_size", Cifar, lambda: ((_randn(2, 3, 32, 32),), {}),
         path="conv", cause="ambiguous"),
    Case("linear_on_conv2d_features_without_pool", ConvNoPool, lambda: ((_randn(2, 3, 6, 6),), {}),
         path="fc", cause="ambiguous", tempting="in_features=6"),
    # -- ops of the model's code -------------------------------------------------------------------
    Case("cat_wrong_dim_before_conv", TwoBranch, lambda: ((_randn(2, 4, 10),), {}),
         path="fuse", cause="cat-dim", fix=("replace-op", "@cat_before_conv", "cat(…, dim=1)"), status="runs",
         hand=TwoBranchHand),
    Case("cat_sizes_mismatch_other_dim_works", FuseEncoders,
         lambda: ((_randn(2, 5, 10), _randn(2, 5, 6, seed=1)), {}),
         path="", op=("cat", "@cat_features"), cause="cat-dim",
         fix=("replace-op", "@cat_features", "cat(…, dim=2)"), status="runs", hand=FuseEncodersHand),
    Case("stack_different_shapes", MultiScalePool, lambda: ((_randn(2, 4, 12),), {}),
         path="", op=("stack", "@stack"), cause="size"),
    Case("view_after_transpose", SelfAttention, lambda: ((_randn(2, 6, 16),), {}),
         path="", op=("view", "@view_after_transpose"), cause="non-contiguous",
         fix=("replace-op", "@view_after_transpose", "reshape"), status="runs",
         hand=lambda: SelfAttention(merge="reshape")),
    Case("view_wrong_element_count", FlattenByHand, lambda: ((_randn(2, 3, 5, 5),), {}),
         path="", op=("view", "@view_count"), cause="element-count"),
    Case("q_matmul_k_without_transpose", AttentionScores, lambda: ((_randn(2, 6, 16),), {}),
         path="", op=("matmul", "@qk"), cause="inner-dim",
         fix=("replace-op", "@qk", "b.transpose(-2, -1)"), status="runs",
         hand=lambda: AttentionScores(transpose=True)),
    Case("bmm_inner_mismatch", AttentionPool, lambda: ((_randn(2, 7, 12),), {}),
         path="", op=("bmm", "@bmm"), cause="inner-dim",
         fix=("replace-op", "@bmm", "a.transpose(-2, -1)"), status="runs",
         hand=lambda: AttentionPool(transpose=True)),
    Case("einsum_subscript_clash", EinsumAttention, lambda: ((_randn(2, 6, 16),), {}),
         path="", op=("einsum", "@einsum"), cause="inner-dim"),
    Case("f_linear_weight_stored_in_out", TiedProjection, lambda: ((_randn(2, 16),), {}),
         path="", op=("F.linear", "@f_linear"), cause="inner-dim",
         fix=("replace-op", "@f_linear", "weight.t()"), status="runs",
         hand=lambda: TiedProjection(transpose=True)),
    Case("f_linear_weight_stored_in_out_next_to_a_linear", TiedProjectionHead, lambda: ((_randn(2, 16),), {}),
         path="", op=("F.linear", "@f_linear_nested"), cause="inner-dim",
         fix=("replace-op", "@f_linear_nested", "weight.t()"), status="runs",
         hand=lambda: TiedProjectionHead(transpose=True)),
    Case("position_table_not_sliced", PosEncoder, lambda: ((_ids(30, 2, 8),), {}),
         path="", op=("add", "@pos_add"), cause="broadcast"),
    Case("gather_ignore_index", TokenNLL, _labels,
         path="", op=("gather", "@gather"), cause="index-range"),
    # -- masks -------------------------------------------------------------------------------------
    Case("masked_fill_int64_causal_mask", CausalScores, lambda: ((_randn(2, 5, 8),), {}),
         path="", op=("masked_fill", "@masked_fill"), cause="mask-dtype",
         fix=("replace-op", "@masked_fill", "mask.bool()"), status="runs", hand=lambda: CausalScores(cast=True)),
    Case("sdpa_int64_attention_mask", SDPAEncoder, lambda: ((_randn(2, 6, 16), _pad_mask(2, 6, [6, 4])), {}),
         path="", op=("F.scaled_dot_product_attention", "@sdpa"), cause="mask-dtype",
         fix=("replace-op", "@sdpa", "mask.bool()"), status="runs", hand=lambda: SDPAEncoder(cast=True),
         tempting="mask == 0"),
    Case("sdpa_padding_mask_not_expanded", lambda: SDPAEncoder(cast=True, expand=False),
         lambda: ((_randn(2, 5, 16), _pad_mask(2, 5, [5, 3])), {}),
         path="", op=("F.scaled_dot_product_attention", "@sdpa"), cause="mask-shape",
         fix=("replace-op", "@sdpa", "mask[:, None, None, :]"), status="runs",
         hand=lambda: SDPAEncoder(cast=True, expand=True), tempting="~mask"),
    Case("mha_int64_key_padding_mask_hf", HFStyleEncoder, lambda: ((_ids(30, 2, 6), _pad_mask(2, 6, [6, 4])), {}),
         path="attn", cause="mask-dtype", fix=("cast-input", "attn", "mask == 0"), status="runs",
         hand=lambda: HFStyleEncoder(cast=True), tempting="mask.bool()"),
    Case("mha_int64_causal_attn_mask", CausalMHA, lambda: ((_randn(2, 5, 16),), {}),
         path="attn", cause="mask-dtype", fix=("cast-input", "attn", "mask.bool()"), status="runs",
         hand=lambda: CausalMHA(cast=True), tempting="mask == 0"),
    # -- dtypes ------------------------------------------------------------------------------------
    Case("embedding_float_ids", BagOfWords, lambda: ((_ids(40, 2, 6).float(),), {}),
         path="emb", cause="dtype", fix=("cast-input", "", "ids.long()"), status="runs", hand=BagOfWordsHand),  # where the ids come in
    Case("f_embedding_float_ids", SharedEmbedding, lambda: ((_ids(20, 2, 6).float(),), {}),
         path="", op=("F.embedding", "@f_embedding"), cause="dtype",
         fix=("replace-op", "@f_embedding", "ids.long()"), status="runs", hand=lambda: SharedEmbedding(cast=True)),
    Case("float64_input_to_float32_linear", TabularMLP, lambda: ((_randn(4, 6, dtype=torch.float64),), {}),
         path="net.0", cause="dtype", fix=("cast-input", "", "x.to(torch.float32)"), status="runs",
         hand=TabularMLPHand),
    Case("float64_input_to_user_matmul", ManualLinear, lambda: ((_randn(4, 6, dtype=torch.float64),), {}),
         path="", op=("matmul", "@matmul_dtype"), cause="dtype",
         fix=("replace-op", "@matmul_dtype", "a.to(torch.float32)"), status="runs",
         hand=lambda: ManualLinear(cast=True)),
    # -- chains ------------------------------------------------------------------------------------
    Case("chain_conv1d_layout_then_linear_size", TextCNNFlat, lambda: ((_ids(50, 2, 12),), {}),
         path="conv", cause="layout", fix=("permute-input", "conv", "x.transpose(1, 2)"), status="runs",
         hand=lambda: TextCNNFlatHand(fc_in=320), tempting="in_channels=12",
         then=(("fc", ("set-arg", "fc", "in_features=320")),)),
    Case("chain_conv1d_layout_then_in_channels_same_layer", TextCNNWide, lambda: ((_ids(50, 2, 10),), {}),
         path="conv", cause="layout", fix=("permute-input", "conv", "x.transpose(1, 2)"), status="runs",
         hand=lambda: TextCNNWideHand(conv_in=16), tempting="in_channels=10",
         then=(("conv", ("set-arg", "conv", "in_channels=16")),)),
    Case("chain_conv1d_layout_then_bad_view", TextCNNView, lambda: ((_ids(50, 2, 12),), {}),
         path="conv", cause="layout", fix=("permute-input", "conv", "x.transpose(1, 2)"), status="still-fails",
         tempting="in_channels=12", then=(("view", None),)),
]
