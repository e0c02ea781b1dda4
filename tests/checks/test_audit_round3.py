"""Audit round 3: 13 hand-written layers with a planted bug and 8 correct layers that are hard to verify.

For each, the truth is computed here with plain torch (``torch.autograd.gradcheck`` in float64, the
torch.nn layer with the same weights, a perturbation), never taken from layerlab; then ``layerlab.verify``
must fail the check that tests the bug, name where, and say what the bug is — and give no failure on
the correct layers. The layers are in ``tests/checks/audit_round3_layers.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.autograd.gradcheck import GradcheckError
from torch.func import functional_call

import layerlab
from layerlab.checks.report import Status
from tests.checks import audit_round3_layers as L


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def by_name(report):
    return {c.name: c for c in report.checks}


def failures(report):
    return sorted(c.name for c in report.checks if c.status == Status.FAIL)


def torch_gradcheck(module, *inputs, kwargs=None):
    """torch's own float64 gradcheck of the module w.r.t. its inputs and trainable parameters."""
    m = copy.deepcopy(module).double()
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    params = tuple(p.detach().clone().requires_grad_() for n, p in m.named_parameters() if p.requires_grad)
    xs = tuple(x.detach().double().requires_grad_() for x in inputs)

    def f(*args):
        out = functional_call(m, dict(zip(names, args[len(xs):])), args[:len(xs)], kwargs or {})
        return out[0] if isinstance(out, tuple) else out

    try:
        return torch.autograd.gradcheck(f, xs + params, raise_exception=True, fast_mode=True)
    except GradcheckError:
        return False


def torch_copy(ours, theirs):
    """``theirs`` (a torch.nn layer) carrying ``ours``'s weights, both float64."""
    theirs.load_state_dict(ours.state_dict())
    return copy.deepcopy(ours).double(), theirs.double()


# -- custom autograd.Functions: gradcheck must fail, naming the tensor ----------------------------------

@pytest.mark.parametrize("layer, wrong", [
    (L.FusedSwish, "x"),          # backward forgets x·σ'(x)
    (L.BiasAdd, "bias"),          # bias gradient of one sample, not summed over the batch
    (L.Scale, "weight"),          # weight gradient computed from the weight instead of the input
    (L.TanhHalf, "x"),            # saved tanh output halved in place through .data
])
def test_wrong_custom_backward_fails_gradcheck_naming_the_tensor(layer, wrong):
    torch.manual_seed(0)
    m, x = layer(), _x(4, 6)
    assert not torch_gradcheck(m, x)
    check = by_name(layerlab.verify(m, x))["gradcheck"]
    assert check.status == Status.FAIL, check.summary
    assert check.where == wrong
    assert f"w.r.t. {wrong}" in check.summary


def test_needs_input_grad_index_names_the_function_returning_none():
    torch.manual_seed(0)
    m, x = L.FrozenProj(), _x(4, 6)
    leaf = x.clone().requires_grad_()
    assert torch.autograd.grad(m(leaf).sum(), leaf, allow_unused=True)[0] is None  # the truth: no gradient
    assert not torch_gradcheck(m, x)
    check = by_name(layerlab.verify(m, x))["gradcheck"]
    assert check.status == Status.FAIL and check.where == "x"
    assert "no gradient at all" in check.summary and "_MatmulFn" in check.summary
    assert "needs_input_grad" in check.hint


def test_inplace_edit_of_saved_tensor_keeps_the_forward_right_and_fails_gradcheck():
    x = _x(4, 6).double()
    assert torch.allclose(L.TanhHalf()(x), torch.tanh(x))  # the forward is right; only the backward lies
    report = layerlab.verify(L.TanhHalf(), _x(4, 6))
    assert failures(report) == ["gradcheck"]


# -- forward parity against torch.nn (auto-reference) or a named reference -------------------------------

def test_gru_cell_reset_gate_outside_bias_is_named():
    torch.manual_seed(0)
    m, x, h = L.GRUCell(), _x(3, 5), _x(3, 4, seed=1)
    ours, ref = torch_copy(m, nn.GRUCell(5, 4))
    assert not torch.allclose(ours(x.double(), h.double()), ref(x.double(), h.double()))
    check = by_name(layerlab.verify(m, x, h))["forward_parity"]
    assert check.status == Status.FAIL
    assert "b_hn added outside" in check.summary and "r ⊙ (W_hn h + b_hn)" in check.hint


def test_group_norm_with_interleaved_channels_is_named():
    torch.manual_seed(0)
    m, x = L.GroupNorm(), _x(3, 6, 5)
    ours, ref = torch_copy(m, nn.GroupNorm(2, 6))
    assert not torch.allclose(ours(x.double()), ref(x.double()))
    report = layerlab.verify(m, x)
    check = by_name(report)["forward_parity"]
    assert check.status == Status.FAIL and "channels interleaved" in check.summary
    assert "x.view(B, 2, 3" in check.hint


def test_conv_with_flipped_kernel_fails_instead_of_warning():
    torch.manual_seed(0)
    m, x = L.Conv2d(), _x(2, 2, 5, 5)
    ours, ref = torch_copy(m, nn.Conv2d(2, 3, 3, padding=1))
    assert not torch.allclose(ours(x.double()), ref(x.double()))
    with torch.no_grad():
        ref.weight.copy_(ref.weight.flip(-1, -2))
    assert torch.allclose(ours(x.double()), ref(x.double()))  # the truth: a true convolution
    checks = by_name(layerlab.verify(m, x))
    for name in ("forward_parity", "backward_parity"):
        assert checks[name].status == Status.FAIL, checks[name].summary
        assert "kernel is flipped" in checks[name].summary and checks[name].where.startswith("weight")


