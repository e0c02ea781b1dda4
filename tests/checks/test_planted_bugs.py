"""The planted-bug gallery: each bug is caught, by the check we expect, pointing at the culprit."""

import pytest

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


def test_swapped_lstm_gates_fail_parity_at_weight_ih_l0():
    report = _run(pb.swapped_gate_lstm)
    _failed(report, "forward_parity")
    bwd = _failed(report, "backward_parity")
    assert bwd.where.split(", ")[0] == "weight_ih_l0"
    assert "weight_ih_l0" in bwd.details["mismatched"]
    # gradcheck passes: autograd differentiates the wrong function correctly
    assert report.check("gradcheck").status == Status.PASS


def test_transposed_weight_fails_backward_parity_at_weight_only():
    report = _run(pb.transposed_linear)
    fwd = _failed(report, "forward_parity")
    assert fwd.details["runs"][0]["dtype"] == "float64"
    bwd = _failed(report, "backward_parity")
    assert bwd.where == "weight"  # bias gradients agree: the sum of grad_output either way
    assert set(bwd.details["mismatched"]) == {"input", "weight"}
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
    assert fwd.where == "output[0]"
    bwd = _failed(report, "backward_parity")
    assert bwd.where.split(", ")[0] == "in_proj_weight"
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


@pytest.mark.parametrize("name", sorted(pb.GALLERY))
def test_every_planted_bug_is_caught_and_located(name):
    report = _run(pb.GALLERY[name])
    assert report.failures
    assert all(c.where for c in report.failures), [(c.name, c.where) for c in report.failures]
