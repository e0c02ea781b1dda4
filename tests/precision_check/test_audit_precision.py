"""Found by an independent audit of precision-check on new planted bugs (graded against plain torch):
GradScaler rows compared scaled gradients with unscaled float32 ones (every row ~65536 eps off); a
cast model writing -1e9 into float16 got the "a float32 tensor meets a half one" hint; and
gradients zeroed by an inf in the forward (x / inf = 0) were called float16 underflow."""

from __future__ import annotations

import torch
from torch import nn

import layerlab


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)), torch.randn(16, 16)


def test_grad_scaler_rows_compare_unscaled_gradients():
    model, x = _mlp()
    plain = layerlab.precision_check(model, x, autocast=["float16"])
    scaled = layerlab.precision_check(model, x, autocast=["float16"], grad_scaler=True)
    for a, b in zip(plain.runs[0].rows, scaled.runs[0].rows):
        assert b.grad_error is not None and b.grad_error < 0.05, (b.label, b.grad_error)  # was ~64 (2^16 eps)
        assert abs(b.grad_error - a.grad_error) < 0.01, (b.label, a.grad_error, b.grad_error)


class _MaskedMinusBillion(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x):
        scores = self.q(x) @ x.transpose(-1, -2)
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=x.device).triu(1)
        return torch.softmax(scores.masked_fill(mask, -1e9), -1) @ x


def test_a_constant_beyond_float16s_range_gets_the_finfo_fix_not_the_dtype_one():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():  # torch itself refuses it: the finding is true
        try:
            _MaskedMinusBillion().half()(x.half())
            raised = None
        except RuntimeError as exc:
            raised = str(exc)
    assert raised is not None and "overflow" in raised
    report = layerlab.precision_check(_MaskedMinusBillion(), x, autocast=[], cast=["float16"])
    found = [f for f in report.runs[0].findings if f.kind == "raised"]
    assert found and "finfo" in found[0].fix and "dtype=x.dtype" not in found[0].fix


class _L2Norm(nn.Module):
    def forward(self, x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True))  # x*x past 65504 in float16: inf, x / inf = 0


class _Normalised(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.n, self.b = nn.Linear(32, 64), _L2Norm(), nn.Linear(64, 8)
        with torch.no_grad():
            self.a.bias.fill_(300.0)  # |x| ~ 300: x*x ~ 9e4

    def forward(self, x):
        return self.b(self.n(self.a(x)))


def test_gradients_zeroed_by_an_inf_in_the_forward_are_not_called_underflow():
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    report = layerlab.precision_check(_Normalised(), x, autocast=["float16"])
    run = report.runs[0]
    assert any(f.severity == "error" and f.where == "n" for f in run.findings), \
        [(f.kind, f.where, f.message) for f in run.findings]
    under = [f for f in run.findings if f.kind == "underflow"]
    assert all(f.severity != "error" and "may follow" in f.message for f in under), [f.message for f in under]
