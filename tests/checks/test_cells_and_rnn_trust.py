"""Gradient expectations that a correct layer meets: recurrent cells without ``hx``, wrapped stacked
LSTMs, dead ReLU units, loss targets, huge seeds. Every module under test is torch's own (or a thin
wrapper around one); a FAIL on any of them is a false alarm, and the broken contrasts must still fail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layerlab.checks.report import Status
from layerlab.checks.run import verify
from layerlab.errors import UsageError
from tests.checks.planted_bugs import truncated_rnn


def one(name, module, *inputs, **kwargs):
    report = verify(module, *inputs, only=[name], **kwargs)
    return report.checks[0]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- cells called without hx: weight_hh multiplies a zero state ---------------------------------------

@pytest.mark.parametrize("cls", [nn.RNNCell, nn.LSTMCell, nn.GRUCell])
def test_cells_without_hx_pass_param_grads_with_the_reason(cls):
    torch.manual_seed(0)
    cell = cls(3, 4)
    x = torch.randn(2, 3, generator=_gen())
    c = one("param_grads", cell, x)
    assert c.status == Status.PASS, c.summary
    assert c.details["zero_explained"] == {"weight_hh": {"kind": "by_design", "why": c.details["zero_explained"][
        "weight_hh"]["why"]}}
    assert "initial hidden state, which is zero" in c.summary
    # torch itself: weight_hh's gradient really is exactly zero here, and only weight_hh's
    cell.zero_grad()
    out = cell(x)
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    assert not cell.weight_hh.grad.any() and cell.weight_ih.grad.any()


@pytest.mark.parametrize("cls", [nn.RNNCell, nn.LSTMCell, nn.GRUCell])
def test_cells_with_a_real_hx_get_a_nonzero_weight_hh_gradient(cls):
    torch.manual_seed(0)
    h = torch.randn(2, 4, generator=_gen(1))
    hx = (h, torch.randn(2, 4, generator=_gen(2))) if cls is nn.LSTMCell else h
    c = one("param_grads", cls(3, 4), torch.randn(2, 3, generator=_gen()), hx)
    assert c.status == Status.PASS and "zero_explained" not in c.details, c.summary


class _DetachedHH(nn.RNNCell):
    """BUG: the hidden-to-hidden weight is detached, so it never learns."""

    def forward(self, input, hx=None):
        hx = torch.zeros(input.shape[0], self.hidden_size, dtype=input.dtype) if hx is None else hx
        return torch.tanh(F.linear(input, self.weight_ih, self.bias_ih) + F.linear(hx, self.weight_hh.detach(),
                                                                                   self.bias_hh))


def test_a_detached_weight_hh_still_fails_with_or_without_hx():
    torch.manual_seed(0)
    x, h = torch.randn(2, 3, generator=_gen()), torch.randn(2, 4, generator=_gen(1))
    for inputs in ((x,), (x, h)):
        c = one("param_grads", _DetachedHH(3, 4), *inputs)
        assert c.status == Status.FAIL and c.where == "weight_hh" and "no gradient" in c.summary, c.summary


# -- a stacked LSTM wrapped in a user module without batch_first ---------------------------------------

class _Stacked(nn.Module):
    """nn.LSTM(num_layers=2) inside a user module that does not copy ``batch_first``."""

    def __init__(self, batch_first):
        super().__init__()
        self.hidden_size, self.num_layers = 4, 2
        self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=batch_first)

    def forward(self, input, hx=None):
        return self.lstm(input, hx)


class _TransposingStacked(nn.Module):
    """Takes (B, T, E), runs a sequence-first nn.LSTM: its submodule's batch_first=False misleads."""

    def __init__(self):
        super().__init__()
        self.hidden_size, self.num_layers = 4, 2
        self.lstm = nn.LSTM(3, 4, num_layers=2)

    def forward(self, input, hx=None):
        out, state = self.lstm(input.transpose(0, 1), hx)
        return out.transpose(0, 1), state


def test_wrapped_stacked_lstm_reads_the_batch_from_the_state_it_returns():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, generator=_gen())  # B = 2, T = 5
    for module in (_Stacked(batch_first=True), _TransposingStacked()):
        c = one("recurrent_state", module, x)
        assert c.status == Status.PASS, c.summary
        assert c.details["expected_h"] == [2, 2, 4] and c.details["batch_first"] is True
        assert c.details["batch_first_from"] == "the batch size of the h_n it returns"
    # torch agrees: the state is (num_layers, B, H)
    assert tuple(_Stacked(batch_first=True)(x)[1][0].shape) == (2, 2, 4)


def test_the_h0_passed_and_batch_dims_decide_the_batch():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, generator=_gen())
    h0 = (torch.randn(2, 2, 4, generator=_gen(1)), torch.randn(2, 2, 4, generator=_gen(2)))
    c = one("recurrent_state", _Stacked(batch_first=True), x, h0)
    assert c.status == Status.PASS and c.details["batch_first_from"] == "the batch size of the h0 passed", c.summary
    c = one("recurrent_state", _Stacked(batch_first=True), x, batch_dims={"input": 0})
    assert c.status == Status.PASS and c.details["batch_first_from"] == "batch_dims['input']", c.summary
    # the user's word wins, even against the evidence: (5, 2, 3) read batch-first is B = 5
    c = one("recurrent_state", _Stacked(batch_first=False), torch.randn(5, 2, 3), batch_dims={"input": 0})
    assert c.status == Status.FAIL and c.details["expected_h"] == [2, 5, 4], c.summary


# -- ReLU recurrences whose units die ----------------------------------------------------------------------

