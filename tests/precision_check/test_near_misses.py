"""Near-miss review of precision-check's cause rules: models that look, to a rule, like its case
but whose loss of precision has another cause (or that are healthy). Each test first measures the
truth with plain torch (the same forward under autocast, with the suspect op moved to float32),
then checks that precision-check names no wrong cause. Models: near_miss_models.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerlab
from layerlab.mixed.dtypes import autocast_supported
from tests.precision_check import near_miss_models as nm

HAS_FP16 = autocast_supported("cpu", "float16") is None
DTYPES = ["bfloat16", "float16"] if HAS_FP16 else ["bfloat16"]
FP16 = pytest.mark.skipif(not HAS_FP16, reason="no float16 autocast on this CPU")


def _eps(dtype):
    return torch.finfo(getattr(torch, dtype)).eps


def _err(model, x, dtype, **kw):
    """Relative output error of ``model(*x, **kw)`` under autocast ``dtype`` against float32, in eps."""
    with torch.no_grad():
        ref = model(*x, **kw).float()
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            out = model(*x, **kw).float()
    return float((out - ref).norm() / ref.norm()) / _eps(dtype)


def _findings(model, x, dtype):
    report = layerlab.precision_check(model, *x, autocast=[dtype])
    return [f for f in report.findings if f.severity in ("error", "warning")]


def _first(model, x, dtype):
    found = [f for f in _findings(model, x, dtype) if f.severity == "error"]
    assert found, f"no error finding in {dtype}"
    return found[0]


def _x(seed=3):
    return (torch.randn(4, 16, generator=nm.gen(seed)),)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_of_small_logits_made_by_a_cancelling_matmul_is_not_blamed_on_exp(dtype):
    torch.manual_seed(0)
    model, x = nm.CancellingLogits(), nm.cancelling_logits_input()
    assert _err(model, x, dtype) > 8                               # it loses precision
    assert _err(model, x, dtype, fp32_softmax=True) > 8            # softmax in float32: still lost
    assert _err(model, x, dtype, fp32_matmul=True) < 1             # matmul in float32: gone
    first = _first(model, x, dtype)
    assert "exponentials" not in first.cause and "softmax" not in first.fix, first


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_exact_cancellation_is_not_blamed(dtype):
    torch.manual_seed(0)
    model, x = nm.StraightThroughThenVariance(), _x()
    assert _err(model, x, dtype) > 64 and _err(model, x, dtype, fp32_var=True) < 16
    first = _first(model, x, dtype)
    assert "h.detach()" not in first.cause and "cancels (E[x²] − E[x]²)" in first.cause, first


@FP16
def test_an_eps_that_guards_no_division_is_not_blamed():
    torch.manual_seed(0)
    model, x = nm.EpsThenVariance(), _x()
    assert torch.tensor(1e-12, dtype=torch.float16).item() == 0.0  # the eps really is 0 in float16
    assert _err(model, x, "float16") > 64 and _err(model, x, "float16", fp32_var=True) < 16
    first = _first(model, x, "float16")
    assert "its eps" not in first.cause and "cancels (E[x²] − E[x]²)" in first.cause, first


@FP16
def test_an_eps_of_1e_6_is_a_float16_subnormal_not_zero():
    torch.manual_seed(0)
    model, x = nm.SubnormalEpsNorm(), nm.zero_row_input()
    assert torch.tensor(1e-6, dtype=torch.float16).item() > 0.0
    assert _err(model, x, "float16") < 2
    assert _findings(model, x, "float16") == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_of_a_probability_that_never_underflows_is_not_called_underflow(dtype):
    torch.manual_seed(0)
    model, x = nm.LogNearOne(), _x()
    with torch.no_grad():
        p = torch.sigmoid(model.lin(x[0]))
    assert float(p.min()) > 0.9                                     # nowhere near the smallest normal
    assert _err(model, x, dtype) > 16 and _err(model, x, dtype, fp32_sigmoid=True) < 4
    first = _first(model, x, dtype)
    assert "underflows in" not in first.cause and "nothing underflows" in first.cause, first
    assert "F.logsigmoid" in first.fix


@FP16
def test_an_overflow_that_is_clamped_is_harmless():
    torch.manual_seed(0)
    model, x = nm.ClampedOverflow(), _x()
    with torch.no_grad():
        assert float((model.lin(x[0]) * 1000).abs().max()) > 65504  # it does pass float16's range
    assert _err(model, x, "float16") == 0
    assert _findings(model, x, "float16") == []


@FP16
def test_a_clamped_overflow_is_not_blamed_for_a_variance():
    torch.manual_seed(0)
    model, x = nm.ClampedOverflowThenVariance(), _x()
    assert _err(model, x, "float16") > 16 and _err(model, x, "float16", fp32_var=True) < 1
    first = _first(model, x, "float16")
    assert "65504" not in first.cause and "cancels (E[x²] − E[x]²)" in first.cause, first


@pytest.mark.parametrize("dtype", DTYPES)
def test_healthy_near_misses_have_no_error(dtype):
    """A large add before a max, a norm of a zero-mean input: forward errors under 1 eps, no error.
    (LargeAddThenMax keeps a gradient warning: its +300 rounds values into ties, the max's gradient
    really goes elsewhere.)"""
    torch.manual_seed(0)
    for model in (nm.LargeAddThenMax(), nm.ZeroMeanNorm()):
        x = _x()
        assert _err(model, x, dtype) < 1
        assert not [f for f in _findings(model, x, dtype) if f.severity == "error"], type(model).__name__


def test_large_encoder_layer_has_no_finding():
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(512, 8, 1024, dropout=0.0, batch_first=True).eval()
    x = torch.randn(1, 8, 512, generator=nm.gen(4))
    report = layerlab.precision_check(model, x, autocast=DTYPES)
    assert [f for f in report.findings if f.severity in ("error", "warning")] == []


def test_tiny_qwen2_has_no_finding():
    transformers = pytest.importorskip("transformers", reason="the Hugging Face model needs transformers")
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.Qwen2Model(cfg).eval()
    ids = torch.randint(0, 64, (1, 8), generator=nm.gen(0))
    report = layerlab.precision_check(model, ids, autocast=DTYPES)
    assert [f for f in report.findings if f.severity in ("error", "warning")] == []
