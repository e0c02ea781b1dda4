"""The ``sparsity``, ``dead`` and ``rank`` probes on real torch modules with planted facts,
checked against counts made here from the layers' real outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerlab


def test_sparsity_matches_a_hand_count_per_channel_on_dim_1_for_conv():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU())
    x = torch.randn(4, 3, 10, 10)
    with torch.no_grad():
        y = model(x)
    row = layerlab.inspect(model, x, probes=["sparsity"]).probe("sparsity").row("1")
    per_channel = (y == 0).float().mean((0, 2, 3))
    assert row.values["zeros"] == pytest.approx(float((y == 0).float().mean()))
    assert row.values["axis"] == 1 and row.values["channels"] == 6
    assert row.series["zeros/ch"] == pytest.approx(per_channel.tolist())
    assert row.values["channel_min"] == pytest.approx(float(per_channel.min()))
    near = (y.abs() <= 1e-3 * y.pow(2).mean().sqrt()).float().mean()
    assert row.values["near_zero"] == pytest.approx(float(near))


def test_sparsity_channels_last_for_sequence_features_and_a_zero_channel():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 5), nn.ReLU())
    with torch.no_grad():
        model[0].weight[2] = 0
        model[0].bias[2] = -1.0  # channel 2: always zero after the ReLU
    x = torch.randn(3, 7, 8)
    row = layerlab.inspect(model, x, probes=["sparsity"]).probe("sparsity").row("1")
    assert row.values["axis"] == 2 and row.values["zero_channels"] == 1 and row.series["zeros/ch"][2] == 1.0
    assert not row.flags  # the side came from the Linear before the ReLU, not a guess


def test_dead_relu_planted_channel_is_named_with_module_and_unit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        model[0].bias[5] = -100.0
    report = layerlab.inspect(model, torch.randn(128, 8), probes=["dead"])
    dead = [p for p in report.problems if p.code == "dead-units"]
    assert len(dead) == 1 and dead[0].where == "1" and dead[0].data["units"] == [5]
    row = report.probe("dead").row("1")
    assert row.values["dead"] == 1 and row.values["samples"] == 128
    # the same model on 4 samples: listed, but not a warning (a healthy unit can be 0 on 4 samples)
    small = layerlab.inspect(model, torch.randn(4, 8), probes=["dead"])
    assert not [p for p in small.problems if p.code == "dead-units"]
    assert 5 in [int(u) for u in small.probe("dead").row("1").flags[1].split(": ")[1].split(", ")]


class _FunctionalMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 12)

    def forward(self, x):
        return torch.tanh(F.relu(self.fc(x)) * 1.0) + torch.sigmoid(self.fc(x) * 100)


def test_dead_sees_functional_relu_and_saturated_sigmoid_in_model_code():
    torch.manual_seed(0)
    model = _FunctionalMLP()
    with torch.no_grad():
        model.fc.bias[3] = -50.0  # dead for F.relu, and sigmoid(100 · x) saturated near 0 for unit 3
    report = layerlab.inspect(model, torch.randn(200, 6), probes=["dead"])
    codes = {(p.code, p.where) for p in report.problems}
    assert ("dead-units", "(root)") in codes  # the root module's own code (path "")
    dead = next(p for p in report.problems if p.code == "dead-units")
    # the root has no ReLU module: the message says it is a call in its forward, not "ReLU units of (root)"
    assert "ReLU units of (root)'s forward (a functional relu call) are zero for all 200 samples" in dead.message
    with torch.no_grad():  # and torch agrees: unit 3 of F.relu(fc(x)) is zero on every sample
        assert not F.relu(model.fc(torch.randn(200, 6)))[:, 3].any()
    sat = [p for p in report.problems if p.code == "saturated-units"]
    assert sat and 3 in sat[0].data["units"]
    kinds = [r.flags[0] for r in report.probe("dead").rows]
    assert kinds == ["relu", "tanh", "sigmoid"]


def test_rank_planted_rank_one_and_full_rank_by_construction():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
    with torch.no_grad():
        model[2].weight.copy_(torch.randn(32, 1) @ torch.randn(1, 32))
    report = layerlab.inspect(model, torch.randn(64, 16), probes=["rank"])
    assert report.probe("rank").row("2").values["erank"] == pytest.approx(1.0, abs=1e-3)
    assert [p.where for p in report.problems if p.code == "rank-collapse"] == ["2"]
    # Hadamard columns (zero mean, orthogonal, equal norms) through an identity Linear: 7 equal singular values
    h = torch.tensor([[1.0]])
    for _ in range(3):
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    x = h[:, 1:]  # (8, 7)
    eye = nn.Linear(7, 7)
    with torch.no_grad():
        eye.weight.copy_(torch.eye(7))
        eye.bias.zero_()
    row = layerlab.inspect(eye, x, probes=["rank"]).probe("rank").row("")
    assert row.values["erank"] == pytest.approx(7.0, abs=1e-9)
