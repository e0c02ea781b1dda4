"""The reference side of parity is right: inputs reach it whatever they are called, structure buffers
are compared (not copied over), running statistics are copied, and a failure names the submodule."""

import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.checks.reference import align, is_state_buffer
from layerlab.checks.report import Status
from layerlab.checks.run import verify
from layerlab.checks.targets import verify_spec
from tests.checks import planted_bugs as pb


class HandGRUCell(nn.Module):
    """A correct GRU cell written out, ``forward(x, h)`` where torch's is ``forward(input, hx)``."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        for name, p in nn.GRUCell(input_size, hidden_size).named_parameters():
            self.register_parameter(name, nn.Parameter(p.detach().clone()))

    def forward(self, x: Tensor, h: Tensor) -> Tensor:
        r_i, z_i, n_i = F.linear(x, self.weight_ih, self.bias_ih).chunk(3, 1)
        r_h, z_h, n_h = F.linear(h, self.weight_hh, self.bias_hh).chunk(3, 1)
        r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
        return (1 - z) * torch.tanh(n_i + r * n_h) + z * h


# -- 1. inputs named after the layer's own parameters -------------------------------------------------

def test_keyword_inputs_named_after_the_layer_reach_the_reference_by_position():
    torch.manual_seed(0)
    report = verify(HandGRUCell(4, 5), x=torch.randn(3, 4), h=torch.randn(3, 5), reference=nn.GRUCell(4, 5),
                    only=["forward_parity", "backward_parity"], auto_reference=False)
    fwd, bwd = report.check("forward_parity"), report.check("backward_parity")
    assert fwd.status == Status.PASS, fwd.summary
    assert bwd.status == Status.PASS, bwd.summary
    assert "x, h passed by position to GRUCell.forward(input, hx" in fwd.details["reference"]
    assert "passed by position" in report.settings["reference_weights"]


def test_a_spec_with_inputs_x_and_h_passes_against_gru_cell(tmp_path):
    (tmp_path / "cells.py").write_text(textwrap.dedent("""
        from tests.checks.test_reference_trust import HandGRUCell
    """))
    spec = tmp_path / "cell.yaml"
    spec.write_text("layer: cells.py:HandGRUCell\nargs: {input_size: 4, hidden_size: 5}\n"
                    "inputs: {x: [3, 4], h: [3, 5]}\n"
                    "reference: {layer: nn.GRUCell, args: {input_size: 4, hidden_size: 5}}\n")
    report = verify_spec(str(spec), allow_import=True, only=["forward_parity", "backward_parity"])
    assert report.ok, [(c.name, c.summary) for c in report.checks]
    assert report.check("forward_parity").status == Status.PASS


def test_a_keyword_the_reference_names_stays_a_keyword():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    mask = torch.zeros(5, 5, dtype=torch.bool).triu(1)
    report = verify(mha, x, x, x, attn_mask=mask, reference=nn.MultiheadAttention(8, 2, batch_first=True),
                    only=["forward_parity"])
    fwd = report.check("forward_parity")
    assert fwd.status == Status.PASS, fwd.summary
    assert "passed by position" not in fwd.details["reference"]


# -- 2. buffers: structure is compared, state is copied ----------------------------------------------

def test_a_positional_table_built_wrong_is_found_in_its_buffer():
    module, inputs, kwargs = pb.wrong_positional_table()
    report = verify(module, *inputs, **kwargs, only=["forward_parity"])
    fwd = report.check("forward_parity")
    assert fwd.status == Status.FAIL and fwd.where == "pe"
    (found,) = fwd.details["buffers"]
    true_diff = float((module.pe - kwargs["reference"].pe).abs().max())
    assert true_diff > 1.0
    assert found["comparison"]["max_abs_diff"] == pytest.approx(true_diff)
    assert found["explains_output"] is True
    assert "structure built in __init__" in fwd.hint


def test_copying_the_buffer_on_request_hides_it_as_before():
    module, inputs, kwargs = pb.wrong_positional_table()
    report = verify(module, *inputs, **kwargs, weight_map={"pe": "pe"}, only=["forward_parity"])
    assert report.check("forward_parity").status == Status.PASS


def test_a_correct_positional_table_passes():
    torch.manual_seed(0)
    report = verify(pb.SinusoidalPositionalEncoding(8), torch.randn(2, 6, 8),
                    reference=pb.SinusoidalPositionalEncoding(8), only=["forward_parity"])
    assert report.check("forward_parity").status == Status.PASS


def test_running_statistics_are_state_and_copied():
    torch.manual_seed(0)
    trained = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))
    with torch.no_grad():
        for _ in range(3):
            trained(torch.randn(8, 4) * 3 + 1)
    trained.eval()
    fresh = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).eval()
    alignment = align(trained, fresh)
    assert set(alignment.state_buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert torch.equal(alignment.reference[1].running_mean, trained[1].running_mean)
    report = verify(trained, torch.randn(5, 4), reference=fresh, only=["forward_parity"])
    assert report.check("forward_parity").status == Status.PASS, report.check("forward_parity").summary
    assert is_state_buffer("encoder.bn.running_var") and not is_state_buffer("pe")


# -- 3. the first divergent submodule, nested and called by keyword ----------------------------------

class _Inner(nn.Module):
    def __init__(self, norm: nn.Module, by_keyword: bool) -> None:
        super().__init__()
        self.proj, self.norm, self.by_keyword = nn.Linear(16, 16), norm, by_keyword

    def forward(self, x: Tensor) -> Tensor:
        h = self.proj(x)
        return self.norm(x=h) if self.by_keyword else self.norm(h)


class _Outer(nn.Module):
    def __init__(self, norm: nn.Module, by_keyword: bool) -> None:
        super().__init__()
        self.block = _Inner(norm, by_keyword)
        self.head = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.block(x)))


def test_nested_divergence_named_with_keyword_inputs_and_the_scale_it_shows():
    torch.manual_seed(0)
    ours = _Outer(pb.UnbiasedLayerNorm(16), by_keyword=True)
    ref = _Outer(nn.LayerNorm(16), by_keyword=False)
    report = verify(ours, torch.randn(4, 16), reference=ref, only=["forward_parity", "backward_parity"],
                    auto_reference=False)
    fwd = report.check("forward_parity")
    assert fwd.status == Status.FAIL and fwd.where == "block.norm"
    div = fwd.details["divergence"]
    assert div["kind"] == "submodule" and div["pattern"]["kind"] == "ratio"
    assert div["pattern"]["ratio"] == pytest.approx((15 / 16) ** 0.5, rel=1e-4)
    assert "unbiased variance" in fwd.hint and "gate" not in fwd.hint
    bwd = report.check("backward_parity")
    assert bwd.where.split(", ")[0].startswith("block.norm.")
    assert "block.norm" in bwd.hint


def test_a_doubled_output_is_called_a_factor_two_not_a_variance():
    class Doubled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    torch.manual_seed(0)
    report = verify(Doubled(2, 2), torch.randn(3, 2), reference=nn.Linear(2, 2), only=["forward_parity"])
    pat = report.check("forward_parity").details["pattern"]
    assert pat["kind"] == "ratio" and pat["ratio"] == pytest.approx(2.0) and pat["factor"] == "2"
    assert "factor 2" in report.check("forward_parity").hint
