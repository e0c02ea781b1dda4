"""The ``steps`` probe: recurrent layers over time, checked against torch.autograd on real torch.nn layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerlab
from layerlab.layers import LSTM as LayerlabLSTM
from layerlab.layers import LSTMCell as LayerlabLSTMCell


def _per_step(t: torch.Tensor, time_dim: int) -> list:
    return t.detach().movedim(time_dim, 0).flatten(1).norm(dim=1).tolist()


def _last_step_loss(batch_first: bool):
    return lambda out: (out[0][:, -1] if batch_first else out[0][-1]).pow(2).sum()


@pytest.mark.parametrize("make, shape, time_dim", [
    (lambda: nn.LSTM(6, 12, batch_first=True), (3, 9, 6), 1),
    (lambda: nn.GRU(6, 12, num_layers=2, bidirectional=True), (9, 3, 6), 0),
    (lambda: nn.LSTM(6, 12, proj_size=4), (9, 6), 0),  # unbatched, with projections
    (lambda: LayerlabLSTM(6, 12, num_layers=2, bidirectional=True, batch_first=True), (3, 9, 6), 1),
])
@pytest.mark.parametrize("input_requires_grad", [False, True])
def test_per_step_gradient_and_hidden_norms_match_autograd(make, shape, time_dim, input_requires_grad):
    torch.manual_seed(0)
    model, x = make(), torch.randn(*shape)
    loss = _last_step_loss(batch_first=time_dim == 1) if len(shape) == 3 else (lambda out: out[0][-1].pow(2).sum())
    report = layerlab.inspect(model, x.clone().requires_grad_(input_requires_grad), loss=loss, probes=["steps"])
    row = report.probe("steps").row("(root)")

    leaf = x.clone().requires_grad_(True)
    out = model(leaf)
    (grad,) = torch.autograd.grad(loss(out), leaf)
    assert row.series["grad_norm"] == pytest.approx(_per_step(grad, time_dim), rel=1e-5, abs=1e-12)
    assert row.series["h_norm"] == pytest.approx(_per_step(out[0], time_dim), rel=1e-6)
    assert row.values["steps"] == shape[time_dim]


def test_the_gradient_is_through_the_layer_alone_not_a_residual_around_it():
    torch.manual_seed(0)

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 8, batch_first=True)

        def forward(self, x):
            return x + self.lstm(x)[0]

    model, x, weights = Residual(), torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    loss = lambda out: (out * weights).sum()  # noqa: E731
    row = layerlab.inspect(model, x, loss=loss, probes=["steps"]).probe("steps").row("lstm")
    leaf = x.clone().requires_grad_(True)
    (through_lstm,) = torch.autograd.grad(model.lstm(leaf)[0], leaf, weights)  # ∂L/∂out = weights
    assert row.series["grad_norm"] == pytest.approx(_per_step(through_lstm, 1), rel=1e-5)
    (total,) = torch.autograd.grad(loss(model(leaf)), leaf)
    assert row.series["grad_norm"] != pytest.approx(_per_step(total, 1), rel=1e-2)  # the skip path is not in it


def test_inspects_results_are_the_same_with_the_probe_on():
    torch.manual_seed(0)
    model, x = nn.LSTM(6, 12, num_layers=2, dropout=0.5), torch.randn(9, 3, 6)  # dropout: the replay's RNG
    plain = layerlab.inspect(model, x, mode="train")
    probed = layerlab.inspect(model, x, mode="train", probes=["steps"])
    assert [p.grad_norm for p in probed.params] == [p.grad_norm for p in plain.params]
    assert probed.outputs[0].stats == plain.outputs[0].stats
    row = probed.probe("steps").row("(root)")
    assert len(row.series["grad_norm"]) == 9 and not [f for f in row.flags if f.startswith("no gradient")]


def test_the_default_loss_raises_no_vanishing_finding_on_a_stock_lstm_but_a_last_step_loss_does():
    torch.manual_seed(0)
    model, x = nn.LSTM(16, 32, batch_first=True), torch.randn(4, 20, 16)
    default = layerlab.inspect(model, x, probes=["steps"])
    assert default.probe("steps").findings == [] and 0.1 < default.probe("steps").row("(root)").values["grad_ratio"]

    last = layerlab.inspect(model, x, loss=_last_step_loss(True), probes=["steps"])
    (finding,) = last.probe("steps").findings
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_last_step_loss(True)(model(leaf)), leaf)
    norms = _per_step(grad, 1)
    assert finding.code == "steps-vanishing" and finding in last.problems
    assert finding.data["ratio"] == pytest.approx(norms[0] / norms[-1], rel=1e-4) and finding.data["ratio"] < 1e-3


class _Loop(nn.Module):
    """A cell run over time by hand: each call is one step."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, x):  # x: (B, T, I)
        state, hs = None, []
        for t in range(x.shape[1]):
            state = self.cell(x[:, t], state)
            hs.append(state[0])
        return torch.stack(hs, 1)