def _dead_relu_rnn(dead_steps):
    """nn.RNN(relu) whose input weights are positive: an all-negative input step kills every unit."""
    torch.manual_seed(0)
    rnn = nn.RNN(3, 4, nonlinearity="relu")
    with torch.no_grad():
        rnn.weight_ih_l0.abs_()
        rnn.weight_hh_l0.mul_(0.1)
    x = torch.rand(5, 2, 3, generator=_gen()) + 0.1
    x[dead_steps] = -10.0
    return rnn, x


def test_dead_relu_units_are_named_not_called_a_detached_state():
    rnn, x = _dead_relu_rnn(dead_steps=2)
    out, _ = rnn(x)
    # torch: every unit is exactly 0 at step 2; after it, every sample has live units again
    assert not out[2].any() and out[3:].any(dim=-1).all()
    c = one("recurrent_state", rnn, x)
    assert c.status == Status.WARN, c.summary
    assert c.details["time_steps_without_gradient"] == [0, 1, 2]
    assert "dead" in c.summary and "detached" not in c.summary and "ReLU" in c.hint


def test_fully_dead_relu_rnn_warns_in_both_gradient_checks():
    torch.manual_seed(0)
    rnn = nn.RNN(3, 4, nonlinearity="relu")
    with torch.no_grad():
        rnn.bias_hh_l0.fill_(-10.0)
    x = torch.randn(5, 2, 3, generator=_gen())
    assert not rnn(x)[0].any()  # torch: all outputs exactly 0
    for name in ("recurrent_state", "param_grads"):
        c = one(name, rnn, x)
        assert c.status == Status.WARN and "dead ReLU" in c.summary, c.summary


class _ZeroBackwardScale(torch.autograd.Function):
    """y = w·x with a backward that returns zero for w: a wrong gradient, the output does move."""

    @staticmethod
    def forward(ctx, x, w):
        return x * w

    @staticmethod
    def backward(ctx, g):
        return g, torch.zeros(1)


class _WrongZeroGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1) * 2)

    def forward(self, x):
        return _ZeroBackwardScale.apply(x, self.w)


def test_zero_gradients_on_a_flat_output_warn_and_on_a_moving_one_fail():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        mlp[0].bias.fill_(-100.0)  # every hidden ReLU unit is shut on these inputs
    x = torch.randn(5, 3, generator=_gen())
    c = one("param_grads", mlp, x)
    assert c.status == Status.WARN and c.where == "0.weight, 0.bias, 2.weight", c.summary
    assert "do not change when it is nudged" in c.summary
    c = one("param_grads", _WrongZeroGrad(), torch.randn(5, generator=_gen()))
    assert c.status == Status.FAIL and c.where == "w", c.summary


def test_a_truncated_recurrence_still_fails_as_a_cut_gradient():
    layer, inputs, _ = truncated_rnn()
    c = one("recurrent_state", layer, *inputs)
    assert c.status == Status.FAIL and "gradient is cut" in c.summary and "detach" in c.hint, c.summary


# -- loss targets are not differentiated --------------------------------------------------------------------

def _loss_cases():
    g = _gen()
    p = torch.rand(4, 3, generator=g) * 0.8 + 0.1
    binary = (torch.rand(4, 3, generator=g) > 0.5).float()
    return [
        ("BCELoss", nn.BCELoss(), p, binary),
        ("SoftMarginLoss", nn.SoftMarginLoss(), torch.randn(4, 3, generator=g), binary * 2 - 1),
        ("PoissonNLLLoss", nn.PoissonNLLLoss(), torch.randn(4, 3, generator=g), torch.poisson(p * 3, generator=g)),
    ]


@pytest.mark.parametrize("name, loss, input, target", _loss_cases(), ids=[c[0] for c in _loss_cases()])
def test_loss_targets_are_left_alone(name, loss, input, target):
    report = verify(loss, input, target)
    assert [(c.name, c.summary) for c in report.checks if c.status == Status.FAIL] == []
    gc = next(c for c in report.checks if c.name == "gradcheck")
    first = loss.forward.__code__.co_varnames[1]  # "input", or PoissonNLLLoss's "log_input"
    assert gc.status == Status.PASS and [t["name"] for t in gc.details["checked"]] == [first], gc.summary


def test_requires_grad_flags_choose_the_inputs_checked():
    g = _gen()
    a, b = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    checked = lambda *xs: [t["name"] for t in one("gradcheck", nn.MSELoss(), *xs).details["checked"]]  # noqa: E731
    assert checked(a, b) == ["input"]  # no flags: a loss target is left alone
    assert checked(a.clone().requires_grad_(), b.clone().requires_grad_()) == ["input", "target"]
    assert checked(a.clone(), b.clone().requires_grad_()) == ["target"]
    # torch's own module tests pass the target without requires_grad: SoftMarginLoss has no target gradient
    x = torch.randn(4, 3, generator=g, requires_grad=True)
    c = one("gradcheck", nn.SoftMarginLoss(), x, torch.sign(torch.randn(4, 3, generator=g)))
    assert c.status == Status.PASS, c.summary


# -- seeds -------------------------------------------------------------------------------------------------------

def test_the_largest_seed_runs_every_check():
    torch.manual_seed(0)
    x = torch.randn(3, 4, generator=_gen())
    big = verify(nn.Linear(4, 2), x, seed=2 ** 63 - 1)
    assert [(c.name, c.summary) for c in big.checks if c.status == Status.FAIL] == []
    assert {c.name: c.status for c in big.checks} == {c.name: c.status for c in verify(nn.Linear(4, 2), x).checks}
    with pytest.raises(UsageError, match="seed"):  # beyond torch's range: refused, as by every entry point
        verify(nn.Linear(4, 2), x, seed=10 ** 30, only=["gradcheck"])
