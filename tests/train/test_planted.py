"""Planted training bugs: each must be told apart by its flag AND the module it names; the healthy
model passes. Every model is a real torch.nn composition trained for real (no stubs)."""

import math

import pytest
import torch
from torch import nn

import layerlab
from layerlab.train.run import train_check


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.fixture
def x():
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(1))


def _codes(report):
    return {(f.code, f.where) for f in report.flags}


def test_healthy_mlp_overfits_and_passes(x):
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = layerlab.train_check(model, x)
    assert report.ok, report.flags
    assert report.flags == []
    assert report.fit.verdict == "overfits" and report.fit.factor >= 10
    # the losses are real: recompute the first one with the untouched model and the report's target
    target = torch.randn(16, 4, generator=torch.Generator().manual_seed(layerlab.train.loss.target_seed(0)))
    assert report.losses[0] == pytest.approx(nn.functional.mse_loss(model(x), target).item(), rel=1e-6)
    assert report.losses[-1] < report.losses[0] / 10
    # the user's module is never trained in place
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # healthy Adam steps: every group's median update/weight ratio within 1e-3 … 0.1
    assert all(1e-3 < g.median_ratio < 0.1 for g in report.groups), [(g.label, g.median_ratio) for g in report.groups]


class _Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 32)
        self.branch = nn.Sequential(nn.Linear(8, 32), nn.Tanh())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.relu(self.trunk(x)) + self.branch(x).detach())


def test_detached_subgraph_is_named(x):
    report = train_check(_Detached(), x)
    assert not report.ok
    assert _codes(report) == {("no-grad", "branch")}
    flag = report.flag("no-grad")[0]
    assert flag.data["called"] is True and "detach" in flag.message
    assert sorted(flag.data["params"]) == ["branch.0.bias", "branch.0.weight"]
    assert report.group("branch.0").status == "no-grad" and not report.group("branch.0").changed
    assert report.group("trunk").changed and report.group("trunk").status == "ok"


def test_unused_module_is_named_as_never_called(x):
    class WithSpare(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 4)
            self.spare = nn.Linear(4, 4)  # registered, never called

        def forward(self, x):
            return self.body(x)

    model = WithSpare()
    report = train_check(model, x)
    assert _codes(report) == {("no-grad", "spare")}
    assert "never called" in report.flag("no-grad")[0].message


def test_parameter_left_out_of_the_optimizer_factory(x):
    report = train_check(_mlp(), x, optimizer=lambda m: torch.optim.Adam(m[0].parameters(), lr=1e-2))
    assert _codes(report) == {("not-in-optimizer", "2")}
    assert report.group("2").grad_norm[0] > 0 and not report.group("2").changed


def test_optimizer_instance_on_a_subset_is_rebuilt_on_the_copy(x):
    model = _mlp()
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    w0 = model[2].weight.detach().clone()
    report = train_check(model, x, optimizer=opt)
    assert _codes(report) == {("not-in-optimizer", "0")}
    assert report.group("2").changed
    assert torch.equal(model[2].weight, w0) and opt.state_dict()["state"] == {}  # the user's are untouched


def test_lr_1000x_too_high_adam_is_unstable(x):
    healthy = train_check(_mlp(), x, lr=1e-2)
    high = train_check(_mlp(), x, lr=10.0)
    assert healthy.ok and not high.ok
    assert "unstable" in {f.code for f in high.flags}
    unstable = high.flag("unstable")[0]
    assert set(unstable.data["modules"]) == {"0", "2"}
    # the first update is ~1000× the healthy one relative to the same initial weights
    ratio = high.group("0").update_ratio[0] / healthy.group("0").update_ratio[0]
    assert 300 < ratio < 3000


def test_lr_1000x_too_high_sgd_diverges_and_names_the_step(x):
    report = train_check(_mlp(), x, optimizer="sgd", lr=100.0)
    nf = report.nonfinite
    assert nf is not None and report.fit.verdict == "nonfinite"
    assert report.steps_run == nf.step + 1 < 50
    assert nf.what in ("weights", "loss", "gradient")
    assert {"nonfinite", "unstable"} <= {f.code for f in report.flags}


