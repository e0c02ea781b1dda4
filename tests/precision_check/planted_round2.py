"""The planted low-precision bugs of the round-2 precision-check audit (test_audit_round2.py).

Each model's ``fixed=True`` branch applies the fix precision-check suggests, written as its text
says. Letters: B batch · L length · E features.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

OFF = dict(device_type="cpu", enabled=False)  # torch.autocast(**OFF): the fixes' float32 regions


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


class ScaleAfterAttn(nn.Module):
    def __init__(self, e=64, fixed=False):
        super().__init__()
        self.q, self.k, self.v, self.e, self.fixed = nn.Linear(e, e), nn.Linear(e, e), nn.Linear(e, e), e, fixed

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.fixed:
            return F.scaled_dot_product_attention(q, k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.e)  # (B, L, L) past 65504 before the division
        return scores.softmax(-1) @ v


class Attention(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.up, self.attn, self.out = nn.Linear(16, 64), ScaleAfterAttn(fixed=fixed), nn.Linear(64, 8)
        with torch.no_grad():
            self.up.weight.mul_(150.0)

    def forward(self, x):
        return self.out(self.attn(self.up(x)))


class NaiveSoftmax(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, x):
        if self.fixed:
            x = x - x.amax(-1, keepdim=True)  # the fix: subtract the max first
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)


class Classifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.logits, self.softmax, self.out = nn.Linear(32, 10), NaiveSoftmax(fixed), nn.Linear(10, 4)
        with torch.no_grad():
            self.logits.weight.mul_(25.0)

    def forward(self, x):
        return self.out(self.softmax(self.logits(x)))


class SoftplusHead(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.score, self.fixed = nn.Linear(32, 1), fixed

    def forward(self, x):
        z = self.score(x)
        return F.softplus(z) if self.fixed else torch.log(1 + torch.exp(z))


class Scorer(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.body, self.head = nn.Linear(16, 32), SoftplusHead(fixed)
        with torch.no_grad():
            self.head.score.weight.mul_(40.0)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


class CosineDistance(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, a, b):
        if self.fixed:  # the fix: the cosine and the subtraction in float32
            with torch.autocast(**OFF):
                a, b = a.float(), b.float()
                return 1 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
        cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
        return 1 - cos  # cos ≈ 0.999: the difference keeps few bits


class Siamese(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.enc, self.dist = nn.Linear(16, 32), CosineDistance(fixed)

    def forward(self, x, noise):
        return self.dist(self.enc(x), self.enc(x + noise)) * 1e3


class Integrator(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.f, self.h0, self.fixed = nn.Linear(16, 16), nn.Linear(16, 16), fixed

    def forward(self, x):  # x (B, L, E)
        h0 = self.h0(x[:, 0])
        if self.fixed:
            h0 = h0.float()  # the fix: the running value float32 from where it is created
        h = h0 + 300.0
        for t in range(x.shape[1]):
            step = 0.01 * torch.tanh(self.f(x[:, t]))
            h = h + step  # bfloat16's step at 300 is 2: increments of 0.01 vanish
        return h


class Dynamics(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.integ, self.out = Integrator(fixed), nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.integ(x) - 300.0)


class Standardize(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.eps = 1e-5 if fixed else 1e-12  # 1e-12 is 0 in float16

    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)


class Standardized(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fc, self.std, self.out = nn.Linear(16, 32, bias=False), Standardize(fixed), nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.std(self.fc(x)))


class SharpAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = 1e-3

    def forward(self, logits, v):
        return (logits / self.temperature).softmax(-1) @ v  # an error of 1e-3 in a logit is 1 here


class Pick(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.score, self.val = nn.Linear(16, 24), nn.Linear(16, 8)
        self.pick, self.out = SharpAttention(), nn.Linear(8, 4)
        self.fixed = fixed
        with torch.no_grad():
            self.score.weight.mul_(0.05)
            self.score.bias.fill_(2.0)

    def forward(self, x):  # x (B, L, E)
        v = self.val(x)
        if self.fixed:  # the fix: the logits and the softmax (all that makes its input) in float32
            with torch.autocast(**OFF):
                return self.out(self.pick(self.score(x.mean(1).float()).unsqueeze(1), v.float()).squeeze(1))
        return self.out(self.pick(self.score(x.mean(1)).unsqueeze(1), v).squeeze(1))


class FourierFeatures(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.proj, self.fixed = nn.Linear(3, 32, bias=False), fixed
        with torch.no_grad():
            self.proj.weight.normal_(0, 300.0, generator=_gen(3))

    def forward(self, x):
        if self.fixed:  # the fix: the projection and sin/cos in float32
            with torch.autocast(**OFF):
                a = self.proj(x.float())
                return torch.cat([a.sin(), a.cos()], -1)
        a = self.proj(x)  # angles ~1000: bfloat16's step there is 8
        return torch.cat([a.sin(), a.cos()], -1)


class Field(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.ff, self.mlp = FourierFeatures(fixed), nn.Linear(64, 4)

    def forward(self, x):
        return self.mlp(self.ff(x))


class CubicAct(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, x):
        if self.fixed:  # the fix: keep pow in float32
            with torch.autocast(**OFF):
                x = x.float()
                return x ** 3 / (1 + x ** 2)
        return x ** 3 / (1 + x ** 2)  # |x| ~ 150: x ** 3 is past 65504


class Cubic(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(16, 32), CubicAct(fixed), nn.Linear(32, 4)
        with torch.no_grad():
            self.fc.weight.mul_(80.0)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class HandRMSNorm(nn.Module):
    def __init__(self, e, fixed=False):
        super().__init__()
        self.weight, self.fixed = nn.Parameter(torch.ones(e)), fixed

    def forward(self, x):
        if self.fixed:  # the fix: the statistics on x.float(), as LlamaRMSNorm does
            with torch.autocast(**OFF):
                xf = x.float()
                return self.weight * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Normed(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fc, self.norm, self.out = nn.Linear(16, 64), HandRMSNorm(64, fixed), nn.Linear(64, 4)
        with torch.no_grad():
            self.fc.weight.mul_(400.0)

    def forward(self, x):
        return self.out(self.norm(self.fc(x)))


class L2Norm(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, x):
        if self.fixed:  # the fix: the statistic in float32
            with torch.autocast(**OFF):
                x = x.float()
                return x / (x * x).sum(-1, keepdim=True).sqrt()
        return x / (x * x).sum(-1, keepdim=True).sqrt()  # squares of ~1e-4 are 0 in float16


class Embedder(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fc, self.l2, self.out = nn.Linear(16, 32), L2Norm(fixed), nn.Linear(32, 4)
        with torch.no_grad():
            self.fc.weight.mul_(1e-4)
            self.fc.bias.mul_(1e-4)

    def forward(self, x):
        return self.out(self.l2(self.fc(x)))


class Block(nn.Module):
    def __init__(self, e=16):
        super().__init__()
        self.fc = nn.Linear(e, e)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(e) * 2.0)
            self.fc.bias.zero_()

    def forward(self, x):
        return x + self.fc(x)  # the residual stream triples per block


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.layers, self.out = nn.Linear(16, 16), nn.ModuleList(Block() for _ in range(10)), nn.Linear(16, 4)

    def forward(self, x):
        x = self.inp(x) * 4
        for layer in self.layers:
            x = layer(x)
        return self.out(x / 1e4)
