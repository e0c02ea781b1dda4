"""Three audit leftovers of train-check, each on a model written here and checked against plain torch:
a BatchNorm given one sample in train mode (the module is named), dropout so high the batch cannot be
overfit (the module and p are named, the claim replayed with dropout off), and a loss summed over the
batch under SGD (the count, reduction='sum' and the fix named, the fix replayed). Beside each, the
hand-fixed model passes."""

import copy
import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layerlab.errors import CheckFailed
from layerlab.train.run import train_check


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def _flag(report, code):
    found = report.flag(code)
    assert len(found) == 1, [(f.code, f.where, f.message) for f in report.flags]
    return found[0]


# -- 1. BatchNorm with one sample in train mode ---------------------------------------------------------

class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


class _ConvNet(nn.Module):
    """Two BatchNorms: the stem's sees 1·6·6 values per channel and is fine; the head's sees 1 and raises."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = _Head()

    def forward(self, x):
        return self.head(self.stem(x))


def test_batchnorm_given_one_sample_is_named_with_the_training_fix():
    torch.manual_seed(0)
    model, one = _ConvNet(), torch.randn(1, 3, 6, 6)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):  # what torch says: no module
        model(one)
    with pytest.raises(CheckFailed) as info:
        train_check(model, one)
    err = info.value
    assert err.where == "head.bn"  # not stem.1, the BatchNorm that had 36 values per channel
    assert "head.bn (BatchNorm1d)" in err.message and "Expected more than 1 value per channel" in err.message
    assert err.got == [1, 16]
    assert "drop_last=True" in err.hint and "model.eval()" in err.hint and "GroupNorm/LayerNorm" in err.hint


def test_batchnorm_with_two_samples_or_in_eval_mode_trains():
    torch.manual_seed(0)
    model = _ConvNet()
    assert train_check(model, torch.randn(4, 3, 6, 6), steps=10).ok
    report = train_check(model, torch.randn(1, 3, 6, 6), steps=10, mode="eval")  # running statistics: no raise
    assert report.steps_run == 10 and not report.flag("nonfinite")


def test_cli_names_the_batchnorm(tmp_path, capsys, monkeypatch):
    from layerlab.cli.app import main

    (tmp_path / "nets.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        def net():
            return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    """))
    (tmp_path / "bn.yaml").write_text("name: bn\nbuild: ./nets.py:net\ninput: {shape: [1, 8]}\n")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    code = main(["train-check", str(tmp_path / "bn.yaml"), "--allow-import", "--json"])
    err = capsys.readouterr().err
    assert code == 1, err
    data = json.loads(err.strip().splitlines()[-1])
    assert data["where"] == "1" and "(BatchNorm1d)" in data["message"] and "GroupNorm" in data["hint"]


# -- 2. dropout too high to overfit one batch ------------------------------------------------------------