def test_dead_relu_from_a_large_negative_bias(x):
    model = _mlp()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    report = train_check(model, x)
    assert not report.ok
    assert ("dead-relu", "1") in _codes(report)
    assert ("zero-grad", "0") in _codes(report)
    zero = [f for f in report.flags if f.code == "zero-grad" and f.where == "0"][0]
    assert zero.data["dead_relus"] == ["1"] and zero.severity == "error"
    assert report.group("0").grad_norm[0] == 0.0 and not report.group("0").changed
    assert (model[0](x) < 0).all()  # really dead: the planted bias makes every pre-activation negative
    assert report.fit.verdict == "falls"  # only the last layer's bias moves the loss: no "more steps" advice
    assert "more steps will not help: dead-relu 1" in report.fit.message and "--steps" not in report.fit.message


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 32)
        self.head = nn.Linear(32, 4)
        self.aux = nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return self.head(h), self.aux(h)


def test_loss_on_the_wrong_output_names_the_untrained_head(x):
    report = train_check(_TwoHeads(), x, output=1)
    assert report.output == "output[1]"
    assert _codes(report) == {("wrong-output", "head")}
    assert report.flag("wrong-output")[0].data["feeds"] == ["output[0]"]
    right = train_check(_TwoHeads(), x, output=0)
    assert _codes(right) == {("wrong-output", "aux")}  # now aux is the one left untrained


def test_eval_mode_with_dropout_and_batchnorm_is_said(x):
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4)).eval()
    report = train_check(model, x)
    flag = report.flag("eval-mode")[0]
    assert flag.severity == "warning" and flag.data["modules"] == ["1", "3"]
    assert "dropout is inactive" in flag.message and "running statistics" in flag.message
    assert report.mode == "eval"
    assert not train_check(model, x, mode="train").flag("eval-mode")


class _Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


def test_first_nonfinite_step_names_its_module(x):
    report = train_check(nn.Sequential(nn.Linear(8, 8), _Log(), nn.Linear(8, 4)), x)
    assert report.nonfinite.step == 0 and report.nonfinite.what == "loss"
    assert report.nonfinite.where == "1"
    assert math.isnan(report.losses[0])
    assert [f.code for f in report.flags] == ["nonfinite"]  # no backward ran: nothing said about parameters


def test_requires_grad_false_is_a_warning(x):
    model = _mlp()
    model[0].requires_grad_(False)
    report = train_check(model, x)
    assert report.ok
    assert _codes(report) == {("requires-grad-false", "0")}


def test_nll_on_raw_outputs_goes_negative_and_is_not_called_a_fit(x):
    model = _mlp()  # ends in a Linear: its outputs are not log-probabilities
    target = torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(2))
    report = train_check(model, x, loss="nll", target=target)
    # torch agrees the loss has no floor: nll of raw outputs is −output[target], already below 0 here
    assert min(report.losses) < 0
    assert not report.ok and ("loss-negative", "(loss)") in _codes(report)
    flag = [f for f in report.flags if f.code == "loss-negative"][0]
    assert "log_softmax" in flag.hint


def test_cross_entropy_with_a_float_target_that_is_not_probabilities_is_refused(x):
    model = _mlp()
    soft = torch.randn(16, 4, generator=torch.Generator().manual_seed(3))  # not ≥ 0, rows do not sum to 1
    report = train_check(model, x, loss="cross_entropy", target=soft)
    assert not report.ok and ("target-not-probabilities", "(loss)") in _codes(report)
    probs = torch.softmax(soft, dim=1)  # a real distribution passes that check
    good = train_check(_mlp(), x, loss="cross_entropy", target=probs)
    assert "target-not-probabilities" not in [f.code for f in good.flags]
    assert min(good.losses) >= 0
