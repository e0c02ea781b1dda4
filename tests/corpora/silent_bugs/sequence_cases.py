"""Silent shape bugs in sequence models: NLP, audio, time series.

Each twin comes first; its buggy sibling subclasses it and overrides only the forward (or the one
helper) that holds the bug, so both have the same parameter names.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .case import SilentBugCase, generator, seeded


# NLP: an embedding's (B, T, E) viewed as (B, E, T) for a Conv1d instead of transposed
class TextConvTwin(nn.Module):
    def __init__(self, vocab=50, emb=12, channels=16, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.conv = nn.Conv1d(emb, channels, 3, padding=1)
        self.head = nn.Linear(channels, classes)

    def forward(self, ids):
        x = self.emb(ids)
        x = x.transpose(1, 2)
        return self.head(torch.relu(self.conv(x)).mean(dim=2))


class TextConvBuggy(TextConvTwin):
    def forward(self, ids):
        x = self.emb(ids)
        B, T, E = x.shape
        x = x.view(B, E, T)
        return self.head(torch.relu(self.conv(x)).mean(dim=2))


# NLP: a seq-first LSTM's (T, B, V) logits flattened against batch-first (B, T) targets
class SeqFirstLMTwin(nn.Module):
    def __init__(self, vocab=20, emb=8, hidden=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids_tb, targets_bt):
        h, _ = self.rnn(self.emb(ids_tb))
        logits = self.out(h)
        V = logits.shape[-1]
        return F.cross_entropy(logits.transpose(0, 1).reshape(-1, V), targets_bt.reshape(-1))


class SeqFirstLMBuggy(SeqFirstLMTwin):
    def forward(self, ids_tb, targets_bt):
        h, _ = self.rnn(self.emb(ids_tb))
        logits = self.out(h)
        V = logits.shape[-1]
        return F.cross_entropy(logits.reshape(-1, V), targets_bt.reshape(-1))


# NLP: out[-1] of a batch_first GRU takes the last sample, not the last step (B == T)
class GRUClassifierTwin(nn.Module):
    def __init__(self, emb=8, hidden=12, classes=3):
        super().__init__()
        self.rnn = nn.GRU(emb, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


class GRUClassifierBuggy(GRUClassifierTwin):
    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[-1])


# NLP: attention scores q @ k without transposing k (T == head dim)
class SelfAttentionTwin(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


class SelfAttentionBuggy(SelfAttentionTwin):
    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


# NLP: a tagger's (B, T, C) logits given to cross_entropy, which reads classes on dim 1 (T == C)
class TaggerTwin(nn.Module):
    def __init__(self, vocab=30, emb=8, tags=7):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.tagger = nn.Linear(emb, tags)

    def forward(self, ids, tags):
        logits = self.tagger(self.emb(ids))
        return F.cross_entropy(logits.transpose(1, 2), tags)


class TaggerBuggy(TaggerTwin):
    def forward(self, ids, tags):
        logits = self.tagger(self.emb(ids))
        return F.cross_entropy(logits, tags)


# NLP: a key-padding mask broadcast over the queries instead of the keys
class MaskedAttentionTwin(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def scores(self, x, pad):
        s = self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        return s.masked_fill(pad[:, None, :], -1e9)

    def forward(self, x, pad):
        return torch.softmax(self.scores(x, pad), dim=-1) @ self.v(x)


class MaskedAttentionBuggy(MaskedAttentionTwin):
    def scores(self, x, pad):
        s = self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        return s.masked_fill(pad[:, :, None], -1e9)


# audio: a Linear after a Conv1d applied along time instead of channels (C == T)
class AudioProjTwin(nn.Module):
    def __init__(self, mels=32, channels=32, out=16):
        super().__init__()
        self.conv = nn.Conv1d(mels, channels, 3, padding=1)
        self.proj = nn.Linear(channels, out)

    def forward(self, mel):
        h = torch.relu(self.conv(mel))
        return self.proj(h.transpose(1, 2)).mean(dim=1)


class AudioProjBuggy(AudioProjTwin):
    def forward(self, mel):
        h = torch.relu(self.conv(mel))
        return self.proj(h).mean(dim=1)


# audio: a bare squeeze() that also eats a batch of 1, so dim=1 then means frequency, not time
class SqueezePoolTwin(nn.Module):
    def __init__(self, freq=8, classes=3):
        super().__init__()
        self.att = nn.Linear(freq, freq)
        self.fc = nn.Linear(freq, classes)

    def forward(self, spec):
        h = spec.squeeze(1)
        w = torch.softmax(self.att(h), dim=1)
        return self.fc((w * h).sum(dim=1))


class SqueezePoolBuggy(SqueezePoolTwin):
    def forward(self, spec):
        h = spec.squeeze()
        w = torch.softmax(self.att(h), dim=1)
        return self.fc((w * h).sum(dim=1))


# audio: LayerNorm(F) over a (B, F, T) spectrogram normalises time (F == T)
class MelNormTwin(nn.Module):
    def __init__(self, freq=16, channels=8):
        super().__init__()
        self.norm = nn.LayerNorm(freq)
        self.conv = nn.Conv1d(freq, channels, 3, padding=1)

    def forward(self, mel):
        h = self.norm(mel.transpose(1, 2)).transpose(1, 2)
        return self.conv(h)


class MelNormBuggy(MelNormTwin):
    def forward(self, mel):
        h = self.norm(mel)
        return self.conv(h)


# time series: BatchNorm1d(16) over (B, T=16, C=16) normalises each time step, not each channel
class SensorNormTwin(nn.Module):
    def __init__(self, channels=16):
        super().__init__()
        self.bn = nn.BatchNorm1d(channels)
        self.fc = nn.Linear(channels, 1)

    def forward(self, x):
        h = self.bn(x.transpose(1, 2)).transpose(1, 2)
        return self.fc(h)


class SensorNormBuggy(SensorNormTwin):
    def forward(self, x):
        h = self.bn(x)
        return self.fc(h)


# time series: (B, 1) predictions minus (B,) targets broadcast to (B, B) before the mean
class ForecastLossTwin(nn.Module):
    def __init__(self, window=12):
        super().__init__()
        self.fc = nn.Linear(window, 1)

    def forward(self, x, y):
        pred = self.fc(x)
        return ((pred.squeeze(1) - y) ** 2).mean()


class ForecastLossBuggy(ForecastLossTwin):
    def forward(self, x, y):
        pred = self.fc(x)
        return ((pred - y) ** 2).mean()


# time series: heads split by reshape(B, H, T, D) where view(B, T, H, D).transpose(1, 2) was meant
class ForecastAttentionTwin(nn.Module):
    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def split_heads(self, t):
        B, T, E = t.shape
        return t.view(B, T, self.heads, E // self.heads).transpose(1, 2)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = (self.split_heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, E))


class ForecastAttentionBuggy(ForecastAttentionTwin):
    def split_heads(self, t):
        B, T, E = t.shape
        return t.reshape(B, self.heads, T, E // self.heads)


# time series: the last step read from the feature axis, out[:, :, -1] (T == hidden)
class LastStepTwin(nn.Module):
    def __init__(self, features=4, hidden=16):
        super().__init__()
        self.rnn = nn.LSTM(features, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1, :])


class LastStepBuggy(LastStepTwin):
    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, :, -1])


def _ids(shape, high, seed=0):
    return torch.randint(0, high, shape, generator=generator(seed))


def _normal(*shape, seed=0):
    return torch.randn(*shape, generator=generator(seed))


def _padding_mask():
    lengths = torch.tensor([8, 5, 3, 6])
    return torch.arange(8)[None, :] >= lengths[:, None]


def _sensor_batch():
    scale, offset = torch.linspace(0.5, 4.0, 16), torch.linspace(-3.0, 3.0, 16)
    return _normal(8, 16, 16) * scale + offset


SEQUENCE_CASES = [
    SilentBugCase("nlp_view_for_transpose", "NLP", seeded(TextConvBuggy), seeded(TextConvTwin),
                  lambda: (_ids((4, 10), 50),), "view", "x = x.view(B, E, T)",
                  "move the embedding features to the channel axis for Conv1d: x.transpose(1, 2)"),
    SilentBugCase("nlp_seq_first_logits_vs_batch_first_targets", "NLP", seeded(SeqFirstLMBuggy),
                  seeded(SeqFirstLMTwin), lambda: (_ids((6, 4), 20), _ids((4, 6), 20, seed=1)),
                  "reshape", "F.cross_entropy(logits.reshape(-1, V)",
                  "flatten (T, B, V) logits in the same (B, T) order as the targets: "
                  "logits.transpose(0, 1).reshape(-1, V)", aliases=("cross_entropy",)),
    SilentBugCase("nlp_gru_out_minus_one_indexes_batch", "NLP", seeded(GRUClassifierBuggy),
                  seeded(GRUClassifierTwin), lambda: (_normal(6, 6, 8),), "__getitem__",
                  "self.fc(out[-1])", "classify each sequence from its last time step: out[:, -1]",
                  aliases=("getitem", "out[-1]", "[-1]")),
    SilentBugCase("nlp_attention_k_not_transposed", "NLP", seeded(SelfAttentionBuggy),
                  seeded(SelfAttentionTwin), lambda: (_normal(2, 8, 8),), "matmul",
                  "scores = q @ k /", "scores between every query and key: q @ k.transpose(-2, -1)",
                  aliases=("@",)),
    SilentBugCase("nlp_tagger_cross_entropy_classes_last", "NLP", seeded(TaggerBuggy),
                  seeded(TaggerTwin), lambda: (_ids((4, 7), 30), _ids((4, 7), 7, seed=1)),
                  "cross_entropy", "return F.cross_entropy(logits, tags)",
                  "a loss over the tag classes on the last axis: cross_entropy(logits.transpose(1, 2), tags)"),
    SilentBugCase("nlp_padding_mask_on_queries", "NLP", seeded(MaskedAttentionBuggy),
                  seeded(MaskedAttentionTwin), lambda: (_normal(4, 8, 8), _padding_mask()),
                  "masked_fill", "s.masked_fill(pad[:, :, None]",
                  "hide the padded keys from every query: pad[:, None, :]"),
    SilentBugCase("audio_linear_over_time", "audio", seeded(AudioProjBuggy), seeded(AudioProjTwin),
                  lambda: (_normal(4, 32, 32),), "Linear", "return self.proj(h).mean(dim=1)",
                  "project each frame's conv channels: self.proj(h.transpose(1, 2))", aliases=("proj",)),
    SilentBugCase("audio_squeeze_eats_batch_of_one", "audio", seeded(SqueezePoolBuggy),
                  seeded(SqueezePoolTwin), lambda: (_normal(1, 1, 8, 8),), "squeeze",
                  "h = spec.squeeze()", "drop only the channel axis of a (B, 1, T, F) spectrogram: squeeze(1)"),
    SilentBugCase("audio_layernorm_over_time", "audio", seeded(MelNormBuggy), seeded(MelNormTwin),
                  lambda: (_normal(4, 16, 16),), "LayerNorm", "h = self.norm(mel)",
                  "normalise each frame over its mel bins: norm(mel.transpose(1, 2)).transpose(1, 2)",
                  aliases=("norm",)),
    SilentBugCase("ts_batchnorm_over_time", "time series", seeded(SensorNormBuggy),
                  seeded(SensorNormTwin), lambda: (_sensor_batch(),), "BatchNorm1d", "h = self.bn(x)",
                  "normalise each sensor channel: bn(x.transpose(1, 2)).transpose(1, 2)", aliases=("bn",)),
    SilentBugCase("ts_loss_broadcasts_to_b_by_b", "time series", seeded(ForecastLossBuggy),
                  seeded(ForecastLossTwin), lambda: (_normal(8, 12), _normal(8, seed=1)), "sub",
                  "((pred - y) ** 2)", "squared error per sample: pred.squeeze(1) - y",
                  aliases=("subtract", "-", "broadcast")),
    SilentBugCase("ts_heads_view_without_transpose", "time series", seeded(ForecastAttentionBuggy),
                  seeded(ForecastAttentionTwin), lambda: (_normal(2, 8, 16),), "reshape",
                  "t.reshape(B, self.heads, T, E // self.heads)",
                  "split the features into heads: view(B, T, H, D).transpose(1, 2)"),
    SilentBugCase("ts_last_step_from_feature_axis", "time series", seeded(LastStepBuggy),
                  seeded(LastStepTwin), lambda: (_normal(4, 16, 4),), "__getitem__",
                  "self.fc(out[:, :, -1])", "forecast from the last time step's hidden state: out[:, -1, :]",
                  aliases=("getitem", "out[:, :, -1]", "[:, :, -1]")),
]