def test_gelu_tanh_approximation_against_exact_reference_is_named():
    x = _x(4, 6)
    diff = (L.GELU()(x.double()) - nn.GELU()(x.double())).abs().max()
    assert 1e-5 < diff < 1e-3  # the truth: small but real
    checks = by_name(layerlab.verify(L.GELU(), x, reference=nn.GELU()))
    assert checks["forward_parity"].status == Status.FAIL
    assert "approximate='tanh'" in checks["forward_parity"].summary
    # the input gradient differs because the forward does, not because of a custom backward
    assert checks["backward_parity"].status == Status.FAIL
    assert "custom backward" not in checks["backward_parity"].hint


def test_rope_with_flipped_rotation_fails_forward_parity():
    x = _x(2, 5, 8)
    assert not torch.allclose(L.Rope()(x), L.rope_reference(x))
    check = by_name(layerlab.verify(L.Rope(), x, reference=L.rope_reference))["forward_parity"]
    assert check.status == Status.FAIL


# -- causality, batch, randomness -----------------------------------------------------------------------

def test_causal_attention_leaking_one_step_fails_causality():
    torch.manual_seed(0)
    m, x = L.LeakyCausalAttention().double(), _x(2, 6, 8).double()
    moved = x.clone()
    moved[:, 3] += 1
    changed = (m(x) - m(moved)).abs().amax((0, 2)) > 0
    assert changed[2] and not changed[1]  # the truth: position 2 sees 3, position 1 does not
    check = by_name(layerlab.verify(L.LeakyCausalAttention(), _x(2, 6, 8), tags=["causal"]))["causality"]
    assert check.status == Status.FAIL and "diagonal=2" in check.hint


def test_batch_statistics_in_eval_fail_batch_independence():
    torch.manual_seed(0)
    m, x = L.FeatureNorm().eval(), _x(4, 6)
    assert not torch.allclose(m(x[:2])[0], m(x)[0])
    check = by_name(layerlab.verify(m, x))["batch_independence"]
    assert check.status == Status.FAIL and "batch dimension" in check.hint


def test_noise_in_eval_is_named_as_randomness():
    torch.manual_seed(0)
    m, x = L.NoisyProj().eval(), _x(4, 6)
    assert not torch.equal(m(x), m(x))
    report = layerlab.verify(m, x)
    assert any("not repeatable" in c.summary for c in report.checks if c.status == Status.FAIL)


# -- correct layers: no failure ------------------------------------------------------------------------

def test_relu_abs_fed_exact_zeros_is_not_a_wrong_gradient():
    x = _x(4, 6)
    x[:, ::2] = 0.0
    assert not torch_gradcheck(L.KinkLayer(), x)  # torch's own gradcheck trips on the kink …
    away = x.clone()
    away[away == 0] = 0.3
    assert torch_gradcheck(L.KinkLayer(), away)   # … and passes off it: the layer is correct
    report = layerlab.verify(L.KinkLayer(), x)
    assert failures(report) == []
    check = by_name(report)["gradcheck"]
    assert check.status == Status.PASS and "12 exact zero(s)" in check.summary


def test_a_real_bug_is_still_caught_on_inputs_with_exact_zeros():
    x = _x(4, 6)
    x[:, ::2] = 0.0
    assert not torch_gradcheck(L.FusedSwish(), x.masked_fill(x == 0, 0.3))
    assert by_name(layerlab.verify(L.FusedSwish(), x))["gradcheck"].status == Status.FAIL


@pytest.mark.parametrize("build, inputs", [
    (L.conv_odd, lambda: (_x(2, 4, 5, 4),)),
    (L.mha_kdim, lambda: (_x(2, 4, 8), _x(2, 5, 5, seed=1), _x(2, 5, 3, seed=2))),
    (L.PermutedLinear, lambda: (_x(4, 6),)),
    (L.SafeLog, lambda: (_x(4, 6),)),
    (L.lstm_proj, lambda: (_x(7, 3, 5),)),
])
def test_correct_layers_get_no_failure(build, inputs):
    torch.manual_seed(0)
    m, xs = build(), inputs()
    assert torch_gradcheck(m, *xs)
    assert failures(layerlab.verify(m, *xs)) == []


def test_hand_written_rmsnorm_in_bf16_matches_torch_and_passes():
    torch.manual_seed(0)
    m = L.RMSNorm()
    x = _x(2, 3, 16) * 300
    ref = nn.RMSNorm(16, eps=1e-6).double()
    assert torch.allclose(m.double()(x.double()), ref(x.double()), rtol=1e-6)  # float32 inside: 1e-6
    report = layerlab.verify(L.RMSNorm().to(torch.bfloat16), x.to(torch.bfloat16))
    assert failures(report) == []
    assert by_name(report)["forward_parity"].status == Status.PASS


def test_llama_attention_from_a_tiny_config_gets_no_failure():
    pytest.importorskip("transformers", reason="Hugging Face transformers is an optional extra")
    torch.manual_seed(0)
    attn, rotary = L.llama_attention()
    h = _x(2, 5, 16)
    cos, sin = rotary(h, torch.arange(5)[None].expand(2, 5))
    out, _ = attn(h, (cos, sin), attention_mask=None)
    assert out.shape == (2, 5, 16) and torch.isfinite(out).all()
    report = layerlab.verify(attn, h, (cos, sin), attention_mask=None)
    assert failures(report) == []