def _lstm_gate_saturation(cell, x):
    """σ and tanh saturation per step of an LSTM cell, from torch.nn.LSTMCell's own (h, c) and the gates
    recomputed on its weights (torch's stacked order i, f, g, o)."""
    twin = cell.to_torch() if hasattr(cell, "to_torch") else cell
    h = c = torch.zeros(x.shape[0], twin.hidden_size)
    sig, tanh = [], []
    with torch.no_grad():
        for t in range(x.shape[1]):
            gates = x[:, t] @ twin.weight_ih.T + twin.bias_ih + h @ twin.weight_hh.T + twin.bias_hh
            i, f, g, o = gates.chunk(4, 1)
            h, c = twin(x[:, t], (h, c))
            s = torch.sigmoid(torch.cat([i, f, o], 1))
            th = torch.cat([torch.tanh(g), torch.tanh(c)], 1)
            sig.append(float(((s < 0.01) | (s > 0.99)).float().mean()))
            tanh.append(float((th.abs() > 0.99).float().mean()))
    return sig, tanh


def test_gate_saturation_per_step_on_a_planted_saturated_layerlab_lstm_cell():
    torch.manual_seed(0)
    cell, x = LayerlabLSTMCell(8, 16), torch.randn(3, 10, 8)
    healthy = layerlab.inspect(_Loop(cell), x, probes=["steps"]).probe("steps")
    assert healthy.row("cell").values["sigmoid_sat"] == 0.0 and healthy.findings == []

    with torch.no_grad():
        cell.weight_ih.mul_(50.0)  # planted: the gates' pre-activations are huge
    result = layerlab.inspect(_Loop(cell), x, probes=["steps"]).probe("steps")
    row = result.row("cell")
    sig, tanh = _lstm_gate_saturation(cell, x)
    assert row.series["sigmoid_sat"] == pytest.approx(sig) and row.series["tanh_sat"] == pytest.approx(tanh)
    assert len(row.series["h_norm"]) == 10 and len(row.series["grad_norm"]) == 10
    assert min(sig) > 0.5
    (finding,) = [f for f in result.findings if f.code == "steps-saturated" and "sigmoid" in f.message]
    assert finding.where == "cell" and "sigmoid saturated" in row.flags


def test_layerlab_sequence_layer_saturation_has_one_value_per_step():
    torch.manual_seed(0)
    model = LayerlabLSTM(4, 8, num_layers=2, bidirectional=True)
    with torch.no_grad():
        model.weight_ih_l0.mul_(60.0)
    row = layerlab.inspect(model, torch.randn(6, 2, 4), probes=["steps"]).probe("steps").row("(root)")
    assert len(row.series["sigmoid_sat"]) == 6 and len(row.series["tanh_sat"]) == 6
    assert all(0.0 < v <= 1.0 for v in row.series["sigmoid_sat"])


def test_without_backward_the_hidden_norms_are_still_there():
    model, x = nn.GRU(4, 8), torch.randn(5, 2, 4)
    result = layerlab.inspect(model, x, backward=False, probes=["steps"]).probe("steps")
    row = result.row("(root)")
    assert row.series["h_norm"] == pytest.approx(_per_step(model(x)[0], 0), rel=1e-6)
    assert "grad_norm" not in row.series and "no backward pass" in result.note


def test_a_model_without_recurrent_layers_says_so():
    result = layerlab.inspect(nn.Linear(3, 2), torch.randn(2, 3), probes=["steps"]).probe("steps")
    assert result.rows == [] and result.note.startswith("no recurrent layer ran")
