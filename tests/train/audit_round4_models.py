"""Models and optimizers of audit round 4 (test_audit_round4.py): realistic training bugs, traps, healthy models.

Each bug is written the way it goes wrong in practice ("my loss won't fall"). A bug that lives in the
training loop (clipping each gradient element at 1e-8 instead of 1.0) is folded into an optimizer
subclass, since train-check owns the loop and calls ``zero_grad``/``step`` on the optimizer it is given.
The traps look wrong but are not, on one batch: ``log_softmax`` before ``CrossEntropyLoss`` (log_softmax
is idempotent), a ReZero gate that starts at 0 but is a learnable parameter.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- bug models

class TokenTagger(nn.Module):
    """Token classification head that ends in a softmax, then CrossEntropyLoss on (B, C, T)."""

    def __init__(self, vocab=20, d=16, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)
        self.classifier = nn.Linear(d, classes)

    def forward(self, ids):
        h = torch.relu(self.proj(self.emb(ids)))
        probs = torch.softmax(self.classifier(h), dim=-1)   # (B, T, C)
        return probs.transpose(1, 2)                        # (B, C, T) for CrossEntropyLoss


class MultiLabelSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
        self.out = nn.Linear(32, 5)

    def forward(self, x):
        return torch.sigmoid(self.out(self.body(x)))


class PriceRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class FrozenEverything(nn.Module):
    """Freezes the backbone after the head was attached: the loop froze the head too."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        for p in self.parameters():       # meant: self.backbone.parameters()
            p.requires_grad = False

    def forward(self, x):
        return self.head(self.backbone(x))


class NoGradBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(10, 32)
        self.encoder = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        with torch.no_grad():             # "saves memory" -- and cuts stem + encoder off
            h = self.encoder(h)
        return self.head(h)


class DotDataFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        feats = self.backbone(x).data     # old Variable habit: .data cuts the graph
        return self.head(feats)


class ListOfTemperatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(3)])
        # per-layer learnable gate, kept in a plain list: never registered
        self.gates = [nn.Parameter(torch.full((16,), 0.01)) for _ in range(3)]
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for layer, gate in zip(self.layers, self.gates):
            x = x + gate * torch.tanh(layer(x))
        return self.head(x)


class KeepProbDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.9),   # TF1 keep_prob
                                 nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.9),
                                 nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x)


class LSTMFirstStep(nn.Module):
    def __init__(self, vocab=30, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, 32, batch_first=True)
        self.fc = nn.Linear(32, 3)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.fc(out[:, 0])         # a forward LSTM's first step has only read [CLS]


class ResidualTimesZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(12, 32)
        self.block = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.res_scale = 0.0              # meant to be a learnable ReZero alpha
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.stem(x)
        h = h + self.res_scale * self.block(h)
        return self.head(h)


class SaturatedTanh(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                                 nn.Linear(32, 3))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.constant_(m.weight, 5.0)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


class ClipValueSGD(torch.optim.SGD):
    """SGD that clips each gradient element to +-clip before the step (clip meant 1.0)."""

    def __init__(self, params, lr=0.1, clip=1e-8, **kw):
        super().__init__(params, lr=lr, **kw)
        self.clip = clip

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            torch.nn.utils.clip_grad_value_(group["params"], self.clip)
        return super().step(closure)


class DetachedOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x).detach()       # copied from the inference code path


# ---------------------------------------------------------------- traps

class LogSoftmaxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return F.log_softmax(self.net(x), dim=-1)   # + CrossEntropyLoss: log_softmax is idempotent


class ReZeroBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(12, 32)
        self.block = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.alpha = nn.Parameter(torch.zeros(1))    # ReZero: 0 at init on purpose, learnable
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.stem(x)
        h = h + self.alpha * self.block(h)
        return self.head(h)


# ---------------------------------------------------------------- healthy

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class GRUClassifier(nn.Module):
    def __init__(self, vocab=40, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.gru = nn.GRU(d, 32, batch_first=True)
        self.fc = nn.Linear(32, 3)

    def forward(self, ids):
        _, h = self.gru(self.emb(ids))
        return self.fc(h[-1])


class TransformerRegressor(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(6, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        return self.out(self.encoder(self.inp(x)).mean(1)).squeeze(-1)


def mlp():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
