"""Every run of precision-check gets the same inputs and the same loss, whatever the model writes.

Found by a review: a model that writes into its input gave the autocast run other inputs than the
float32 run (errors of 99 where torch's are 0.003; a false alarm on a mask scaled in place), and a
gradient-reversal Function's in-place ``g.mul_(-1)`` changed the output gradient the autocast run
reused (gradient error 2.0 on every module). Checked here against plain torch autocast runs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerlab
from layerlab.probe.backward import random_projection


def _torch_errors(model, args, kwargs=None):
    """Output and parameter-gradient relative errors of bf16 autocast vs float32, in plain torch,
    each run on fresh copies of the inputs, with the check's seeded unit-norm projection."""
    kwargs = kwargs or {}

    def step(autocast):
        a = [x.clone() for x in args]
        k = {n: v.clone() for n, v in kwargs.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(*a, **k)
        [r] = random_projection([out], 0)
        grads = torch.autograd.grad(out, list(model.parameters()), grad_outputs=r.to(out.dtype))
        return out.float(), grads

    (o32, g32), (o16, g16) = step(False), step(True)
    rel = lambda a, b: float(torch.linalg.vector_norm(a.detach().double() - b.detach().double())
                             / torch.linalg.vector_norm(b.detach().double()))
    return rel(o16, o32), max(rel(h, g) for h, g in zip(g16, g32))


class _Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.mul_(-1)  # in place, as gradient-reversal layers are often written


class _Reversed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return _Reverse.apply(self.fc(x))


def test_a_backward_that_writes_into_its_gradient_does_not_change_the_next_runs_loss():
    torch.manual_seed(0)
    model, x = _Reversed(), torch.randn(32, 16)
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    _, grad_error = _torch_errors(model, [x])
    got = report.runs[0].grad_error
    assert got == pytest.approx(grad_error, rel=1e-3) and got < 0.05  # bf16 rounding, not a sign flip (2.0)


class _Centres(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        x.sub_(x.mean()).mul_(100)  # writes into the caller's tensor
        return self.fc(x)


class _ScalesMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, mask):
        mask.mul_(1e5)
        return self.fc(x) * torch.sigmoid(mask / 1e5)


def test_a_model_that_writes_into_its_input_is_compared_on_the_same_inputs_and_hands_them_back():
    torch.manual_seed(0)
    model, x = _Centres(), torch.randn(32, 16)
    before = x.clone()
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    assert torch.equal(x, before)  # the caller's tensor is as it was
    out_error, grad_error = _torch_errors(model, [before])
    run = report.runs[0]
    assert run.output_error == pytest.approx(out_error, rel=0.05) and run.output_error < 0.05
    assert run.grad_error == pytest.approx(grad_error, rel=0.05)
    assert report.ok and any("writes into its input(s) x" in n for n in report.notes)


def test_a_mask_scaled_in_place_is_no_false_alarm():
    torch.manual_seed(0)
    model, x, mask = _ScalesMask(), torch.randn(8, 16), torch.randn(8, 16)
    before = mask.clone()
    report = layerlab.precision_check(model, x, mask=mask, autocast=["bfloat16"])
    assert report.ok, [f.message for r in report.runs for f in r.findings]
    assert torch.equal(mask, before)
    out_error, _ = _torch_errors(model, [x], {"mask": before})
    assert report.runs[0].output_error == pytest.approx(out_error, rel=0.05)


class _MaskedScores(nn.Module):
    """Attention-style scores with a mask filled from torch.finfo(dtype).min, as HF's T5 and
    Llama write it: the fill follows the run's dtype (-65504 in float16, never inf)."""

    def __init__(self, big: float = 1.0):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.big = big

    def forward(self, x):
        s = self.q(x) @ x.transpose(-1, -2) * self.big
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
        s = torch.where(mask, torch.finfo(s.dtype).min, s)
        return torch.softmax(s, -1) @ x


def test_a_mask_fill_from_finfo_is_not_a_float16_overflow_but_a_large_score_still_is():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    quiet = layerlab.precision_check(_MaskedScores(), x, autocast=["bfloat16"])
    assert not [f for f in quiet.forecast if f.kind == "fp16-overflow"], [f.message for f in quiet.forecast]
    with torch.no_grad():  # the same model in float16: finite, as the check now says
        assert bool(torch.isfinite(_MaskedScores().half()(x.half())).all())
    loud = layerlab.precision_check(_MaskedScores(big=1e5), x, autocast=["bfloat16"])
    over = [f for f in loud.forecast if f.kind == "fp16-overflow"]
    assert over and "float16" in over[0].message  # scores of ~1e5 next to the fill: still found
