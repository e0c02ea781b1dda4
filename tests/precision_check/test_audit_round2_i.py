"""Round-2 audit of precision-check (helper I): ten planted low-precision bugs and six healthy models.

Graded before the rules were read. Each bug is first shown real with plain torch (float32 against
``torch.autocast("cpu", dtype)``, same weights and inputs), then precision-check must flag it, name
the module and the cause; the healthy models must pass. The miss fixed this round: a hand-written
variance ``E[x²] − E[x]²`` at a mean of 50 was blamed on the ``+ 50`` before it ("rounds away the
spread", fix "remove the offset"), though the rounded input explains 12 % of the error and the
cancellation 15 000 % — the norm keeps the blame when its output error is more than GAIN× its
centred input error (layerlab/mixed/offsets.py).
Letters: B batch · L length · E features.
"""

from __future__ import annotations

import pytest
import torch

import layerlab
from layerlab.mixed.dtypes import autocast_supported
from tests.precision_check.planted_round2_i import (
    AmplifyNet, CancellingVariance, ConvNeXtBlock, CumsumNet, L2Net, LNMLP, LogSigNet, LSTMNet,
    NaiveSoftmaxHead, RMSNet, SmallCNN, StdNet, TinyGradNet, UnscaledAttention, VarianceNet,
)

FP16 = pytest.mark.skipif(autocast_supported("cpu", "float16") is not None, reason="no float16 autocast on this CPU")
EPS = {"bfloat16": torch.finfo(torch.bfloat16).eps, "float16": torch.finfo(torch.float16).eps}


def _build(cls, *args):
    torch.manual_seed(0)
    return cls(*args)


def _randn(*shape, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * scale


def _outputs(model, x, dtype):
    """float32 output and the output under CPU autocast ``dtype`` (plain torch, no layerlab)."""
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            half = model(x).float()
    return ref, half


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _first(model, x, dtype):
    report = layerlab.precision_check(model, x, autocast=[dtype])
    (run,) = report.runs
    assert not run.ok, f"not flagged: {[f.message for f in run.findings]}"
    return run.first


# ---------------------------------------------------------------------------- the fixed miss
@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=FP16)])
def test_variance_cancellation_is_the_norms_own_not_the_offset_before_it(dtype):
    model, x = _build(VarianceNet), _randn(4, 8, 128)
    low = getattr(torch, dtype)
    with torch.no_grad():
        made = model.fc(x) + 50.0                                    # (B, L, E), float32
        rounded = (model.fc(x).to(low) + 50.0).to(low)               # as the half run makes it
        ref = CancellingVariance()(made)
        own = _rel(CancellingVariance()(rounded.float()), ref)       # the rounded input, norm in float32
        half = _rel(CancellingVariance()(rounded), ref)              # the norm in the half dtype
    assert own < 0.2 and half > 50, (own, half)                      # the norm makes > 250× the error
    first = _first(model, x, dtype)
    assert first.where == "norm", first.message
    assert "cancels" in first.cause and "E[x²] − E[x]²" in first.cause, first.cause
    assert "float32" in first.fix


# ---------------------------------------------------------------------------- float16 overflow / underflow
@FP16
def test_naive_softmax_overflows_float16_in_exp():
    model, x = _build(NaiveSoftmaxHead), _randn(8, 64, scale=2.0)
    ref, half = _outputs(model, x, "float16")
    assert torch.isfinite(ref).all() and not torch.isfinite(half).all()
    first = _first(model, x, "float16")
    assert first.where == "act" and first.cause.startswith("exp") and "65504" in first.cause, first.cause
    assert "subtract the max" in first.fix
    assert layerlab.precision_check(model, x, autocast=["bfloat16"]).ok       # bfloat16 has the range


@FP16
def test_hand_l2_norm_sum_of_squares_overflows_float16():
    model, x = _build(L2Net), _randn(8, 256)
    ref, half = _outputs(model, x, "float16")
    assert _rel(half, ref) > 0.5                                      # x / inf = 0: the output is lost
    first = _first(model, x, "float16")
    assert first.where == "norm" and first.cause.startswith("sum") and "65504" in first.cause, first.cause


@FP16
def test_log_of_sigmoid_underflows_float16():
    model, x = _build(LogSigNet), _randn(16, 32)
    ref, half = _outputs(model, x, "float16")
    assert torch.isfinite(ref).all() and torch.isinf(half).any()
    first = _first(model, x, "float16")
    assert first.where == "loss" and "sigmoid" in first.cause, first.cause
    assert "F.logsigmoid" in first.fix


@FP16
def test_times_1000_overflows_float16_and_is_forecast_from_bfloat16():
    model, x = _build(AmplifyNet), _randn(8, 64)
    ref, half = _outputs(model, x, "float16")
    assert ref.abs().max() < 65504 and not torch.isfinite(half).all()
    first = _first(model, x, "float16")
    assert first.where == "amp" and first.cause.startswith("mul") and "65504" in first.cause, first.cause
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    assert report.ok and [f.where for f in report.forecast if f.kind == "fp16-overflow"] == ["amp"]


@FP16
def test_gradient_reversal_with_tiny_lambda_underflows_without_a_grad_scaler():
    x = _randn(64, 64)
    grads = {}
    for dtype in ("float32", "float16"):
        m = _build(TinyGradNet)
        with torch.autocast("cpu", dtype=torch.float16, enabled=dtype == "float16"):
            m(x).float().mul(_randn(64, 64) / 64).sum().backward()   # a unit-norm projection loss
        grads[dtype] = m.fc.weight.grad
    assert _rel(grads["float16"], grads["float32"]) > 0.5            # the 1e-6 × g is mostly below 2⁻²⁴
    first = _first(_build(TinyGradNet), x, "float16")
    assert first.where == "fc.weight" and "flushes" in first.cause and "GradScaler" in first.fix
    scaled = layerlab.precision_check(_build(TinyGradNet), x, autocast=["float16"], grad_scaler=True)
    assert scaled.ok, [f.message for f in scaled.runs[0].findings]


