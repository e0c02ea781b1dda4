"""Models for the helper-I round-2 audit of precision-check (tests/precision_check/test_audit_round2_i.py).

Ten planted low-precision bugs, written as people write them, and six healthy models. Each planted
model's docstring says what goes wrong and in which dtype (measured with plain torch in the tests).
Letters: B batch · L length · E features.
"""

import torch
import torch.nn as nn


class UnscaledAttention(nn.Module):
    """Attention logits q @ k^T with no 1/sqrt(d) at d = 512: the softmax saturates and its
    gradient is mostly rounding (bf16 and fp16)."""
    def __init__(self, d=512):
        super().__init__()
        self.q = nn.Linear(d, d); self.k = nn.Linear(d, d); self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        logits = q @ k.transpose(-2, -1)          # no / math.sqrt(d)
        return self.out(torch.softmax(logits, dim=-1) @ v)


class NaiveSoftmax(nn.Module):
    """exp(x) / sum exp(x) without subtracting the max: exp(12) > 65504 is inf in float16."""
    def forward(self, x):
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)


class NaiveSoftmaxHead(nn.Module):
    def __init__(self, d=64, n=64):
        super().__init__()
        self.fc = nn.Linear(d, n); self.act = NaiveSoftmax()

    def forward(self, x):
        return self.act(self.fc(x) * 6)


class CancellingVariance(nn.Module):
    """var = E[x²] − E[x]²: at a mean of 50 the two terms (~2500) cancel to a variance of ~0.4."""
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x ** 2).mean(-1, keepdim=True) - mean ** 2
        return (x - mean) / torch.sqrt(var.clamp_min(0) + 1e-5)


class VarianceNet(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.fc = nn.Linear(d, d); self.norm = CancellingVariance(); self.head = nn.Linear(d, 16)

    def forward(self, x):
        return self.head(self.norm(self.fc(x) + 50.0))


class RunningSum(nn.Module):
    """A cumsum over 4096 steps: CPU keeps it accurate in bf16 (a healthy case, despite the look)."""
    def forward(self, x):
        return torch.cumsum(x, dim=1)


class CumsumNet(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc = nn.Linear(d, d); self.acc = RunningSum(); self.head = nn.Linear(d, 4)

    def forward(self, x):
        return self.head(self.acc(self.fc(x)) / x.shape[1])


class HandL2Norm(nn.Module):
    """sqrt(sum x²) by hand: the sum of squares of |x| ~ 80 passes 65504 in float16."""
    def forward(self, x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True))


class L2Net(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.fc = nn.Linear(d, d); self.norm = HandL2Norm(); self.head = nn.Linear(d, 8)

    def forward(self, x):
        return self.head(self.norm(self.fc(x) * 40))


class StdScale(nn.Module):
    """(x − mean) / (std + 1e-8); 1e-8 is 0 in float16."""
    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) * (1 / (x.std(-1, keepdim=True) + 1e-8))


class StdNet(nn.Module):
    """Rows that are a large offset plus a tiny spread: the std is below bf16's step at the offset."""
    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d); self.norm = StdScale(); self.head = nn.Linear(d, 8)

    def forward(self, x):
        return self.head(self.norm(self.fc(x) * 0.01 + 300.0))


class LogSigmoidLoss(nn.Module):
    """log(sigmoid(x)): sigmoid(−40) underflows to 0 in float16, log gives −inf."""
    def forward(self, x):
        return torch.log(torch.sigmoid(x))


class LogSigNet(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc = nn.Linear(d, d); self.loss = LogSigmoidLoss()

    def forward(self, x):
        return self.loss(self.fc(x) * 40)


class Amplify(nn.Module):
    """x × 1000 on activations ~80: 8e4 > 65504 in float16."""
    def forward(self, x):
        return x * 1000.0


class AmplifyNet(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d); self.amp = Amplify(); self.head = nn.Linear(d, 4)

    def forward(self, x):
        return self.head(self.amp(self.fc(x) * 50))


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lam):
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.lam * g, None


class GradientReversal(nn.Module):
    """DANN's gradient-reversal layer with a tiny lambda: identity forward, -1e-6 x grad backward."""
    def __init__(self, lam=1e-6):
        super().__init__()
        self.lam = lam

    def forward(self, x):
        return _ScaleGrad.apply(x, self.lam)


class TinyGradNet(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d); self.rev = GradientReversal(); self.head = nn.Linear(d, d)

    def forward(self, x):
        return self.head(self.rev(torch.relu(self.fc(x))))


class TinyRMSNorm(nn.Module):
    """RMSNorm with eps = 1e-12 (0 in float16): an all-zero (padded) row gives 0 × inf = NaN."""
    def __init__(self, d, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d)); self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class RMSNet(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d, bias=False); self.norm = TinyRMSNorm(d); self.head = nn.Linear(d, 8)

    def forward(self, x):
        return self.head(self.norm(self.fc(x)))


# ---------------- healthy
class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.body(x)


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, batch_first=True); self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


class LNMLP(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, d),
                                 nn.LayerNorm(d))

    def forward(self, x):
        return self.net(x)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c); self.norm = nn.LayerNorm(c)
        self.pw1 = nn.Linear(c, 4 * c); self.act = nn.GELU(); self.pw2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.1))  # layer scale

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(self.act(self.pw1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class HFGPT2(nn.Module):
    """GPT-2 from a tiny config (offline, random weights), returning the logits."""
    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0,
                         attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
        self.m = GPT2LMHeadModel(cfg)

    def forward(self, ids):
        return self.m(input_ids=ids).logits
