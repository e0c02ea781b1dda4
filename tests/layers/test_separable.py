"""layerlab.layers.separable against the equivalent pair of torch.nn.Conv2d."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.separable import SeparableConv2d
from tests.layers._spatial_checks import (
    F64, assert_compiles, assert_gradcheck, assert_parity, assert_shape_op, assert_traces, randn,
)

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

NAMES = {"depthwise.weight": "0.weight", "depthwise.bias": "0.bias",
         "pointwise.weight": "1.weight", "pointwise.bias": "1.bias"}


def torch_pair(c_in, c_out, k, m=1, stride=1, padding=0, dilation=1, bias=True, depthwise_bias=False,
               padding_mode="zeros"):
    return nn.Sequential(
        nn.Conv2d(c_in, c_in * m, k, stride, padding, dilation, groups=c_in, bias=depthwise_bias,
                  padding_mode=padding_mode, dtype=F64),
        nn.Conv2d(c_in * m, c_out, 1, bias=bias, dtype=F64),
    )


@settings(max_examples=40, deadline=None)
@given(c_in=st.integers(1, 3), c_out=st.integers(1, 4), k=st.integers(1, 4), m=st.integers(1, 2),
       stride=st.integers(1, 2), padding=st.sampled_from([0, 1, "same", "valid"]), dilation=st.integers(1, 2),
       bias=st.booleans(), depthwise_bias=st.booleans(),
       padding_mode=st.sampled_from(["zeros", "reflect", "replicate", "circular"]), extra=st.integers(0, 3))
def test_forward_backward_parity_with_torch(c_in, c_out, k, m, stride, padding, dilation, bias, depthwise_bias,
                                            padding_mode, extra):
    stride = 1 if padding == "same" else stride
    ref = torch_pair(c_in, c_out, k, m, stride, padding, dilation, bias, depthwise_bias, padding_mode)
    ours = SeparableConv2d.from_torch(ref)
    size = max(dilation * (k - 1) + 1, 3) + extra
    assert_parity(ours, ref, randn(2, c_in, size, size + 1), param_map=NAMES)


def test_parameter_count_is_the_separable_one():
    sep = SeparableConv2d(32, 64, 3, padding=1)
    assert sum(p.numel() for p in sep.parameters()) == 32 * 9 + 32 * 64 + 64
    assert sep(torch.randn(1, 32, 8, 8)).shape == (1, 64, 8, 8)


def test_round_trip():
    layer = SeparableConv2d(4, 6, 3, depth_multiplier=2, padding="same", depthwise_bias=True, dtype=F64)
    ref = layer.to_torch()
    assert [type(m) for m in ref] == [nn.Conv2d, nn.Conv2d] and ref[0].groups == 4 and ref[0].out_channels == 8
    again = SeparableConv2d.from_torch(ref)
    x = randn(2, 4, 5, 5)
    assert torch.equal(again(x), layer(x)) and torch.equal(ref(x), layer(x))
    assert layer.in_channels == 4 and layer.out_channels == 6 and "depth_multiplier=2" in repr(layer)


def test_gradcheck_trace_and_compile():
    layer = SeparableConv2d(2, 3, 3, stride=2, padding=1, depthwise_bias=True).double()
    x = randn(2, 2, 6, 5)
    assert_gradcheck(layer, x)
    assert_traces(layer, x)
    assert_compiles(layer, x)


def test_shape_op_predicts_a_conv2d():
    layer = SeparableConv2d(4, 6, 3, stride=2, padding=1, dtype=F64)
    assert_shape_op(layer, randn(1, 4, 9, 9), nn.Conv2d, "conv2d")


@pytest.mark.parametrize("module, message", [
    (nn.Sequential(nn.Conv2d(4, 4, 3)), r"SeparableConv2d: module: expected nn.Sequential of 2 Conv2d"),
    (nn.Sequential(nn.Conv2d(4, 4, 3), nn.Conv2d(4, 2, 1)),
     r"SeparableConv2d: module\[0\]: expected a depthwise Conv2d \(groups = in_channels\), got groups=1"),
    (nn.Sequential(nn.Conv2d(4, 4, 3, groups=4), nn.Conv2d(4, 2, 3)),
     r"SeparableConv2d: module\[1\]: expected a 1×1 Conv2d"),
])
def test_from_torch_rejects_other_pairs(module, message):
    with pytest.raises(ValueError, match=message):
        SeparableConv2d.from_torch(module)


def test_input_error_names_the_inner_layer():
    with pytest.raises(ValueError, match=r"Conv2d: input: expected 4 channels .* → set in_channels=3"):
        SeparableConv2d(4, 8, 3)(torch.randn(1, 3, 8, 8))
