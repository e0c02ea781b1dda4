"""Without a reference, a layer that plainly mirrors a torch.nn layer is compared with it; anything
less than an unambiguous match is not compared (a false FAIL is worse than no check)."""

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.checks.auto_reference import auto_reference, map_parameters
from layerlab.checks.case import Arg
from layerlab.checks.report import Status
from layerlab.checks.run import verify
from tests.checks import planted_bugs as pb

PARITY = ["forward_parity", "backward_parity"]


@pytest.mark.parametrize("name", sorted(pb.MIRRORS_TORCH))
def test_auto_reference_catches_every_planted_bug_that_mirrors_torch(name):
    module, inputs, kwargs = pb.GALLERY[name]()
    kwargs.pop("reference", None)
    report = verify(module, *inputs, **kwargs, only=PARITY)
    assert report.reference == pb.MIRRORS_TORCH[name]
    assert "auto-reference " + pb.MIRRORS_TORCH[name] in report.settings["reference_weights"]
    assert not report.ok, [(c.name, c.summary) for c in report.checks]
    failed = report.failures[0]
    assert failed.where and "auto-reference" in failed.summary


def test_auto_reference_locates_as_precisely_as_a_given_one():
    module, inputs, kwargs = pb.swapped_gate_gru_cell()
    kwargs.pop("reference")
    fwd = verify(module, *inputs, **kwargs, only=PARITY).check("forward_parity")
    assert fwd.where == "weight_ih, weight_hh, bias_ih, bias_hh"
    assert fwd.details["hypothesis"]["ours"] == ["z", "r", "n"]


def test_auto_reference_off_skips_parity():
    module, inputs, kwargs = pb.swapped_gate_gru_cell()
    kwargs.pop("reference")
    report = verify(module, *inputs, **kwargs, only=PARITY, auto_reference=False)
    assert report.reference is None
    assert [c.status for c in report.checks] == [Status.SKIP, Status.SKIP]


# -- correct hand-written layers pass against their auto-reference ----------------------------------

class MyGRUCell(nn.Module):
    """A correct GRU cell with its own parameter names (mapped by shape and name tokens)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        k = hidden_size ** -0.5
        self.w_ih = nn.Parameter(torch.empty(3 * hidden_size, input_size).uniform_(-k, k))
        self.w_hh = nn.Parameter(torch.empty(3 * hidden_size, hidden_size).uniform_(-k, k))
        self.b_ih = nn.Parameter(torch.empty(3 * hidden_size).uniform_(-k, k))
        self.b_hh = nn.Parameter(torch.empty(3 * hidden_size).uniform_(-k, k))

    def forward(self, x: Tensor, h: Tensor) -> Tensor:
        r_i, z_i, n_i = F.linear(x, self.w_ih, self.b_ih).chunk(3, 1)
        r_h, z_h, n_h = F.linear(h, self.w_hh, self.b_hh).chunk(3, 1)
        r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
        return (1 - z) * torch.tanh(n_i + r * n_h) + z * h


class MyLayerNorm(nn.Module):
    def __init__(self, features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.rand(features) + 0.5)
        self.beta = nn.Parameter(torch.randn(features))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.gamma + self.beta


class MyLSTM(nn.Module):
    """A correct one-layer batch-first LSTM with torch's parameter names."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.batch_first = input_size, hidden_size, True
        for name, p in nn.LSTM(input_size, hidden_size).named_parameters():
            self.register_parameter(name, nn.Parameter(p.detach().clone()))

    def forward(self, input: Tensor, hx=None):
        B, T, _ = input.shape
        h = input.new_zeros(B, self.hidden_size)
        c = input.new_zeros(B, self.hidden_size)
        outs = []
        for t in range(T):
            gates = F.linear(input[:, t], self.weight_ih_l0, self.bias_ih_l0) + F.linear(h, self.weight_hh_l0,
                                                                                       self.bias_hh_l0)
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, 1), (h.unsqueeze(0), c.unsqueeze(0))


@pytest.mark.parametrize("make, inputs, label", [
    (lambda: MyGRUCell(4, 5), lambda: {"x": torch.randn(3, 4), "h": torch.randn(3, 5)}, "torch.nn.GRUCell"),
    (lambda: MyLayerNorm(6), lambda: {"x": torch.randn(4, 6)}, "torch.nn.LayerNorm"),
    (lambda: MyLSTM(3, 4), lambda: {"input": torch.randn(2, 5, 3)}, "torch.nn.LSTM"),
])
def test_correct_hand_written_layers_pass_against_their_auto_reference(make, inputs, label):
    torch.manual_seed(0)
    module = make()
    report = verify(module, **inputs(), only=PARITY)
    assert report.reference == label
    for c in report.checks:
        assert c.status == Status.PASS, (c.name, c.summary)
    assert "auto-reference" in report.check("forward_parity").summary


