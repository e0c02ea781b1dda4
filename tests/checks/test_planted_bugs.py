"""The planted-bug gallery: each bug is caught, by the check we expect, pointing at the culprit."""

import pytest
from torch import nn

from layerlab.checks.report import Status
from layerlab.checks.run import verify
from tests.checks import planted_bugs as pb


def _run(factory, **extra):
    module, inputs, kwargs = factory()
    report = verify(module, *inputs, **kwargs, **extra)
    assert not report.ok, [(c.name, c.status.value, c.summary) for c in report.checks]
    return report


def _failed(report, name):
    check = report.check(name)
    assert check.status == Status.FAIL, (name, check.status, check.summary)
    return check


STACKED = "weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0"


def test_swapped_lstm_gates_fail_parity_and_name_the_gate_order():
    report = _run(pb.swapped_gate_lstm)
    fwd = _failed(report, "forward_parity")
    assert fwd.where == STACKED
    h = fwd.details["hypothesis"]
    assert h["kind"] == "gate_order" and h["ours"] == ["i", "f", "o", "g"] and h["torch"] == ["i", "f", "g", "o"]
    assert "(i, f, o, g)" in fwd.summary and "i, f, g, o" in fwd.hint and "transposed" not in fwd.hint
    bwd = _failed(report, "backward_parity")
    assert bwd.where.startswith(STACKED)
    assert "weight_ih_l0" in bwd.details["mismatched"]
    assert bwd.hint == fwd.hint
    # gradcheck passes: autograd differentiates the wrong function correctly
    assert report.check("gradcheck").status == Status.PASS


def test_transposed_weight_fails_backward_parity_at_weight_only():
    report = _run(pb.transposed_linear)
    fwd = _failed(report, "forward_parity")
    assert fwd.details["runs"][0]["dtype"] == "float64"
    assert fwd.where == "weight" and fwd.details["hypothesis"]["kind"] == "transposed"
    assert "used transposed" in fwd.hint and "gate" not in fwd.hint
    bwd = _failed(report, "backward_parity")
    assert bwd.where == "weight"  # bias gradients agree: the sum of grad_output either way
    assert set(bwd.details["mismatched"]) == {"input", "weight"}
    assert bwd.details["mismatched"][0] == "weight"  # worst relative error first
    assert report.check("gradcheck").status == Status.PASS
    assert report.check("batch_independence").status == Status.PASS


def test_off_by_one_causal_mask_reports_first_leaking_position():
    report = _run(pb.off_by_one_causal)
    c = _failed(report, "causality")
    assert c.details["first_leaking_position"] == 0
    assert c.details["leaks_from"] == 1
    assert c.where == "output position 0"
    assert "off-by-one" in c.hint
    assert c.details["claim"] == "`OffByOneCausalAttention.causal` is True"


def test_norm_over_batch_breaks_batch_independence_in_the_norm():
    report = _run(pb.norm_over_batch)
    c = _failed(report, "batch_independence")
    assert c.where == "norm"
    assert c.details["leaks"][0]["input"] == "x"
    _failed(report, "batch_consistency")


def test_dropped_factor_in_custom_backward_fails_gradcheck_at_the_parameter():
    report = _run(pb.dropped_factor_function)
    c = _failed(report, "gradcheck")
    assert c.where == "weight"  # the input's gradient is right
    bad = [r for r in c.details["directional"] if not r["ok"]]
    assert {r["tensor"] for r in bad} == {"weight"}
    assert bad[0]["ratio"] == pytest.approx(0.5, rel=1e-4)
    slow = c.details["slow"][0]
    assert slow["ran"] and not slow["passed"] and slow["tensor"] == "weight"


def test_missing_attention_scale_fails_parity_vs_multihead_attention():
    report = _run(pb.unscaled_attention)
    fwd = _failed(report, "forward_parity")
    assert fwd.where == "attention scores (q·kᵀ scale)"
    h = fwd.details["hypothesis"]
    assert h["kind"] == "attention_scale" and h["factor"] == pytest.approx(2.0)  # √d_head, d_head = 8 / 2
    assert "no 1/√d_head scale (d_head = 4)" in fwd.summary and "√d_head" in fwd.hint
    bwd = _failed(report, "backward_parity")
    assert bwd.where.split(", ")[1] == "in_proj_weight"
    assert report.check("gradcheck").status == Status.PASS


def test_detached_residual_branch_names_the_cut_parameters():
    report = _run(pb.detached_residual)
    pg = _failed(report, "param_grads")
    assert pg.where == "norm.weight, norm.bias"
    assert "no gradient reaches norm.weight, norm.bias" in pg.summary
    bwd = _failed(report, "backward_parity")
    assert "norm.weight" in bwd.where and "proj.weight" not in bwd.where