class _DropMLP(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _inputs():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(16, 16, generator=gen), torch.randn(16, 4, generator=gen)


def _plain_factor(model, x, y, steps=50):
    """first loss / best of the last five, with plain torch and Adam at train-check's default lr."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return losses[0] / min(losses[-5:])


def test_dropout_09_is_named_with_p_and_the_replay_without_it():
    x, y = _inputs()
    torch.manual_seed(0)
    model = _DropMLP(0.9)
    report = train_check(model, x, target=y)
    flag = _flag(report, "dropout-high")
    assert flag.where == "drop" and flag.severity == "warning"
    assert "drop (p=0.9)" in flag.message and "drops 90 % of its inputs" in flag.message
    assert "probability to drop" in flag.hint and "p=0.1" in flag.hint
    assert report.fit.factor < 10 and "more steps" not in report.fit.message
    # the replay with dropout off, against plain torch: the same weights with the dropout off overfit
    torch.manual_seed(0)
    plain_off = _plain_factor(copy.deepcopy(model).eval(), x, y)  # train_check left `model` as it was
    assert plain_off >= 10
    assert flag.data["factor_dropout_off"] == pytest.approx(plain_off, rel=1e-3)
    assert flag.data["factor_train"] < 10


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_ordinary_dropout_is_not_flagged(p):
    x, y = _inputs()
    torch.manual_seed(0)
    report = train_check(_DropMLP(p), x, target=y)
    assert report.ok and not report.flag("dropout-high"), [(f.code, f.message) for f in report.flags]
    assert "replayed" not in report.fit.message


# -- 3. a loss summed over the batch under SGD -----------------------------------------------------------

def _sum_mse(out, y):
    return F.mse_loss(out, y, reduction="sum")


def _mean_mse(out, y):
    return F.mse_loss(out, y)


def test_summed_loss_under_sgd_names_the_sum_and_the_replayed_fix():
    torch.manual_seed(0)
    model, x = nn.Linear(64, 32), torch.randn(256, 64)
    report = train_check(model, x, loss=_sum_mse, optimizer="sgd")
    flag = _flag(report, "summed-loss")
    assert not report.ok and flag.severity == "error"
    assert "summed over 8,192 elements (mse_loss with reduction='sum')" in flag.message
    assert "8,192× the mean loss's" in flag.message and "lr 0.1 steps as lr 819" in flag.message
    assert flag.hint.startswith("use reduction='mean'") and "1.22e-05" in flag.hint
    assert "see summed-loss" in _flag(report, "unstable").hint
    # the "N×" is torch's: the gradient of the sum is 8,192 times the gradient of the mean
    out, y = model(x), torch.randn(256, 32)
    g_sum = torch.autograd.grad(_sum_mse(out, y), model.weight, retain_graph=True)[0]
    g_mean = torch.autograd.grad(_mean_mse(out, y), model.weight)[0]
    torch.testing.assert_close(g_sum, 8192 * g_mean, rtol=1e-4, atol=1e-4)
    # the replay said the mean loss trains: so does the hand-fixed model, checked on its own
    assert flag.data["replay"]["verdict"] in ("falls", "overfits")
    fixed = train_check(model, x, loss=_mean_mse, optimizer="sgd")
    assert fixed.ok and fixed.fit.verdict == flag.data["replay"]["verdict"]
    assert fixed.losses == pytest.approx([v for v in flag.data["replay"]["losses"]], rel=1e-4)


def test_summed_cross_entropy_module_counts_the_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(512, 16)
    report = train_check(model, x, loss=nn.CrossEntropyLoss(reduction="sum"), optimizer="sgd", lr=0.5, steps=20)
    flag = _flag(report, "summed-loss")
    assert "summed over 512 elements (cross_entropy with reduction='sum')" in flag.message


def test_summed_loss_is_not_flagged_where_it_does_no_harm():
    torch.manual_seed(0)
    model, x = nn.Linear(64, 32), torch.randn(256, 64)
    # Adam's step does not scale with the loss: the same summed loss trains, nothing to flag
    adam = train_check(model, x, loss=_sum_mse)
    assert adam.ok and not adam.flag("summed-loss")
    # SGD with an lr already divided by N: trains, nothing to flag
    small = train_check(model, x, loss=_sum_mse, optimizer="sgd", lr=0.1 / 8192)
    assert small.ok and not small.flag("summed-loss")
    # the sum divided by N by hand (a DivBackward0 root) is a mean
    divided = train_check(model, x, loss=lambda out, y: _sum_mse(out, y) / out.numel(), optimizer="sgd")
    assert divided.ok and not divided.flag("summed-loss")


def test_summed_loss_is_not_blamed_when_the_mean_loss_fails_too():
    torch.manual_seed(0)
    model, x = nn.Linear(64, 32), torch.randn(256, 64)
    report = train_check(model, x, loss=_sum_mse, optimizer="sgd", lr=1e4)  # far too high even for the mean
    flag = _flag(report, "summed-loss")
    assert flag.severity == "warning" and "the sum is not what stops it" in flag.message
    assert flag.data["replay"]["verdict"] in ("nonfinite", "rises", "flat")
    assert "summed-loss" not in _flag(report, "unstable").hint


def test_a_torch_loss_named_by_path_works_from_python_as_in_a_spec():
    # the spec's train: section takes torch.nn.functional.huber_loss; the Python function took only
    # names and callables ("unknown loss"): the same path now gives the same run as the function itself
    import layerlab

    def run(loss):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        return layerlab.train_check(model, torch.randn(8, 4), loss=loss, steps=5)

    by_path, by_function = run("torch.nn.functional.huber_loss"), run(F.huber_loss)
    assert by_path.losses == by_function.losses
    from layerlab.errors import UsageError

    with pytest.raises(UsageError, match="unknown loss") as raised:
        run("mymod:my_loss")
    assert "pass a loss function or module itself" in raised.value.hint


def test_a_zero_input_outside_a_recurrent_module_is_not_told_about_hidden_states():
    # an all-padding batch: the embedding returns zeros, so the head's weight gradient is exactly 0
    # (grad = grad_outᵀ · 0); the warning used to say "give it a non-zero input/state (hx)"
    torch.manual_seed(0)

    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8, padding_idx=0)
            self.head = nn.Linear(8, 3)

        def forward(self, ids):
            return self.head(self.emb(ids).mean(1))

    model, ids = Bag(), torch.zeros(4, 5, dtype=torch.long)
    assert torch.equal(model.emb(ids), torch.zeros(4, 5, 8))  # the premise, in plain torch
    try:
        report = train_check(model, ids, steps=5)
    except CheckFailed as failed:
        report = failed.report
    head = [f for f in report.flags if f.code == "zero-grad" and f.where == "head"]
    assert head and "hx" not in head[0].hint and "hidden state" not in head[0].message, head
    assert "input is all zeros" in head[0].message


def test_equal_predictions_from_equal_inputs_are_not_blamed_on_the_model():
    # constant-output says "the model ignores what tells the samples apart"; with every sample's input
    # the same, nothing does: that is the data's doing, said as a warning, never an error
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    same = torch.ones(6, 8)
    report = train_check(model, same, steps=20)
    (flag,) = report.flag("constant-output")
    assert flag.severity == "warning" and "same input" in flag.message
    assert report.ok
    with torch.no_grad():  # the premise: equal inputs give equal rows
        out = model(same)
    assert torch.equal(out, out[:1].expand_as(out))


def test_a_dead_relu_is_the_cause_named_not_a_constant_output():
    # every output of a dead ReLU is 0, so the prediction after it is the same for every sample:
    # true, but a consequence; the finding that leads must be the dead ReLU's
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    x = torch.randn(16, 16)
    with torch.no_grad():
        assert torch.equal(model[1](model[0](x)), torch.zeros(16, 32))  # the premise: dead
    report = train_check(model, x, steps=10)
    codes = [f.code for f in report.flags]
    assert not report.ok and "dead-relu" in codes and "constant-output" not in codes, codes
