"""Train-mode gradcheck of stochastic layers (B9) and the mode the batch checks ran in (C11).

Truth first, from plain torch: ``torch.autograd.gradcheck`` sees a custom dropout backward that
drops the 1/(1−p) scale once the forward is re-seeded on every call; in train mode BatchNorm's
jacobian across samples is nonzero. Then layerlab's verdicts on the same layers.
"""

import pytest
import torch
from torch import nn
from torch.autograd.gradcheck import GradcheckError

import layerlab

P = 0.25  # not 0.5: the dropped factor 1/(1−p) = 4/3 cannot pass for a "factor 2"


class _DropFn(torch.autograd.Function):
    """Inverted dropout; ``buggy`` drops the 1/(1−p) scale in backward only."""

    @staticmethod
    def forward(ctx, x, p, buggy):
        mask = (torch.rand_like(x) > p).to(x.dtype)
        ctx.save_for_backward(mask)
        ctx.p, ctx.buggy = p, buggy
        return x * mask / (1 - p)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return (grad * mask if ctx.buggy else grad * mask / (1 - ctx.p)), None, None


class CustomDropout(nn.Module):
    """Its rate is ``self.p``: layerlab does not recognise it as stochastic by name."""

    def __init__(self, p=P, buggy=True):
        super().__init__()
        self.p, self.buggy = p, buggy

    def forward(self, x):
        return _DropFn.apply(x, self.p, self.buggy) if self.training else x


class NamedDropout(nn.Module):
    """A Linear, then the custom dropout; its rate is ``self.dropout``: recognised as stochastic."""

    def __init__(self, buggy=True):
        super().__init__()
        self.lin, self.dropout, self.buggy = nn.Linear(6, 6), P, buggy

    def forward(self, x):
        x = self.lin(x)
        return _DropFn.apply(x, self.dropout, self.buggy) if self.training else x


class OwnGenerator(nn.Module):
    """Dropout drawing from a torch.Generator of its own: re-seeding the global RNG does not repeat it."""

    def __init__(self):
        super().__init__()
        self.dropout = P
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x):
        if not self.training:
            return x
        mask = (torch.rand(x.shape, generator=self.gen, dtype=x.dtype) > self.dropout).to(x.dtype)
        return x * mask / (1 - self.dropout)


def _reseeded(fn, seed=3):
    def f(*a):
        torch.manual_seed(seed)
        return fn(*a)
    return f


def _x():
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(1))


# -- truth, plain torch ------------------------------------------------------------------------------

def test_truth_reseeded_gradcheck_sees_the_dropped_scale():
    x = _x().double().requires_grad_(True)
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        torch.autograd.gradcheck(_reseeded(lambda t: _DropFn.apply(t, P, True)), (x,))
    assert torch.autograd.gradcheck(_reseeded(lambda t: _DropFn.apply(t, P, False)), (x,))
    assert torch.autograd.gradcheck(_reseeded(lambda t: torch.nn.functional.dropout(t, P, True)), (x,))
    # in eval mode the Function is never called: the layer is the identity, and its gradient is right
    m = CustomDropout().eval()
    assert torch.equal(m(x), x)


def test_truth_own_generator_does_not_follow_the_global_seed():
    m, x = OwnGenerator().double(), _x().double()
    assert not torch.equal(_reseeded(m)(x), _reseeded(m)(x))


def _truth_ratio(buggy):
    """analytical / numerical directional derivative of sum(f(x)) along all-ones, re-seeded (torch only)."""
    x, h = _x().double(), 1e-6
    f = _reseeded(lambda t: _DropFn.apply(t, P, buggy))
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(xg).sum(), xg)
    numerical = float((f(x + h) - f(x - h)).sum()) / (2 * h)
    return float(g.sum()) / numerical


# -- layerlab: train-mode gradcheck -----------------------------------------------------------------

@pytest.mark.parametrize("module, wrong", [(CustomDropout(), {"x"}), (NamedDropout(), {"x", "lin.weight", "lin.bias"})],
                         ids=["rate-p-found-by-probe", "rate-named-dropout"])
def test_buggy_custom_dropout_fails_in_train_mode(module, wrong):
    """Every gradient upstream of the dropout lacks the 1/(1−p) scale: the input's, and the Linear's before it."""
    truth = _truth_ratio(buggy=True)
    assert truth == pytest.approx(1 - P, rel=1e-6)
    c = layerlab.verify(module, _x(), only=["gradcheck"]).check("gradcheck")
    assert c.status == "fail", c.summary
    assert c.summary.startswith("in train mode"), c.summary
    assert "wrong gradient w.r.t. x" in c.summary and set(c.where.split(", ")) == wrong
    assert "eval mode, where the dropout is off, passes" in c.summary
    ratios = {r["tensor"]: r["ratio"] for r in c.details["directional"]}
    assert set(ratios) == wrong and all(r == pytest.approx(truth, rel=1e-3) for r in ratios.values()), ratios
    assert c.details["eval_mode"]["status"] == "pass"