@FP16
def test_rmsnorm_with_eps_1e_12_gives_nan_on_padded_rows_in_float16():
    x = _randn(4, 10, 64)
    x[:, -3:] = 0.0                                                   # padded positions
    model = _build(RMSNet)
    ref, half = _outputs(model, x, "float16")
    assert torch.isfinite(ref).all() and torch.isnan(half).any()
    first = _first(model, x, "float16")
    # the rsqrt of a padded row overflows, and the eps that should guard it is 0 in float16: both are said
    assert torch.tensor(1e-12, dtype=torch.float16).item() == 0.0
    assert first.where == "norm" and "rsqrt" in first.cause and "eps 1e-12 is 0 in float16" in first.cause, \
        first.cause
    assert layerlab.precision_check(model, x, autocast=["bfloat16"]).ok


# ---------------------------------------------------------------------------- lost spread, saturated softmax
def test_std_of_a_collapsed_spread_is_blamed_on_the_add_that_collapsed_it():
    model, x = _build(StdNet), _randn(8, 64)
    ref, half = _outputs(model, x, "bfloat16")
    assert _rel(half, ref) > 0.5
    first = _first(model, x, "bfloat16")
    assert first.where == "(root)" and first.cause.startswith("add") and "300" in first.cause, first.cause


def test_unscaled_attention_gradient_is_rounding_in_bfloat16_and_is_warned():
    model, x = _build(UnscaledAttention), _randn(2, 16, 512, scale=8.0)
    ref, half = _outputs(model, x, "bfloat16")
    assert _rel(half, ref) < 8 * EPS["bfloat16"]                     # the forward survives (saturated softmax)
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    grads = {p.name: p.error for p in report.runs[0].params}
    assert grads["q.weight"] > 0.5 and grads["k.weight"] > 0.5 and grads["k.bias"] is None  # k.bias: 0 exactly
    warned = [f for f in report.runs[0].findings if f.kind == "gradient" and f.severity == "warning"]
    assert warned and warned[0].where in ("q.weight", "q.bias", "k.weight"), report.runs[0].findings


@FP16
def test_unscaled_attention_gradients_underflow_in_float16():
    model, x = _build(UnscaledAttention), _randn(2, 16, 512, scale=8.0)
    grads = {}
    for dtype in ("float32", "float16"):
        m = _build(UnscaledAttention)
        with torch.autocast("cpu", dtype=torch.float16, enabled=dtype == "float16"):
            out = m(x).float()
        out.mul(_randn(*out.shape) / out.numel() ** 0.5).sum().backward()
        grads[dtype] = m.q.weight.grad
    assert grads["float32"].abs().max() > 0 and _rel(grads["float16"], grads["float32"]) > 0.9
    first = _first(model, x, "float16")             # the saturated softmax leaves q, k gradients below 2⁻²⁴
    assert first.where == "q.weight" and "flushes" in first.cause and "GradScaler" in first.fix, first.message


# ---------------------------------------------------------------------------- healthy
def test_long_cumsum_is_accurate_in_bfloat16_on_cpu():
    model, x = _build(CumsumNet), _randn(2, 4096, 16) + 1.0
    ref, half = _outputs(model.acc, model.fc(x).detach(), "bfloat16")
    assert _rel(half, ref) < EPS["bfloat16"]
    assert layerlab.precision_check(model, x, autocast=["bfloat16"]).ok


def _gpt2():
    pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    from tests.precision_check.planted_round2_i import HFGPT2
    return _build(HFGPT2), torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["transformer", "cnn_bn", "lstm", "gpt2", "mlp_ln", "convnext"])
def test_healthy_models_pass(name):
    if name == "gpt2":
        model, x = _gpt2()
    else:
        model, x = {
            "transformer": lambda: (_build(torch.nn.TransformerEncoderLayer, 64, 4, 128, 0.0, "relu", 1e-5, True),
                                    _randn(2, 12, 64)),
            "cnn_bn": lambda: (_build(SmallCNN), _randn(4, 3, 16, 16)),
            "lstm": lambda: (_build(LSTMNet), _randn(4, 12, 16)),
            "mlp_ln": lambda: (_build(LNMLP), _randn(8, 64)),
            "convnext": lambda: (_build(ConvNeXtBlock), _randn(2, 32, 16, 16)),
        }[name]()
    dtypes = ["bfloat16"] + (["float16"] if autocast_supported("cpu", "float16") is None and name != "lstm" else [])
    report = layerlab.precision_check(model, x, autocast=dtypes)
    for run in report.runs:
        assert run.ok and not [f for f in run.findings if f.severity == "warning"], \
            (run.label, [f.message for f in run.findings])


@FP16
def test_an_eps_that_is_0_in_float16_is_added_to_the_cause_not_put_in_its_place():
    """StdNet in float16: the spread is lost to rounding at the offset (the subtraction is the cause), and
    the std's eps 1e-8 is 0 there too. Both are said, the subtraction first."""
    model, x = _build(StdNet), _randn(8, 64)
    ref, half = _outputs(model, x, "float16")
    assert torch.isfinite(ref).all() and not torch.isfinite(half).all()
    assert torch.tensor(1e-8, dtype=torch.float16).item() == 0.0
    first = _first(model, x, "float16")
    assert first.where == "norm" and first.cause.startswith("sub"), first.cause
    assert "also, add runs in float16" in first.cause and "eps 1e-08 is 0 in float16" in first.cause
