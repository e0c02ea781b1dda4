"""Models and optimizers of audit round 3 (test_audit_round3.py): realistic training bugs and healthy models.

Each bug is the user's own code, written the way it goes wrong in practice; where the bug lives in the
training loop (a forgotten ``zero_grad``, clipping at 1e-6), it is folded into an optimizer subclass,
since train-check owns the loop and calls ``zero_grad``/``step`` on the optimizer it is given.
"""

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d=16, h=32, c=4):
        super().__init__()
        self.body = nn.Linear(d, h)
        self.head = nn.Linear(h, c)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class NormMLP(nn.Module):
    def __init__(self, d=16, h=32, c=4):
        super().__init__()
        self.body = nn.Linear(d, h)
        self.norm = nn.LayerNorm(h)
        self.head = nn.Linear(h, c)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.body(x))))


def norm_bias_decay(model, decay=10.0, lr=1e-2):
    """AdamW with the usual two groups, but the huge decay put on the LayerNorm/bias group."""
    special = [p for n, p in model.named_parameters() if "norm" in n or n.endswith("bias")]
    rest = [p for n, p in model.named_parameters() if not ("norm" in n or n.endswith("bias"))]
    return torch.optim.AdamW([{"params": rest, "weight_decay": 0.01},
                              {"params": special, "weight_decay": decay}], lr=lr)


def squashed_classifier(last, d=16, h=32, c=4):
    """An MLP ending in ``last`` (nn.Softmax / nn.Sigmoid) in front of a loss that applies it itself."""
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, c), last)


class TinyCausalLM(nn.Module):
    """Embedding → one causal TransformerEncoder layer → vocabulary head; (B, T) ids → (B, V, T) logits."""

    def __init__(self, vocab=20, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.enc(self.emb(ids), mask=mask, is_causal=True)).transpose(1, 2)


class TiedLM(nn.Module):
    """head.weight tied to emb.weight in __init__ (the tie a later re-assignment breaks)."""

    def __init__(self, vocab=20, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.emb(ids)))).transpose(1, 2)


class ClippedSGD(torch.optim.SGD):
    """The user's loop clips the gradient norm to 1e-6 before every step."""

    def step(self, closure=None):
        grads = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(grads, 1e-6)
        return super().step(closure)


class NoZeroSGD(torch.optim.SGD):
    """The user's loop never calls zero_grad: every backward adds to the gradients of all earlier steps."""

    def zero_grad(self, set_to_none=True):
        pass


def smoothed_ce_sum(pred, target):
    return F.cross_entropy(pred, target, label_smoothing=0.1, reduction="sum")


def smoothed_ce(pred, target):
    return F.cross_entropy(pred, target, label_smoothing=0.1)


# -- healthy -------------------------------------------------------------------------------------------
class TransformerClassifier(nn.Module):
    def __init__(self, vocab=30, d=16, c=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, c)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)).mean(1))


class LSTMTagger(nn.Module):
    """Per-token tags, logits as (B, C, T) for cross_entropy."""

    def __init__(self, vocab=30, d=16, h=24, tags=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, h, batch_first=True)
        self.head = nn.Linear(h, tags)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.head(out).permute(0, 2, 1)


def bn_cnn(c=4):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, c))


class ReZeroBlock(nn.Module):
    """x + α·f(x) with α initialised to 0 (ReZero): α's gradient is not 0, so it learns from step 1."""

    def __init__(self, d):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.alpha = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return x + self.alpha * self.ff(x)


class ReZeroNet(nn.Module):
    def __init__(self, d=16, c=4, depth=3):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(ReZeroBlock(d) for _ in range(depth))
        self.head = nn.Linear(d, c)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)
