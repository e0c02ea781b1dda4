"""layerlab.layers.adaptive against torch.nn.AdaptiveAvgPool/AdaptiveMaxPool 1d/2d, and the soft pool's limits."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.adaptive import (
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, SoftAdaptivePool2d, adaptive_bins,
)
from tests.layers._spatial_checks import (
    F64, assert_compiles, assert_gradcheck, assert_parity, assert_shape_op, assert_traces, randn,
)

PAIRS = {
    ("avg", 1): (AdaptiveAvgPool1d, nn.AdaptiveAvgPool1d), ("avg", 2): (AdaptiveAvgPool2d, nn.AdaptiveAvgPool2d),
    ("max", 1): (AdaptiveMaxPool1d, nn.AdaptiveMaxPool1d), ("max", 2): (AdaptiveMaxPool2d, nn.AdaptiveMaxPool2d),
}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["avg", "max"]), nd=st.sampled_from([1, 2]), data=st.data())
def test_parity_with_torch(kind, nd, data):
    sizes = data.draw(st.tuples(*[st.integers(1, 11)] * nd))
    outs = data.draw(st.tuples(*[st.one_of(st.integers(1, 8), st.none()) if nd == 2 else st.integers(1, 8)] * nd))
    args = {"output_size": outs if nd == 2 else outs[0]}
    if kind == "max":
        args["return_indices"] = data.draw(st.booleans())
    ours_cls, torch_cls = PAIRS[kind, nd]
    ref = torch_cls(**args)
    batch = (2,) if data.draw(st.booleans()) else ()
    assert_parity(ours_cls.from_torch(ref), ref, randn(*batch, 3, *sizes))


@pytest.mark.parametrize("size, out", [(10, 4), (5, 3), (3, 7), (12, 3), (1, 1), (7, 7)])
def test_bins_are_the_ones_torch_reads(size, out):
    # max over an increasing ramp reads each bin's last element, over a decreasing one its first
    ramp = torch.arange(float(size)).reshape(1, 1, size)
    ends = nn.AdaptiveMaxPool1d(out)(ramp).flatten().long().tolist()
    starts = (-nn.AdaptiveMaxPool1d(out)(-ramp)).flatten().long().tolist()
    assert adaptive_bins(size, out) == [(s, e + 1) for s, e in zip(starts, ends)]


def test_bins_examples():
    assert adaptive_bins(10, 4) == [(0, 3), (2, 5), (5, 8), (7, 10)]
    assert adaptive_bins(3, 7) == [(0, 1), (0, 1), (0, 2), (1, 2), (1, 3), (2, 3), (2, 3)]  # O > L: repeats


def test_max_ties_send_the_gradient_to_the_first_maximum_like_torch():
    ref = nn.AdaptiveMaxPool2d((3, 4), return_indices=True)
    assert_parity(AdaptiveMaxPool2d.from_torch(ref), ref, torch.zeros(2, 2, 5, 7, dtype=F64))


def distinct(*shape, seed=0):
    """Values 0.1 apart, shuffled: no near-ties, so τ → 0 has a single winner per bin."""
    g = torch.Generator().manual_seed(seed)
    n = torch.Size(shape).numel()
    return (torch.randperm(n, generator=g).to(F64) / 10).reshape(shape)


@pytest.mark.parametrize("output_size, size", [((4, 3), (10, 7)), (5, (5, 9)), ((7, None), (3, 4))])
def test_soft_pool_tends_to_max_as_temperature_goes_to_zero(output_size, size):
    soft = SoftAdaptivePool2d(output_size, temperature=1e-4, dtype=F64)
    x = distinct(2, 3, *size)
    ref = nn.AdaptiveMaxPool2d(output_size)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = soft(x1), ref(x2)
    torch.testing.assert_close(y1, y2)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad)  # all the gradient goes to each bin's maximum


@pytest.mark.parametrize("output_size, size", [((4, 3), (10, 7)), (5, (5, 9)), ((7, None), (3, 4))])
def test_soft_pool_tends_to_avg_as_temperature_grows(output_size, size):
    soft = SoftAdaptivePool2d(output_size, temperature=1e9, dtype=F64)
    x = randn(2, 3, *size)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = soft(x1), nn.AdaptiveAvgPool2d(output_size)(x2)
    # softmax(x/τ) = 1/n + O(x/τ): the error shrinks like 1/τ
    torch.testing.assert_close(y1, y2, rtol=0, atol=1e-7)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=0, atol=1e-7)


def test_soft_pool_in_between_lies_between_avg_and_max_and_learns_its_temperature():
    soft = SoftAdaptivePool2d(3, temperature=0.5, dtype=F64)
    x = randn(2, 2, 9, 9)
    y = soft(x)
    assert (y <= nn.AdaptiveMaxPool2d(3)(x) + 1e-12).all() and (y >= nn.AdaptiveAvgPool2d(3)(x) - 1e-12).all()
    y.sum().backward()
    assert soft.log_temperature.grad is not None and soft.log_temperature.grad.abs() > 0
    assert torch.isclose(soft.temperature, torch.tensor(0.5, dtype=F64))
    frozen = SoftAdaptivePool2d(3, learnable=False)
    assert list(frozen.parameters()) == [] and "log_temperature" in dict(frozen.named_buffers())


@pytest.mark.parametrize("make, shape", [
    (lambda: AdaptiveAvgPool1d(4), (2, 3, 10)),
    (lambda: AdaptiveAvgPool2d((3, None)), (2, 2, 7, 5)),
    (lambda: AdaptiveMaxPool1d(4), (2, 3, 10)),
    (lambda: AdaptiveMaxPool2d((3, 4)), (2, 2, 7, 5)),
    (lambda: SoftAdaptivePool2d((3, 2), temperature=0.7, dtype=F64), (2, 2, 7, 5)),
])
def test_gradcheck_trace_and_compile(make, shape):
    layer = make()
    x = randn(*shape)
    assert_gradcheck(layer, x)  # the soft pool's log_temperature is checked as a parameter
    assert_traces(layer, x)
    assert_compiles(layer, x)


def test_compile_with_return_indices():
    assert_compiles(AdaptiveMaxPool2d(3, return_indices=True), randn(1, 2, 7, 8))


@pytest.mark.parametrize("layer, op", [
    (AdaptiveAvgPool1d(4), "adaptive_avg_pool1d"), (AdaptiveAvgPool2d((3, None)), "adaptive_avg_pool2d"),
    (AdaptiveMaxPool1d(4), "adaptive_max_pool1d"), (AdaptiveMaxPool2d(5, return_indices=True), "adaptive_max_pool2d"),
])
def test_round_trip_and_shape_op(layer, op):
    ref = layer.to_torch()
    assert type(layer).from_torch(ref)._config() == layer._config()
    x = randn(2, 3, *([9] * layer._nd))
    assert_parity(layer, ref, x)
    assert_shape_op(layer, x, type(ref), op)


def test_soft_pool_shape_op_is_adaptive_avg():
    layer = SoftAdaptivePool2d((4, 3), dtype=F64)
    assert_shape_op(layer, randn(1, 2, 9, 9), nn.AdaptiveAvgPool2d, "adaptive_avg_pool2d")


@pytest.mark.parametrize("make, message", [
    (lambda: AdaptiveAvgPool2d((3, 3, 3)),
     r"AdaptiveAvgPool2d: output_size: expected an int ≥ 1 or None \(keep the input size\), or a tuple of 2"),
    (lambda: AdaptiveMaxPool1d(None), r"AdaptiveMaxPool1d: output_size: expected an int ≥ 1, or a tuple of 1"),
    (lambda: AdaptiveAvgPool1d(0), r"AdaptiveAvgPool1d: output_size: expected an int ≥ 1.*, got 0"),
    (lambda: SoftAdaptivePool2d(3, temperature=0.0), r"SoftAdaptivePool2d: temperature: expected a finite float > 0"),
    (lambda: SoftAdaptivePool2d(3).limit_module("min"), r"SoftAdaptivePool2d: limit: expected 'max' or 'avg'"),
])
def test_construction_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("layer, x, message", [
    (AdaptiveAvgPool2d(3), torch.randn(5, 5), r"AdaptiveAvgPool2d: input: expected a 4-D \(N, C, H, W\) or 3-D"),
    (AdaptiveMaxPool2d(3), torch.randn(1, 2, 0, 4),
     r"AdaptiveMaxPool2d: input: expected non-empty channel and spatial dims, got shape \(1, 2, 0, 4\)"),
    (AdaptiveMaxPool1d(3), torch.ones(1, 2, 4, dtype=torch.long), r"AdaptiveMaxPool1d: input: expected a floating"),
])
def test_input_errors(layer, x, message):
    with pytest.raises(ValueError, match=message):
        layer(x)


def test_a_trace_holds_for_the_traced_size_only():
    layer = AdaptiveAvgPool2d(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(layer, torch.randn(1, 2, 8, 8))
    with pytest.raises(RuntimeError):  # the 8×8 bin tables do not fit a 9×9 input
        traced(torch.randn(1, 2, 9, 9))
