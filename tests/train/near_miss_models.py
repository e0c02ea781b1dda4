"""Near misses for train-check: models that look like a finding's planted case to its rule but are
healthy (or broken for another reason). Used by test_near_misses.py; each class says what it resembles."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerScale(nn.Module):
    """Residual branch times a per-channel gate initialised at 0 (LayerScale/ReZero-style)."""
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.branch = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        self.gamma = nn.Parameter(torch.zeros(16))
        self.out = nn.Linear(16, 4)
    def forward(self, x):
        h = self.inp(x)
        h = h + self.gamma * self.branch(h)
        return self.out(h)


class SoftmaxProbs(nn.Module):
    """Outputs probabilities; the loss is NLL on their log."""
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


def nll_of_log(p, t):
    return F.nll_loss(torch.log(p), t)


class SigmoidRegressor(nn.Module):
    """Sigmoid output against a target that is legitimately in [0, 1]."""
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))
    def forward(self, x):
        return torch.sigmoid(self.net(x))


class BNCancelsBias(nn.Module):
    """Linear(bias=True) before BatchNorm: the bias's gradient is cancelled by the batch mean."""
    def __init__(self):
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4)
    def forward(self, x):
        return self.b(torch.relu(self.bn(self.a(x))))


class FrozenEmbedding(nn.Module):
    """A pretrained embedding frozen by design."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.emb.weight.requires_grad_(False)
        self.head = nn.Linear(16, 3)
    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


class PaddedEmbedding(nn.Module):
    """Embedding with padding_idx, inputs padded at the end."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16, padding_idx=0)
        self.head = nn.Linear(16, 3)
    def forward(self, ids):
        return self.head(self.emb(ids).sum(1))


class TiedLM(nn.Module):
    """Weights tied in __init__ (a shared Parameter), not in forward."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 30, bias=False)
        self.head.weight = self.emb.weight
    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.emb(ids))))


class TwoHeadsOwnLoss(nn.Module):
    """Computes its loss from both heads (main + auxiliary), returns a dict with both logits."""
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 32)
        self.head, self.aux = nn.Linear(32, 4), nn.Linear(32, 4)
        self.register_buffer("labels", torch.arange(16) % 4)
    def forward(self, x):
        h = torch.relu(self.trunk(x))
        logits, aux = self.head(h), self.aux(h)
        loss = F.cross_entropy(logits, self.labels[:x.shape[0]]) + 0.4 * F.cross_entropy(aux, self.labels[:x.shape[0]])
        return {"loss": loss, "logits": logits, "aux_logits": aux}


class ZeroInitHead(nn.Module):
    """Last layer initialised at 0 (a common init): the first layer's gradient is 0 at step 0 only."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 4)
        nn.init.zeros_(self.b.weight); nn.init.zeros_(self.b.bias)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class MostlySaturatedTanh(nn.Module):
    """tanh saturated for most samples/units but not all."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)
        with torch.no_grad():
            self.a.weight.mul_(8.0)
    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class GaussianNLL(nn.Module):
    """Predicts mean and log-variance: its NLL goes below 0 legitimately."""
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
    def forward(self, x):
        return self.net(x)


def gaussian_nll(out, t):
    mu, logvar = out[:, 0], out[:, 1]
    return F.gaussian_nll_loss(mu, t, logvar.exp())


class MaskedAttention(nn.Module):
    """Causal attention masked with -inf before softmax (inf inside, finite out)."""
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 4)
    def forward(self, x):  # x [B, T, 8]
        q, k, v = self.qkv(x).chunk(3, -1)
        s = q @ k.transpose(-1, -2) / 8 ** 0.5
        T = x.shape[1]
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        return self.out(torch.softmax(s, -1) @ v)


class MostlyDeadReLUModule(nn.Module):
    """nn.ReLU dead for most units/samples but not all."""
    def __init__(self, bias=-0.6):
        super().__init__()
        self.a, self.act, self.b = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)
        with torch.no_grad():
            self.a.bias.fill_(bias)
    def forward(self, x):
        return self.b(self.act(self.a(x)))


class DeadFunctionalReLU(nn.Module):
    """F.relu fed a large negative bias: dead for every sample (broken, as a dead ReLU)."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)
        with torch.no_grad():
            self.a.bias.fill_(-10.0)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class ClipNormSGD(torch.optim.SGD):
    """SGD with clip_grad_norm_(max_norm=1.0) before each step: a normal clip."""
    def step(self, closure=None):
        torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], 1.0)
        return super().step(closure)
