"""A gradient error with no forward error behind it: rounding at a kink (a ReLU input that rounding
moved across 0) or lost precision in the backward? (:mod:`layerlab.mixed.kinks`)

The stock pre-LN encoder layer in train mode has one linear1 output that is +2.8e-4 in float32 and
-3.7e-5 under float16 autocast: the ReLU switches that unit off, and the small model's gradients
move by 7 %. Checked here with plain torch; the note must say so, and real backward losses (a
softmax whose backward cancels a near-constant gradient) must keep their warning.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

import layerlab
from layerlab.mixed import diagnose, kinks
from layerlab.mixed.dtypes import autocast_supported
from layerlab.probe.backward import random_projection
from layerlab.target.seeding import seed_generators

FP16 = pytest.mark.skipif(autocast_supported("cpu", "float16") is not None, reason="no float16 autocast on this CPU")
FP16_BAR = 32 * 2.0 ** -10  # the gradient bar of a float16 run (32·eps)


def _encoder():
    """The init that shows the flip (the audit's stock model, built second)."""
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
    x = (torch.randn(2, 10, 32, generator=g), torch.randn(2, 10, 32, generator=g))[1]
    return model, x


def _torch_run(model, x, half, activation=None):
    """Plain torch, seeded and projected as precision-check does: (linear1's output, the gradients)."""
    if activation is not None:
        model = copy.deepcopy(model)
        model.activation = activation
    kept = {}
    hook = model.linear1.register_forward_hook(lambda m, i, o: kept.__setitem__("h", o.detach().float()))
    try:
        with torch.random.fork_rng(devices=[]):
            seed_generators(0, [])
            with torch.autocast("cpu", dtype=torch.float16, enabled=half):
                out = model(x)
    finally:
        hook.remove()
    (r,) = random_projection([out.detach().float()], 0)
    named = list(model.named_parameters())
    grads = torch.autograd.grad(out, [p for _, p in named], grad_outputs=r.to(out.dtype))
    return kept["h"], {n: g.float() for (n, _), g in zip(named, grads)}


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def _serious(report):
    return [(f.kind, f.where, f.run) for f in report.findings if f.severity in ("error", "warning")]


@FP16
def test_a_relu_input_rounded_across_zero_is_a_note_with_torchs_numbers():
    model, x = _encoder()
    h32, g32 = _torch_run(model, x, half=False)
    h16, g16 = _torch_run(model, x, half=True)
    flipped = ((h32 > 0) != (h16 > 0)).nonzero()
    assert len(flipped) == 1  # plain torch: exactly one ReLU input takes the other side
    i = tuple(flipped[0].tolist())
    v32, v16 = float(h32[i]), float(h16[i])
    assert v32 > 0 > v16 and abs(v32) < 1e-3
    torch_error = _rel(g16["norm2.weight"], g32["norm2.weight"])
    assert torch_error > FP16_BAR  # the error is real, and large
    # float32 with that one element on the half run's side: the gradients agree within rounding
    half_side = h16 > 0
    _, g_forced = _torch_run(model, x, half=False, activation=lambda h: torch.where(half_side, h, 0))
    torch_on_branches = max(_rel(g16[n], g_forced[n]) for n in g16)
    assert torch_on_branches < FP16_BAR / 10

    report = layerlab.precision_check(model, x, autocast=["float16"])
    assert report.ok and not _serious(report), report.findings
    (note,) = [f for f in report.findings if f.kind == "gradient"]
    assert note.severity == "info" and note.where == "norm2.weight"
    assert f"off by {torch_error:.2g}" in note.message
    assert f"1 of {h32.numel()} ReLU inputs took the other side" in note.message
    assert f"e.g. {v32:.1e} in float32, {v16:.1e} here" in note.message
    said = float(re.search(r"differs by ([0-9.e-]+) %", note.message).group(1)) / 100
    assert said < FP16_BAR / 10 and said == pytest.approx(torch_on_branches, rel=0.1, abs=2e-4)
    assert "rounding at a kink, not lost precision in the backward" in note.message


class Peaked(nn.Module):
    """softmax, then a Linear whose rows are all nearly 1: the gradient reaching the softmax is a
    large constant plus a small part, rounded in float16 by lin2's backward, and softmax's backward
    subtracts the constant — the small part keeps few bits. The forward is fine."""

    def __init__(self, body=None, width=16, spread=1e-3):
        super().__init__()
        self.body = body if body is not None else nn.Sequential(nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 8)
        with torch.no_grad():
            self.head.weight.copy_(1 + spread * torch.randn(8, width))

    def forward(self, x):
        return self.head(torch.softmax(self.body(x), -1))


@pytest.fixture
def verdicts(monkeypatch):
    seen = []
    verify = kinks.verify

    def spy(*args, **kwargs):
        seen.append(verify(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(kinks, "verify", spy)
    return seen


@FP16
def test_a_backward_that_loses_precision_keeps_its_warning(verdicts):
    torch.manual_seed(0)
    model = Peaked()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    # plain torch: the output is within a few eps, the first layer's gradient is not
    r = random_projection([model(x).detach()], 0)[0]
    with torch.autocast("cpu", dtype=torch.float16):
        out16 = model(x)
    out32 = model(x)
    (g16,) = torch.autograd.grad(out16, [model.body[0].bias], grad_outputs=r.to(out16.dtype))
    (g32,) = torch.autograd.grad(out32, [model.body[0].bias], grad_outputs=r)
    assert _rel(out16.float(), out32) < 2 * 2.0 ** -10 and _rel(g16, g32) > 4 * FP16_BAR

    report = layerlab.precision_check(model, x, autocast=["float16"])
    (warning,) = [f for f in report.findings if f.kind == "gradient"]
    assert warning.severity == "warning" and warning.cause == diagnose.IN_THE_BACKWARD
    assert warning.where == "body.0.bias"
    (verdict,) = verdicts  # the ReLU was replayed, and its sides do not explain the error
    assert verdict.reason is None and min(verdict.errors.values()) > FP16_BAR


@FP16
def test_flips_that_do_not_explain_the_error_keep_the_warning(verdicts):
    """The encoder's one flipped ReLU input is still there, but a head whose backward cancels adds
    an error that float32 on the half run's branches does not share."""
    body, x = _encoder()
    h32, _ = _torch_run(body, x, half=False)
    h16, _ = _torch_run(body, x, half=True)
    assert int(((h32 > 0) != (h16 > 0)).sum()) == 1
    model = Peaked(body, width=32, spread=3e-3)
    report = layerlab.precision_check(model, x, autocast=["float16"])
    (warning,) = [f for f in report.findings if f.kind == "gradient"]
    assert warning.severity == "warning" and warning.cause == diagnose.IN_THE_BACKWARD
    (verdict,) = verdicts
    assert verdict.flipped == 1 and [f.total for f in verdict.flips] == [h32.numel()]
    assert max(verdict.errors.values()) > 2 * FP16_BAR


@FP16
def test_no_kink_op_keeps_the_warning(verdicts):
    torch.manual_seed(0)
    model = Peaked(nn.Linear(16, 16))
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    report = layerlab.precision_check(model, x, autocast=["float16"])
    (warning,) = [f for f in report.findings if f.kind == "gradient"]
    assert warning.severity == "warning" and warning.cause == diagnose.IN_THE_BACKWARD
    (verdict,) = verdicts
    assert verdict.reason.startswith("no kink op") and not verdict.explains(1.0)


class EveryKink(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.lo = nn.Parameter(torch.full((4, 1, 1), -0.2))
        self.pool = nn.MaxPool2d(2)
        self.acts = nn.Sequential(nn.ReLU6(), nn.Hardtanh(-0.5, 0.5), nn.LeakyReLU(0.1), nn.Threshold(0.05, -1.0))

    def forward(self, x):
        h = self.conv(x)
        h = torch.clamp(h, min=self.lo, max=torch.tensor(0.6)) + h.clamp(max=0.3) + h.relu()
        h = self.acts(h * 4) + torch.nn.functional.relu6(h * 8) + torch.nn.functional.relu(h.clone(), inplace=True)
        return self.pool(h)


def test_replaying_float32s_own_sides_is_torch_exactly():
    """The forced branches are torch's own: replaying float32's sides in float32 gives torch's
    outputs and gradients for clamp (tensor bounds), relu6, hardtanh (nn.ReLU6 is one), leaky_relu, threshold, an
    in-place relu and max-pool, with nothing flipped."""
    torch.manual_seed(0)
    model = EveryKink()
    x = torch.randn(2, 2, 8, 8, generator=torch.Generator().manual_seed(1))
    out = model(x)
    grads = torch.autograd.grad(out.sum(), list(model.parameters()))
    seen = kinks.SidesSeen()
    with seen:
        again = model(x)
    assert [c.family for c in seen.calls] == ["clamp", "clamp", "ReLU", "Hardtanh", "Hardtanh", "LeakyReLU",
                                              "threshold", "ReLU6", "ReLU", "max-pool"]
    replay = kinks.SidesForced(seen.calls)
    with replay:
        forced = model(x)
    assert replay.failed is None and replay.next == len(seen.calls)
    assert all(f.flipped == 0 for f in replay.flips.values()) and torch.equal(again, out)
    torch.testing.assert_close(forced, out, rtol=0, atol=0)
    for g, f in zip(grads, torch.autograd.grad(forced.sum(), list(model.parameters()))):
        torch.testing.assert_close(f, g, rtol=1e-6, atol=1e-7)


def test_a_replay_of_another_model_says_why_it_does_not_fit():
    seen = kinks.SidesSeen()
    with seen:
        torch.relu(torch.randn(3, 4))
    replay = kinks.SidesForced(seen.calls)
    with replay:
        torch.relu(torch.randn(3, 5))
    assert "ReLU[3, 5] here, ReLU[3, 4] there" in replay.failed


def test_too_many_kink_elements_are_not_recorded():
    seen = kinks.SidesSeen(limit=10)
    with seen:
        torch.relu(torch.randn(3, 4))
    assert seen.too_many and not seen.calls
