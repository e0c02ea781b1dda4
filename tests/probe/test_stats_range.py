"""Statistics and norms of tensors at the ends of their dtype's range (1e-30, float32 subnormals at
1e-42, 1e30, sums past float32's max), in float32, float16 and bfloat16, against numpy's float64
truth of the very same values: a sum of squares in the tensor's accumulator under- or overflows
there, so a non-zero tensor got a norm of exactly 0 and a finite one ``std = inf``."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from layerlab.probe import safe_norm
from layerlab.probe.stats import finish_stats, grad_norm, l2_norm, l2_norms, l2_norms_of, finish_norms, tensor_stats

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SCALES = [1e-30, 1e-42, 1e30]


def _values(scale, dtype, n=4096, positive=False):
    torch.manual_seed(0)
    x = torch.randn(n, dtype=torch.float64)
    x = x.abs() if positive else x
    return (x * scale).to(dtype)


def _truth(x):
    xd = x.double().numpy()
    finite = xd[np.isfinite(xd)]
    return {"mean": float(finite.mean()) if finite.size else math.nan,
            "std": float(finite.std()) if finite.size else math.nan,
            "min": float(finite.min()) if finite.size else math.nan,
            "max": float(finite.max()) if finite.size else math.nan,
            "zeros": float((xd == 0).sum()) / xd.size,
            "nan": int(np.isnan(xd).sum()), "inf": int(np.isinf(xd).sum()),
            "norm": float(np.linalg.norm(xd))}


def _assert_stats(x, may_read):
    s = finish_stats([tensor_stats(x, may_read=may_read)])[0]
    t = _truth(x)
    assert (s.nan, s.inf) == (t["nan"], t["inf"])
    assert s.zeros == t["zeros"]  # exactly: == 0, counted
    if math.isnan(t["mean"]):
        assert math.isnan(s.mean)
        return
    assert (s.min, s.max) == (t["min"], t["max"])
    assert math.isfinite(s.std) and math.isfinite(s.mean)
    assert s.std == pytest.approx(t["std"], rel=1e-4, abs=0.0)
    assert s.mean == pytest.approx(t["mean"], rel=1e-4, abs=1e-4 * t["std"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("may_read", [True, False], ids=["cpu-read", "deferred"])
def test_stats_at_range_ends_match_float64(dtype, scale, may_read):
    _assert_stats(_values(scale, dtype), may_read)


@pytest.mark.parametrize("may_read", [True, False], ids=["cpu-read", "deferred"])
def test_float32_sum_past_max_is_finite(may_read):
    """4096 values near 1e38: their float32 sum overflows, the mean does not."""
    x = _values(1e38, torch.float32, positive=True).clamp(max=3e38)
    s = finish_stats([tensor_stats(x, may_read=may_read)])[0]
    t = _truth(x)
    assert s.mean == pytest.approx(t["mean"], rel=1e-6)
    assert s.std == pytest.approx(t["std"], rel=1e-4)
    assert s.inf == 0


def test_finite_part_of_a_tensor_with_inf_keeps_large_sums_finite():
    x = _values(1e38, torch.float32, positive=True).clamp(max=3e38)
    x[0] = math.inf
    s = finish_stats([tensor_stats(x)])[0]
    finite = x[1:].double()
    assert s.inf == 1
    assert s.mean == pytest.approx(finite.mean().item(), rel=1e-6)
    assert s.std == pytest.approx(finite.std(unbiased=False).item(), rel=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("n", [256, 1 << 17], ids=["fused", "dot"])
def test_norms_at_range_ends_match_float64(dtype, scale, n):
    x = _values(scale, dtype, n=n)
    truth = _truth(x)["norm"]
    got = [grad_norm(x).item(), l2_norm(x).item(), *finish_norms(l2_norms([x, x])),
           *finish_norms(l2_norms_of([x], [x])[0] + l2_norms_of([x], [x])[1]),
           safe_norm.host_norm(x), *safe_norm.host_norms([x, x]), safe_norm.deferred_norm(x).item()]
    for value in got:
        assert value == pytest.approx(truth, rel=1e-5), got


def test_one_subnormal_is_not_zero():
    """float32's smallest subnormal (1.4e-45) among zeros: one non-zero element, a non-zero norm."""
    x = torch.zeros(5000)
    x[17] = torch.finfo(torch.float32).smallest_normal * 2 ** -23
    assert x[17].item() > 0
    s = finish_stats([tensor_stats(x)])[0]
    assert s.zeros == 4999 / 5000
    assert s.max == x[17].item()
    for value in (grad_norm(x).item(), safe_norm.host_norm(x), *finish_norms(l2_norms([x]))):
        assert value == x[17].item()
    assert grad_norm(torch.zeros(5000)).item() == 0.0
    assert safe_norm.host_norms([torch.zeros(7), torch.tensor([math.nan]), torch.tensor([math.inf, 1.0])])[:2] \
        == [0.0, pytest.approx(math.nan, nan_ok=True)]
    assert safe_norm.host_norm(torch.tensor([math.inf, 1.0])) == math.inf


def test_float64_range_ends():
    """float64 squares under/overflow too, from 1e-154 and 1e154."""
    for scale in (1e-200, 1e200):
        x = _values(scale, torch.float64)
        truth = float(np.linalg.norm(x.numpy() / scale)) * scale
        assert grad_norm(x).item() == pytest.approx(truth, rel=1e-9)
        assert finish_stats([tensor_stats(x)])[0].std == pytest.approx(float(np.std(x.numpy() / scale)) * scale,
                                                                       rel=1e-6)


def _tiny_second_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    with torch.no_grad():
        model[1].weight.mul_(1e-24)
    return model, torch.randn(4, 16)


def test_inspect_reports_a_tiny_gradient_as_tiny_not_zero():
    """The second Linear's weight × 1e-24: every element of the first one's gradient is about 1e-25,
    none is 0 — no zero-grad / zero-grad-root; its norm is the float64 norm of the real gradient."""
    import layerlab

    model, x = _tiny_second_layer()
    report = layerlab.inspect(model, x)
    out = model(x)
    torch.autograd.backward(out, torch.ones_like(out))  # any output gradient: only non-zero matters
    assert bool((model[0].weight.grad != 0).all())
    codes = {p.code for p in report.problems}
    assert not codes & {"zero-grad", "zero-grad-root"}, report.problems
    first = {p.name: p for p in report.params}["0.weight"]
    assert "zero-grad" not in first.flags
    assert 1e-27 < first.grad_norm < 1e-21
    assert {p.name: p for p in report.params}["1.weight"].norm == \
        pytest.approx(float(model[1].weight.detach().double().norm()), rel=1e-5)
    assert "vanishing" in codes  # what it really is