def test_batch_first_hidden_state_breaks_the_state_contract():
    c = _failed(_run(pb.batch_first_state_rnn), "recurrent_state")
    assert c.where == "h_n"
    assert "(1, 3, 5)" in c.summary and "(3, 1, 5)" in c.summary


def test_detached_hidden_state_cuts_gradients_through_time():
    c = _failed(_run(pb.truncated_rnn), "recurrent_state")
    assert c.details["time_steps_without_gradient"] == [0, 1, 2, 3]
    assert c.where == "input time step 0"


def test_inverted_bool_mask_convention_fails_masks():
    c = _failed(_run(pb.inverted_mask_attention), "masks")
    assert c.where == "attn_mask"
    assert "inverted" in c.summary
    probe = c.details["probe"]
    assert probe["bool_semantics"].startswith("True = attend")
    assert probe["reference_bool_semantics"].startswith("True = blocked")


def test_swapped_gru_gates_called_with_x_and_h_by_keyword():
    report = _run(pb.swapped_gate_gru_cell)
    fwd = _failed(report, "forward_parity")
    assert fwd.where == "weight_ih, weight_hh, bias_ih, bias_hh"
    assert fwd.details["hypothesis"]["ours"] == ["z", "r", "n"]
    assert "x, h passed by position to GRUCell.forward(input, hx" in fwd.details["reference"]
    _failed(report, "backward_parity")


def test_unbiased_variance_is_named_by_its_constant_ratio():
    module, inputs, kwargs = pb.unbiased_layernorm()
    report = _run(pb.unbiased_layernorm)
    fwd = _failed(report, "forward_parity")
    assert fwd.where == "output"
    pat = fwd.details["pattern"]
    x = inputs[0].double()
    measured = (module.double()(x) / nn.LayerNorm(16).double()(x)).mean().item()
    assert pat["kind"] == "ratio" and pat["ratio"] == pytest.approx(measured, rel=1e-6)
    assert pat["factor"] == "√((N−1)/N) with N=16"
    assert "unbiased" in fwd.hint and "gate" not in fwd.hint and "transposed" not in fwd.hint
    bwd = _failed(report, "backward_parity")
    assert bwd.where == "weight"  # grad bias is the same sum either way
    assert bwd.details["pattern"]["kind"] == "ratio" and "unbiased" in bwd.hint


def test_unbiased_norm_inside_a_block_is_located_in_the_norm():
    report = _run(pb.unbiased_norm_in_block)
    fwd = _failed(report, "forward_parity")
    assert fwd.where == "norm"
    assert fwd.details["divergence"]["pattern"]["factor"] == "√((N−1)/N) with N=16"
    bwd = _failed(report, "backward_parity")
    assert bwd.where.split(", ")[:2] == ["norm.weight", "norm.bias"]


def test_wrong_positional_table_is_found_in_the_buffer():
    fwd = _failed(_run(pb.wrong_positional_table), "forward_parity")
    assert fwd.where == "pe" and fwd.details["buffers"][0]["explains_output"]


def test_replicate_padding_shows_only_the_border_positions():
    report = _run(pb.replicate_pad_conv1d)
    fwd = _failed(report, "forward_parity")
    assert fwd.where == "output positions 0, 9"
    assert fwd.details["pattern"]["kind"] == "positions" and fwd.details["pattern"]["positions"] == [0, 9]
    bwd = _failed(report, "backward_parity")
    assert bwd.details["pattern"]["of"] == "output" and "padded" in bwd.hint


#: the words a hint may only use when the pattern found says so
_CAUSE_WORDS = {"gate": {"gate_order"}, "transposed": {"transposed"}, "unbiased": {"ratio"}}


@pytest.mark.parametrize("name", sorted(pb.GALLERY))
def test_parity_hints_follow_the_pattern_found(name):
    module, inputs, kwargs = pb.GALLERY[name]()
    report = verify(module, *inputs, **kwargs)
    for check in ("forward_parity", "backward_parity"):
        c = report.check(check)
        if c.status != Status.FAIL:
            continue
        kinds = {c.details.get("hypothesis", {}).get("kind"), c.details.get("pattern", {}).get("kind"),
                 c.details.get("divergence", {}).get("pattern", {}).get("kind")}
        for word, allowed in _CAUSE_WORDS.items():
            if word in (c.hint or ""):
                assert kinds & allowed, (name, check, c.hint)


@pytest.mark.parametrize("name", sorted(pb.GALLERY))
def test_every_planted_bug_is_caught_and_located(name):
    report = _run(pb.GALLERY[name])
    assert report.failures
    assert all(c.where for c in report.failures), [(c.name, c.where) for c in report.failures]
