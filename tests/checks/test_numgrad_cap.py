"""Slow-mode gradcheck never builds a Jacobian over the cap; big layers still finish in seconds."""

import time

import torch
from torch import nn

from layerlab.checks.report import Status
from layerlab.checks.run import verify


class _HalfGradLinear(torch.autograd.Function):
    """y = x Wᵀ + b, with the weight gradient halved (a planted bug)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, 0.5 * g.t() @ x, g.sum(0)


class _BigLinear(nn.Linear):
    def forward(self, x):
        return _HalfGradLinear.apply(x, self.weight, self.bias)


def _spy(monkeypatch):
    sizes = []
    real = torch.autograd.gradcheck

    def spy(fn, inputs, **kw):
        n_out = sum(y.numel() for y in fn(*inputs))
        sizes.append(sum(x.numel() for x in inputs) * n_out)
        return real(fn, inputs, **kw)

    monkeypatch.setattr(torch.autograd, "gradcheck", spy)
    return sizes


def test_big_layer_with_a_wrong_gradient_is_caught_without_slow_mode(monkeypatch):
    sizes = _spy(monkeypatch)
    torch.manual_seed(0)
    layer = _BigLinear(256, 256)  # 65,536 + 256 parameters
    assert sum(p.numel() for p in layer.parameters()) > 50_000
    t0 = time.perf_counter()
    report = verify(layer, torch.randn(4, 256), only=["gradcheck"])
    elapsed = time.perf_counter() - t0
    c = report.checks[0]
    assert c.status == Status.FAIL and c.where == "weight", c.summary
    slow = c.details["slow"][0]
    assert slow["tensor"] == "weight" and slow["ran"] is False
    assert slow["jacobian_elements"] == 65_536 * 1_024 > slow["cap"] == 1_000_000
    assert "cap" in slow["reason"]
    assert sizes == []  # torch's gradcheck never ran
    assert elapsed < 15, elapsed


def test_slow_mode_runs_only_for_tensors_under_the_cap(monkeypatch):
    sizes = _spy(monkeypatch)

    class _BothWrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w)
            return x @ w.t() + b

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w, 0.5 * g.t() @ x, 0.5 * g.sum(0)

    class _Layer(nn.Linear):
        def forward(self, x):
            return _BothWrong.apply(x, self.weight, self.bias)

    torch.manual_seed(0)
    cap = 5_000
    report = verify(_Layer(64, 16), torch.randn(3, 64), only=["gradcheck"], slow_cap=cap)
    c = report.checks[0]
    assert c.status == Status.FAIL and c.where == "weight, bias"
    by = {s["tensor"]: s for s in c.details["slow"]}
    assert by["weight"]["ran"] is False  # 1024 × 48 elements > 5000
    assert by["bias"]["ran"] is True and by["bias"]["passed"] is False  # 16 × 48 ≤ 5000
    assert sizes and max(sizes) <= cap


def test_big_correct_layer_passes_fast():
    torch.manual_seed(0)
    t0 = time.perf_counter()
    report = verify(nn.Conv2d(16, 32, 11), torch.randn(2, 16, 24, 24), only=["gradcheck"])  # 62k parameters
    assert report.checks[0].status == Status.PASS
    assert report.checks[0].details["jacobian_elements"] > 1_000_000
    assert time.perf_counter() - t0 < 15