@pytest.mark.parametrize("module", [CustomDropout(buggy=False), NamedDropout(buggy=False), nn.Dropout(P),
                                    nn.Sequential(nn.Linear(6, 5), nn.Dropout(P), nn.Linear(5, 3))],
                         ids=["custom-p", "custom-named", "nn.Dropout", "linear-dropout-linear"])
def test_correct_dropout_passes_in_both_modes(module):
    assert _truth_ratio(buggy=False) == pytest.approx(1.0, rel=1e-6)
    report = layerlab.verify(module, _x())
    c = report.check("gradcheck")
    assert c.status == "pass", c.summary
    assert c.details["train_mode"]["status"] == "pass", c.details["train_mode"]
    assert "in eval mode, and in train mode" in c.summary
    assert report.ok, [(f.name, f.summary) for f in report.failures]


def test_train_mode_run_leaves_the_global_rng_as_it_was():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    c = layerlab.verify(nn.Dropout(P), _x(), only=["gradcheck"]).check("gradcheck")
    assert c.details["train_mode"]["status"] == "pass"  # it re-seeded the global RNG, inside fork_rng
    assert torch.equal(torch.get_rng_state(), state)


def test_randomness_off_the_global_seed_is_not_judged_in_train_mode():
    c = layerlab.verify(OwnGenerator(), _x(), only=["gradcheck"]).check("gradcheck")
    assert c.status == "pass", c.summary  # the eval-mode verdict, said to be one
    assert c.details["train_mode"]["status"] == "not judged"
    assert "(in eval mode); train mode not judged: the layer's randomness does not follow the global seed" in c.summary


def test_eval_mode_layer_is_checked_once_in_its_own_mode():
    c = layerlab.verify(CustomDropout().eval(), _x(), only=["gradcheck"]).check("gradcheck")
    assert c.status == "pass" and "train_mode" not in c.details and c.details["mode"] == "eval"


# -- C11: the mode the batch checks ran in --------------------------------------------------------

class HandBatchNorm1d(nn.Module):
    """BatchNorm over dim 0 written by hand: batch statistics in train mode, running ones in eval mode."""

    def __init__(self, n, eps=1e-5, momentum=0.1):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(n)), nn.Parameter(torch.zeros(n))
        self.eps, self.momentum = eps, momentum
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))

    def forward(self, x):
        if self.training:
            mean, var = x.mean(0), x.var(0, unbiased=False)
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(x.var(0), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def _cross_sample_jacobian(module, train):
    """max |∂out[0]/∂x[1]| by plain torch on a float64 copy."""
    import copy

    m = copy.deepcopy(module).double().train(train)
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(m, x)  # (B, E, B, E)
    return float(jac[0, :, 1, :].abs().max())


@pytest.mark.parametrize("module", [HandBatchNorm1d(5), nn.BatchNorm1d(5)], ids=["hand-written", "torch"])
def test_batch_checks_say_they_ran_in_eval_mode(module):
    assert _cross_sample_jacobian(module, train=True) > 1e-3  # truth: samples interact in train mode
    assert _cross_sample_jacobian(module, train=False) == 0.0
    report = layerlab.verify(module, torch.randn(8, 5), only=["batch_independence", "batch_consistency"])
    for c in report.checks:
        assert c.status == "pass", c.summary
        assert "; in eval mode (running statistics); in train mode" in c.summary, c.summary
    summary = report.check("batch_independence").summary
    if isinstance(module, nn.BatchNorm1d):
        assert "samples interact through the batch statistics of `BatchNorm1d`" in summary
    else:
        assert "`HandBatchNorm1d` (running_mean/running_var buffers, like BatchNorm) likely" in summary


def test_no_mode_note_where_train_mode_does_not_mix_the_batch():
    inorm = nn.InstanceNorm1d(5, affine=True, track_running_stats=True)  # running stats, but per sample
    x = torch.randn(8, 5, 6)
    m = inorm.double().train()
    jac = torch.autograd.functional.jacobian(m, x.double())
    assert float(jac[0, :, :, 1].abs().max()) == 0.0  # truth: no interaction across samples in train mode
    for module, inp in [(nn.InstanceNorm1d(5, affine=True, track_running_stats=True), x), (nn.Linear(5, 3),
                                                                                           torch.randn(8, 5))]:
        c = layerlab.verify(module, inp, only=["batch_independence"]).check("batch_independence")
        assert c.status == "pass" and "eval mode" not in c.summary, c.summary
