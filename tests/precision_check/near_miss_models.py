"""Near-miss models for test_near_misses.py: each looks to one of precision-check's cause rules
like its case, but its loss of precision has another cause (or it is healthy)."""
import torch
from torch import nn


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


class CancellingLogits(nn.Module):
    """softmax of small logits (|x| < 3) made by a matmul whose columns cancel: x ≈ 100 in every
    feature, W takes differences of features. The rounding happens in the matmul's inputs
    (x cast to the half dtype at 100: step 0.5 in bf16); the softmax's own rounding is tiny."""
    def __init__(self, d=16, k=8):
        super().__init__()
        w = torch.zeros(d, k)
        for j in range(k):
            w[2 * j, j], w[2 * j + 1, j] = 1.0, -1.0
        self.w = nn.Parameter(w)

    def forward(self, x, fp32_matmul=False, fp32_softmax=False):
        if fp32_matmul:
            with torch.autocast("cpu", enabled=False):
                logits = x.float() @ self.w
        else:
            logits = x @ self.w
        if fp32_softmax:
            with torch.autocast("cpu", enabled=False):
                return logits.float().softmax(-1)
        return logits.softmax(-1)


def cancelling_logits_input():
    return (100.0 + torch.randn(4, 16, generator=gen(1)),)


class StraightThroughThenVariance(nn.Module):
    """``h - h.detach()`` is exactly 0 (a straight-through trick: forward value 0, gradient 1),
    then a variance written E[x²] − E[x]² over values with a mean of 50: the variance cancels."""
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x, fp32_var=False):
        h = self.lin(x)
        zero = h - h.detach()
        u = h + 50.0
        if fp32_var:
            with torch.autocast("cpu", enabled=False):
                u = u.float()
                var = u.pow(2).mean(-1, keepdim=True) - u.mean(-1, keepdim=True) ** 2
        else:
            var = u.pow(2).mean(-1, keepdim=True) - u.mean(-1, keepdim=True) ** 2
        return zero + var


class EpsThenVariance(nn.Module):
    """``h + 1e-12`` (0 in float16, but nothing here is ever 0 or divided by), then the same
    cancelling variance: the eps is not the cause."""
    def __init__(self, d=16, eps=1e-12):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.eps = eps

    def forward(self, x, fp32_var=False):
        h = self.lin(x) + self.eps
        u = h + 50.0
        if fp32_var:
            with torch.autocast("cpu", enabled=False):
                u = u.float()
                return u.pow(2).mean(-1, keepdim=True) - u.mean(-1, keepdim=True) ** 2
        return u.pow(2).mean(-1, keepdim=True) - u.mean(-1, keepdim=True) ** 2


class SubnormalEpsNorm(nn.Module):
    """RMSNorm with eps = 1e-6 and an all-zero row: 1e-6 is a float16 subnormal (16 × 2⁻²⁴), not 0."""
    def __init__(self, d=16, eps=1e-6):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.eps = eps

    def forward(self, x):
        h = self.lin(x)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)


def zero_row_input(d=16):
    x = torch.randn(4, d, generator=gen(2))
    return (x,)


class LogNearOne(nn.Module):
    """log(sigmoid(z)) with z in [3, 9]: p between 0.95 and 0.9999 never underflows; log(p) ≈ p − 1
    there, so the rounding of p (near 1) is a large relative error of the log."""
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        with torch.no_grad():
            self.lin.weight.mul_(0.1)
            self.lin.bias.fill_(6.0)

    def forward(self, x, fp32_sigmoid=False):
        z = self.lin(x)
        if fp32_sigmoid:
            with torch.autocast("cpu", enabled=False):
                return torch.log(torch.sigmoid(z.float()))
        return torch.log(torch.sigmoid(z))


class ClampedOverflow(nn.Module):
    """``(h * 1000).clamp(-10, 10)``: the product passes 65504 (inf in float16) but the clamp maps
    inf to 10, exactly what float32 gives: healthy."""
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        with torch.no_grad():
            self.lin.bias.fill_(80.0)

    def forward(self, x):
        return (self.lin(x) * 1000.0).clamp(-10.0, 10.0)


class ClampedOverflowThenVariance(nn.Module):
    """The harmless clamped overflow, then the cancelling variance (the real cause)."""
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x, fp32_var=False):
        h = self.lin(x)
        gate = ((h + 80.0) * 1000.0).clamp(-10.0, 10.0)
        u = h + 50.0
        if fp32_var:
            with torch.autocast("cpu", enabled=False):
                u = u.float()
                var = u.pow(2).mean(-1, keepdim=True) - u.mean(-1, keepdim=True) ** 2
        else:
            var = u.pow(2).mean(-1, keepdim=True) - u.mean(-1, keepdim=True) ** 2
        return var + gate.mean(-1, keepdim=True)


class LargeAddThenMax(nn.Module):
    """``h + 300`` in half precision, then the max over features: the offset costs every value its
    low bits, yet the max of the shifted values is the shifted max to the dtype's rounding."""
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return (self.lin(x) + 300.0).amax(-1)


class ZeroMeanNorm(nn.Module):
    """nn.LayerNorm of a linear's zero-mean output scaled by 1e3: a large input, but no large mean
    next to its spread, so nothing cancels (the norm's fallback cause must not fire)."""
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d, bias=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(self.lin(x) * 1e3)


class QuantisedInputSoftmax(nn.Module):
    """The input is quantised to steps of 0.25 by the first module; the softmax after it runs on
    exactly representable values (bf16 holds multiples of 0.25 below 32 exactly)."""
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.sm = nn.Softmax(-1)

    def forward(self, x):
        q = torch.round(self.lin(x) * 4) / 4
        return self.sm(q * 2)
