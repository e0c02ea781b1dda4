"""Backward records: gradient norms against autograd, flags for parameters that get no gradient,
zero, vanishing, exploding or non-finite gradients, the default loss and a user loss."""

import math

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.probe.backward import RANDOM_PROJECTION


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_default_loss_gives_a_unit_gradient_at_the_output():
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh())
    report = layerlab.inspect(model, torch.randn(3, 5))
    assert report.backward.ran and report.backward.loss == RANDOM_PROJECTION
    assert report.backward.output_grad_norm == pytest.approx(1.0, rel=1e-5)
    assert report.call("").outputs[0].grad.norm == pytest.approx(1.0, rel=1e-5)


def test_gradient_norms_match_autograd():
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
    x = torch.randn(3, 5, requires_grad=True)
    loss = lambda out: (out ** 2).sum()  # noqa: E731
    report = layerlab.inspect(model, x, loss=loss)
    h = model[0](x)
    t = torch.tanh(h)
    out = model[2](t)
    gh, gt, gx, *gparams = torch.autograd.grad(loss(out), [h, t, x, *model.parameters()])
    assert report.call("0").outputs[0].grad.norm == pytest.approx(gh.norm().item(), rel=1e-5)
    assert report.call("1").outputs[0].grad.norm == pytest.approx(gt.norm().item(), rel=1e-5)
    assert report.call("0").inputs[0].grad.norm == pytest.approx(gx.norm().item(), rel=1e-5)
    names = [n for n, _ in model.named_parameters()]
    for name, g, (_, p) in zip(names, gparams, model.named_parameters()):
        rec = report.param(name)
        assert rec.grad_norm == pytest.approx(g.norm().item(), rel=1e-5)
        assert rec.norm == pytest.approx(p.norm().item(), rel=1e-6)
        assert rec.ratio == pytest.approx(g.norm().item() / p.norm().item(), rel=1e-5)
        assert rec.flags == []
    assert report.backward.loss_value == pytest.approx(loss(out).item(), rel=1e-5)
    assert x.grad is None and all(p.grad is None for p in model.parameters())  # .grad untouched


def test_user_grads_are_left_alone():
    lin = nn.Linear(3, 3)
    lin.weight.grad = torch.ones_like(lin.weight)
    layerlab.inspect(lin, torch.randn(2, 3))
    assert torch.equal(lin.weight.grad, torch.ones_like(lin.weight))


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.extra = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.used(x)


def test_unused_parameters_are_flagged():
    report = layerlab.inspect(Unused(), torch.randn(2, 4))
    for name in ("unused.weight", "unused.bias", "extra"):
        assert report.param(name).flags == ["no-grad"]
        assert report.param(name).grad_norm is None
    problems = {p.where: p for p in report.problems if p.code == "no-grad"}
    assert "never ran" in problems["unused.weight"].message
    assert "not used in the forward" in problems["extra"].message
    assert report.param("used.weight").flags == []
    assert report.ok  # a warning, not a failure


class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = nn.Linear(4, 4)
        self.back = nn.Linear(4, 4)

    def forward(self, x):
        return self.back(self.front(x).detach())


def test_detached_path_gets_no_gradient():
    report = layerlab.inspect(Detached(), torch.randn(2, 4, requires_grad=True))
    assert report.param("front.weight").flags == ["no-grad"]
    assert "detach" in next(p.message for p in report.problems if p.where == "front.weight")
    assert report.param("back.weight").grad_norm > 0
    # the detached tensor has no grad_fn; the front layer's output never receives a gradient
    assert report.call("back").inputs[0].grad_fn is None
    assert report.call("front").outputs[0].grad is None
    assert report.call("front").inputs[0].grad is None


def test_frozen_parameters_are_not_flagged():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[0].requires_grad_(False)
    report = layerlab.inspect(model, torch.randn(2, 3))
    assert report.param("0.weight").trainable is False
    assert report.param("0.weight").flags == []
    assert report.trainable_params == 12


def test_zero_vanishing_and_exploding_gradients():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.tiny = nn.Linear(4, 4)
            self.dead = nn.Linear(4, 4)
            self.huge = nn.Linear(4, 4)

        def forward(self, x):
            a = self.tiny(x) * 1e-9
            b = self.dead(x) * 0.0
            c = self.huge(x) * 1e6
            return a + b + c

    report = layerlab.inspect(Scaled(), torch.randn(2, 4))
    assert report.param("tiny.weight").flags == ["vanishing"]
    assert report.param("dead.weight").flags == ["zero-grad"]
    assert report.param("huge.weight").flags == ["exploding"]
    codes = {p.code for p in report.problems}
    assert {"vanishing", "zero-grad", "exploding"} <= codes


def test_nonfinite_gradient_is_an_error_and_located():
    class SqrtAtZero(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.root = Sqrt()

        def forward(self, x):
            y = self.lin(x)
            return self.root(y - y.detach())  # u = 0 exactly, d√u/du = ∞

    class Sqrt(nn.Module):
        def forward(self, u):
            return torch.sqrt(u)

    report = layerlab.inspect(SqrtAtZero(), torch.randn(2, 3))
    assert not report.ok
    assert report.param("lin.weight").flags[0] in ("nan", "inf")
    assert report.call("root").outputs[0].grad.finite
    assert not report.call("root").inputs[0].grad.finite
    problem = next(p for p in report.problems if p.code == "nonfinite-backward")
    assert problem.where == "root" and "first appears in the backward of root (Sqrt)" in problem.message


def test_no_backward():
    report = layerlab.inspect(nn.Linear(3, 3), torch.randn(2, 3), backward=False)
    assert report.backward.ran is False and report.backward.skipped == "--no-backward"
    assert report.params[0].grad_norm is None and report.params[0].flags == []
    assert report.calls[0].outputs[0].grad is None


def test_backward_skipped_when_nothing_requires_grad():
    lin = nn.Linear(3, 3).requires_grad_(False)
    report = layerlab.inspect(lin, torch.randn(2, 3))
    assert report.backward.ran is False
    assert "no floating output requires grad" in report.backward.skipped
    assert report.ok


def test_seeded_run_is_reproducible_and_leaves_the_global_rng_alone():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    x = torch.randn(4, 8)
    state = torch.get_rng_state()
    a = layerlab.inspect(model, x, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    b = layerlab.inspect(model, x, seed=3)
    assert a.call("1").outputs[0].stats == b.call("1").outputs[0].stats
    assert a.backward.loss_value == b.backward.loss_value
    assert not math.isnan(a.backward.loss_value)
