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


class _ShrinkGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1e-6  # a real, tiny gradient: float16 flushes most of it to 0


class _TinyBelow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(_ShrinkGrad.apply(torch.relu(self.fc1(x))))


def test_a_real_tiny_gradient_is_checked_for_underflow_not_waved_through_as_noise():
    torch.manual_seed(0)
    model, x = _TinyBelow(), torch.randn(16, 16)
    report = layerlab.precision_check(model, x, autocast=["float16"])
    under = {f.where for f in report.runs[0].findings if f.kind == "underflow" and f.severity == "error"}
    assert "fc1.weight" in under, [(f.kind, f.where, f.message) for f in report.runs[0].findings]
    from layerlab.probe.backward import random_projection

    with torch.autocast("cpu", dtype=torch.float16):  # plain torch, the check's unit-norm loss
        out = model(x)
    [r] = random_projection([out], 0)
    g16 = torch.autograd.grad(out, model.fc1.weight, grad_outputs=r.to(out.dtype))[0]
    out32 = model(x)
    g32 = torch.autograd.grad(out32, model.fc1.weight, grad_outputs=r)[0]
    lost = torch.linalg.vector_norm(torch.where(g16 == 0, g32, 0.0)) / torch.linalg.vector_norm(g32)
    zeroed = next(p.zeroed for p in report.runs[0].params if p.name == "fc1.weight")
    assert float(lost) > 0.1 and abs(zeroed - float(lost)) < 0.05, (float(lost), zeroed)


def test_rounding_noise_around_zero_stays_noise_under_float16():
    transformers = __import__("pytest").importorskip("transformers", reason="needs transformers (the [hf] extra)")
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=100,
        max_position_embeddings=32))

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = bert

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    report = layerlab.precision_check(Wrap().eval(), torch.randint(0, 100, (2, 8)), autocast=["float16"])
    assert report.ok, [(f.kind, f.where, f.message) for r in report.runs for f in r.findings]
    negligible = [p.name for p in report.runs[0].params if p.negligible]
    assert any("key.bias" in n for n in negligible)  # softmax ignores a shift: noise in float32, still noise