def test_the_mapping_is_reported():
    torch.manual_seed(0)
    report = verify(MyGRUCell(4, 5), x=torch.randn(3, 4), h=torch.randn(3, 5), only=["forward_parity"])
    note = report.settings["reference_weights"]
    assert "torch.nn.GRUCell(input_size=4, hidden_size=5, bias=True)" in note
    assert "w_ih→weight_ih" in note and "b_hh→bias_hh" in note
    assert "x, h passed by position" in note


# -- no auto-reference when it is not certain ------------------------------------------------------

def test_torch_modules_are_not_compared_with_themselves():
    torch.manual_seed(0)
    report = verify(nn.GRUCell(4, 5), torch.randn(3, 4), torch.randn(3, 5), only=PARITY)
    assert report.reference is None
    assert all(c.status == Status.SKIP for c in report.checks)

    class KeepsForward(nn.LayerNorm):
        pass

    assert auto_reference(KeepsForward(6), [Arg("input", torch.randn(2, 6))]).reference is None


def test_a_missing_attribute_that_changes_the_maths_means_no_comparison():
    class LayerNormNoEps(MyLayerNorm):
        def __init__(self, features):
            super().__init__(features)
            del self.eps

        def forward(self, x):
            return F.layer_norm(x, x.shape[-1:], self.gamma, self.beta, 1e-6)

    module = LayerNormNoEps(6)
    report = verify(module, torch.randn(4, 6), only=PARITY)
    fwd = report.check("forward_parity")
    assert fwd.status == Status.SKIP
    assert "no attribute eps" in fwd.summary


def test_a_shape_mismatch_in_the_trial_call_means_no_comparison():
    module, inputs, _ = pb.batch_first_state_rnn()
    fwd = verify(module, *inputs, only=PARITY).check("forward_parity")
    assert fwd.status == Status.SKIP and "differ in structure or shape" in fwd.summary


def test_ambiguous_shapes_do_not_map():
    class TwoSquare(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.randn(4, 4))
            self.c = nn.Parameter(torch.randn(4, 4))

    ref = nn.GRUCell(4, 4)
    assert isinstance(map_parameters(TwoSquare(), ref), str)
    assert isinstance(map_parameters(TwoSquare(), nn.Linear(4, 4)), str)


def test_cli_no_auto_reference(tmp_path, capsys, monkeypatch):
    from layerlab.cli.app import main

    monkeypatch.setenv("NO_COLOR", "1")
    (tmp_path / "cells.py").write_text(textwrap.dedent("""
        from tests.checks.planted_bugs import SwappedGateGRUCell
    """))
    spec = tmp_path / "cell.yaml"
    spec.write_text("layer: cells.py:SwappedGateGRUCell\nargs: {input_size: 4, hidden_size: 5}\n"
                    "inputs: {x: [3, 4], h: [3, 5]}\n")
    code = main(["gradcheck", str(spec), "--allow-import", "--only", "forward_parity", "--json"])
    out = capsys.readouterr().out
    assert code == 1, out
    data = json.loads(out)
    assert data["reference"] == "torch.nn.GRUCell"
    assert data["checks"][0]["where"] == "weight_ih, weight_hh, bias_ih, bias_hh"
    code = main(["gradcheck", str(spec), "--allow-import", "--only", "forward_parity", "--json",
                 "--no-auto-reference"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["checks"][0]["status"] == "skip"


def test_a_layer_named_layernorm_that_computes_rmsnorm_is_not_failed():
    class T5StyleLayerNorm(nn.Module):  # T5's "LayerNorm" is an RMSNorm, no mean subtracted
        def __init__(self, features: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.rand(features) + 0.5)

        def forward(self, x: Tensor) -> Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    torch.manual_seed(0)
    report = verify(T5StyleLayerNorm(6), torch.randn(4, 6), only=PARITY)
    fwd = report.check("forward_parity")
    assert fwd.status == Status.SKIP and "it computes torch.nn.RMSNorm" in fwd.summary
    assert not report.failures
