"""Audit round 3 (gradcheck corners): correct layers in numerical corners, layers with subtle gradient bugs."""
import math
import torch
from torch import nn
import torch.nn.functional as F


# ---------------- correct ----------------
class _SiLUAlt(torch.autograd.Function):
    """x·σ(x) whose backward is written as σ(x) + y·(1 − σ(x)): equal to σ(x)(1 + x(1 − σ(x)))."""
    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        y = x * s
        ctx.save_for_backward(s, y)
        return y

    @staticmethod
    def backward(ctx, g):
        s, y = ctx.saved_tensors
        return g * (s + y * (1 - s))


class AltFormulaSiLU(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return _SiLUAlt.apply(self.lin(x))


class SafeWhereLog(nn.Module):
    """log on the positive part, 0 elsewhere, with the clamp trick so the dead branch has no NaN grad."""
    def forward(self, x):
        return torch.where(x > 0, torch.log(x.clamp_min(1e-6)), torch.zeros_like(x))


class KinkActivation(nn.Module):
    """relu + hardtanh: a piecewise-linear activation; the audit input sits on its kinks (−1, 0, 1)."""
    def forward(self, x):
        return F.relu(x) + F.hardtanh(x)


class TiedMaxPool(nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 2)


class SortWeighted(nn.Module):
    """Sorted values weighted by a learned vector (an order statistic layer)."""
    def __init__(self, d=6):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, d))

    def forward(self, x):
        return torch.sort(x, dim=-1).values * self.w + torch.topk(x, 2, dim=-1).values.sum(-1, keepdim=True)


class CausalMaskedAttention(nn.Module):
    """Single-head causal attention; key padding can hide every allowed key of a row: such rows give 0."""
    def __init__(self, d=8):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.d = d

    def forward(self, x, key_padding_mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        t = x.shape[1]
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        hide = causal | key_padding_mask[:, None, :]
        s = s.masked_fill(hide, float("-inf"))
        all_hidden = hide.all(-1, keepdim=True)
        s = s.masked_fill(all_hidden, 0.0)
        p = torch.softmax(s, dim=-1).masked_fill(all_hidden, 0.0)
        return p @ v


class GatherMix(nn.Module):
    """A float input and an integer index input (an embedding lookup added to x)."""
    def __init__(self, n=10, d=6):
        super().__init__()
        self.emb = nn.Embedding(n, d)

    def forward(self, x, idx):
        return x * self.emb(idx)


class InplaceOps(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        y = self.lin(x)
        y.mul_(2.0)
        y.add_(1.0)
        return torch.tanh_(y)


class TupleWithArgmax(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        y = self.lin(x)
        return y, y.argmax(-1)


class FFTFilter(nn.Module):
    """rfft → multiply by a learned complex filter → irfft."""
    def __init__(self, n=16):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.filt = nn.Parameter(torch.randn(n // 2 + 1, dtype=torch.cfloat, generator=g))
        self.n = n

    def forward(self, x):
        return torch.fft.irfft(torch.fft.rfft(x, dim=-1) * self.filt, n=self.n, dim=-1)


class MyBatchNorm1d(nn.Module):
    """BatchNorm1d by hand: batch stats in train mode, running stats updated in forward."""
    def __init__(self, num_features=6, eps=1e-5, momentum=0.1):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x):
        if self.training:
            mean = x.mean(0)
            var = x.var(0, unbiased=False)
            with torch.no_grad():
                n = x.shape[0]
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * var * n / (n - 1))
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class MyDropout(nn.Module):
    def __init__(self, p=0.3, d=6):
        super().__init__()
        self.p = p
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        y = self.lin(x)
        if not self.training:
            return y
        keep = torch.rand_like(y) >= self.p
        return y * keep / (1 - self.p)


# ---------------- buggy ----------------
class _MulSignBug(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gw = -(g * x)  # BUG: sign
        return g * w, gw.sum_to_size(w.shape)


class ScaleSignBug(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return _MulSignBug.apply(x, self.w)


class _SquareNo2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x  # BUG: 2·x


class SquareMissing2(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return _SquareNo2.apply(self.lin(x))


class DetachedResidual(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.lin(x)) + x.detach()  # BUG: residual path cut


class _SwappedGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga, gb = g * b * b, g * 2 * a * b
        return gb, ga  # BUG: wrong order


class SwappedGrads(nn.Module):
    def forward(self, a, b):
        return _SwappedGrads.apply(a, b)


class _UnstableSoftplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.softplus(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        e = torch.exp(x)
        return g * e / (1 + e)  # BUG: inf/inf = NaN once exp overflows (x > 88 in float32)


class UnstableSoftplus(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)
        with torch.no_grad():  # pre-activations reach ±100: exp overflows float32 (> 88.7)
            self.lin.weight.copy_(60.0 * torch.randn(d, d, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return _UnstableSoftplus.apply(self.lin(x))


class _AddBiasMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, g.mean(dim=(0, 1))  # BUG: sum over the broadcast dims


class BiasMeanGrad(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return _AddBiasMean.apply(x, self.b)


class _NormNoMeanTerm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        mu = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
        xhat = (x - mu) * rstd
        ctx.save_for_backward(xhat, rstd)
        return xhat

    @staticmethod
    def backward(ctx, g):
        xhat, rstd = ctx.saved_tensors
        # BUG: drops the mean(g) term; correct is rstd·(g − mean(g) − xhat·mean(g·xhat))
        return rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))


class NormNoMeanTerm(nn.Module):
    def forward(self, x):
        return _NormNoMeanTerm.apply(x)


class _GeluWrongConst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        c = math.sqrt(2 / math.pi)
        u = c * (x + 0.044715 * x ** 3)
        t = torch.tanh(u)
        du = c * (1 + 0.044715 * x ** 2)  # BUG: 3·0.044715
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)


class GeluWrongConst(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return _GeluWrongConst.apply(self.lin(x))


# ---------------- round 2: harder near misses ----------------
class HardtanhKinks(nn.Module):
    """hardtanh; the audit input holds exact ±1 (its kinks) among distinct values: no zero, no tie."""
    def forward(self, x):
        return F.hardtanh(x)


class ClampHalf(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return (x * self.scale).clamp(-0.5, 0.5)


class BigOffset(nn.Module):
    """Adds a large constant (1e8): correct, but a float64 finite difference loses ~8 digits."""
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x) + 1e8


class _DropoutNoScaleBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        keep = (torch.rand_like(x) >= p).to(x.dtype)
        ctx.save_for_backward(keep)
        ctx.p = p
        return x * keep / (1 - p)

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_tensors
        return g * keep, None  # BUG: 1/(1 − p) missing


class DropoutNoScaleBwd(nn.Module):
    def __init__(self, p=0.3, d=6):
        super().__init__()
        self.p = p
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        y = self.lin(x)
        return _DropoutNoScaleBwd.apply(y, self.p) if self.training else y


class UnsafeWhereSqrt(nn.Module):
    """sqrt on the positive part without the clamp trick: NaN gradients where x < 0."""
    def forward(self, x):
        return torch.where(x > 0, torch.sqrt(x), torch.zeros_like(x))
