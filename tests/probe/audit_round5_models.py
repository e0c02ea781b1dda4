"""Round-5 audit cases of ``layerlab inspect``'s failure blame: broken models written from the README
alone, each with a hand-fixed twin (same parameters, so ``load_state_dict`` carries the weights)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class TextCNN(nn.Module):
    """Max-pooled over the filters (dim 1) instead of time (dim 2): Linear(24) gets the 18 positions."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb, self.conv, self.fc = nn.Embedding(50, 12), nn.Conv1d(12, 24, 3), nn.Linear(24, 4)

    def forward(self, ids):
        x = torch.relu(self.conv(self.emb(ids).transpose(1, 2)))
        x = x.max(dim=2).values if self.fixed else x.max(dim=1).values
        return self.fc(x)


class Mixer(nn.Module):
    """Token mixing over N=16 tokens, but the token Linear is sized for the C=32 channels."""

    def __init__(self, fixed=False):
        super().__init__()
        self.norm, self.chan = nn.LayerNorm(32), nn.Linear(32, 32)
        self.token_mix = nn.Linear(16, 16) if fixed else nn.Linear(32, 32)

    def forward(self, x):
        x = x + self.token_mix(self.norm(x).transpose(1, 2)).transpose(1, 2)
        return x + self.chan(x)


class SwinPartition(nn.Module):
    """A 14×14 map partitioned into 4×4 windows: 14 is not a multiple of 4 (Swin pads first)."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed, self.ws, self.proj = fixed, 4, nn.Linear(8, 8)

    def forward(self, x):
        B, H, W, C = x.shape
        ws = self.ws
        if self.fixed:
            x = F.pad(x, (0, 0, 0, (-W) % ws, 0, (-H) % ws))
            B, H, W, C = x.shape
        w = x.view(B, H // ws, ws, W // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)
        return self.proj(w)


class BmmSeqFirst(nn.Module):
    """q is batch-first (B, T, D); k comes from a seq-first GRU (T, B, D) and is bmm'ed as is."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed, self.q, self.gru = fixed, nn.Linear(8, 8), nn.GRU(8, 8)

    def forward(self, x):
        q, (k, _) = self.q(x), self.gru(x.transpose(0, 1))
        if self.fixed:
            k = k.transpose(0, 1)
        return torch.bmm(torch.bmm(q, k.transpose(1, 2)).softmax(-1), x)


class EmbeddingTrailingOne(nn.Module):
    """Token ids shaped (B, T, 1): the Embedding gives (B, T, 1, E) and the LSTM refuses 4-D."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed, self.emb, self.rnn = fixed, nn.Embedding(30, 8), nn.LSTM(8, 8, batch_first=True)

    def forward(self, ids):
        if self.fixed:
            ids = ids.squeeze(-1)
        return self.rnn(self.emb(ids))[0]


class Seq2SeqBatchFirstMemory(nn.Module):
    """A batch_first GRU encoder's (B, S, E) memory given to a seq-first decoder layer."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed, self.enc = fixed, nn.GRU(16, 16, batch_first=True)
        self.dec = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0)

    def forward(self, src, tgt):
        mem, _ = self.enc(src)
        if self.fixed:
            mem = mem.transpose(0, 1)
        return self.dec(tgt, mem)


class HalfResSegLoss(nn.Module):
    """Logits at H/2 × W/2 against a full-size (B, H, W) mask in cross_entropy."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed, self.body, self.cls = fixed, nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Conv2d(8, 4, 1)

    def forward(self, x, mask):
        logits = self.cls(torch.relu(self.body(x)))
        if self.fixed:
            logits = F.interpolate(logits, size=mask.shape[-2:], mode="bilinear", align_corners=False)
        return F.cross_entropy(logits, mask)


def inputs(name: str):
    g = torch.Generator().manual_seed(0)
    return {
        "text_cnn": lambda: (torch.randint(0, 50, (2, 20), generator=g),),
        "mixer": lambda: (torch.randn(2, 16, 32, generator=g),),
        "swin": lambda: (torch.randn(2, 14, 14, 8, generator=g),),
        "bmm": lambda: (torch.randn(2, 5, 8, generator=g),),
        "emb_trailing_one": lambda: (torch.randint(0, 30, (2, 6, 1), generator=g),),
        "seq2seq": lambda: (torch.randn(2, 7, 16, generator=g), torch.randn(5, 2, 16, generator=g)),
        "seg": lambda: (torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 4, (2, 16, 16), generator=g)),
    }[name]()


CASES = {"text_cnn": TextCNN, "mixer": Mixer, "swin": SwinPartition, "bmm": BmmSeqFirst,
         "emb_trailing_one": EmbeddingTrailingOne, "seq2seq": Seq2SeqBatchFirstMemory, "seg": HalfResSegLoss}
