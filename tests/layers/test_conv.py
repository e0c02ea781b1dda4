"""layerlab.layers.conv against torch.nn.Conv1d/2d/3d."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.conv import PADDING_MODES, Conv1d, Conv2d, Conv3d
from tests.layers._spatial_checks import (
    F64, assert_compiles, assert_gradcheck, assert_parity, assert_shape_op, assert_traces, randn,
)

# torch's own note on 'same' with even kernels (it pads a copy, as we do) is not under test here
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

OURS = {1: Conv1d, 2: Conv2d, 3: Conv3d}
TORCH = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


@st.composite
def conv_cases(draw, nds=(1, 2, 3)):
    nd = draw(st.sampled_from(nds))
    groups = draw(st.sampled_from([1, 2, 3]))
    in_channels = groups * draw(st.integers(1, 2))
    out_channels = groups * draw(st.integers(1, 2))
    kmax = 3 if nd == 3 else 4
    kernel = draw(st.tuples(*[st.integers(1, kmax)] * nd))
    dilation = draw(st.tuples(*[st.integers(1, 2)] * nd))
    padding = draw(st.one_of(st.sampled_from(["same", "valid"]), st.integers(0, 2),
                             st.tuples(*[st.integers(0, 2)] * nd)))
    stride = (1,) * nd if padding == "same" else draw(st.tuples(*[st.integers(1, 3)] * nd))
    span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    # ≥ the span (the padded input must hold a window) and ≥ 3 (reflect needs padding < size)
    size = tuple(max(e, 3) + draw(st.integers(0, 2 if nd == 3 else 4)) for e in span)
    return dict(
        nd=nd, args=dict(in_channels=in_channels, out_channels=out_channels, kernel_size=kernel, stride=stride,
                         padding=padding, dilation=dilation, groups=groups, bias=draw(st.booleans()),
                         padding_mode=draw(st.sampled_from(PADDING_MODES))),
        shape=((draw(st.integers(1, 2)),) if draw(st.booleans()) else ()) + (in_channels, *size),
    )


def _case(nd, shape, **args):
    base = dict(stride=1, padding=0, dilation=1, groups=1, bias=True, padding_mode="zeros")
    return dict(nd=nd, args={**base, **args}, shape=shape)


@settings(max_examples=60, deadline=None)
@given(conv_cases())
# the cases most worth never missing: 'same' with an even kernel (asymmetric pads), every mode
@example(_case(2, (2, 2, 6, 5), in_channels=2, out_channels=4, kernel_size=(4, 2), padding="same"))
@example(_case(2, (2, 2, 6, 5), in_channels=2, out_channels=2, kernel_size=(2, 4), padding="same",
               groups=2, padding_mode="reflect"))
@example(_case(1, (3, 7), in_channels=3, out_channels=3, kernel_size=4, padding="same", dilation=3,
               padding_mode="circular"))
@example(_case(3, (1, 1, 4, 5, 3), in_channels=1, out_channels=2, kernel_size=2, padding="same",
               padding_mode="replicate"))
def test_forward_backward_parity_with_torch(case):
    ref = TORCH[case["nd"]](**case["args"], dtype=F64)
    ours = OURS[case["nd"]].from_torch(ref)
    assert_parity(ours, ref, randn(*case["shape"]))


def test_same_padding_with_even_kernel_puts_the_extra_pixel_at_the_end():
    conv = Conv1d(1, 1, 4, padding="same", bias=False, dtype=F64)
    assert conv._explicit_padding() == ((1, 2),)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[[1.0, 0, 0, 0]]]))
    x = torch.arange(1.0, 6.0, dtype=F64).reshape(1, 1, 5)
    # out[t] = x_pad[t] and x_pad = [0, 1, 2, 3, 4, 5, 0, 0]: one zero before, two after
    assert conv(x).flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    ref = nn.Conv1d(1, 1, 4, padding="same", bias=False, dtype=F64)
    ref.weight.data.copy_(conv.weight)
    assert conv(x).tolist() == ref(x).tolist()


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_default_init_draws_the_same_numbers_as_torch(nd):
    torch.manual_seed(123)
    ref = TORCH[nd](4, 6, 3, groups=2)
    torch.manual_seed(123)
    ours = OURS[nd](4, 6, 3, groups=2)
    torch.testing.assert_close(ours.weight, ref.weight, rtol=0, atol=1e-7)
    torch.testing.assert_close(ours.bias, ref.bias, rtol=0, atol=1e-7)
    bound = 1 / math.sqrt(2 * 3**nd)  # fan_in = (C_in / groups) · ∏k
    assert ours.weight.abs().max() <= bound and ours.weight.abs().max() > 0.8 * bound


@pytest.mark.parametrize("make, shape", [
    (lambda: Conv1d(2, 4, 3, padding="same", padding_mode="circular"), (2, 2, 7)),
    (lambda: Conv2d(4, 6, (2, 3), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2,
                    padding_mode="reflect"), (2, 4, 6, 7)),
    (lambda: Conv3d(2, 2, 2, padding="same", padding_mode="replicate"), (1, 2, 3, 4, 3)),
])
def test_gradcheck_trace_and_compile(make, shape):
    layer = make().double()
    x = randn(*shape)
    assert_gradcheck(layer, x)
    assert_traces(layer, x)
    assert_compiles(layer, x)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_torch_round_trip_keeps_weights_and_outputs(nd):
    ref = TORCH[nd](2, 4, 3, padding=1, padding_mode="replicate", bias=True, dtype=F64)
    ours = OURS[nd].from_torch(ref)
    back = ours.to_torch()
    assert type(back) is TORCH[nd] and back.padding_mode == "replicate"
    for name, p in ref.named_parameters():
        assert torch.equal(dict(back.named_parameters())[name], p)
    x = randn(1, 2, *([5] * nd))
    assert torch.equal(back(x), ref(x))
    assert torch.equal(ours(x), ref(x))


def test_from_torch_keeps_dtype_requires_grad_and_no_bias():
    ref = nn.Conv2d(3, 3, 1, bias=False, dtype=F64)
    ref.weight.requires_grad_(False)
    ours = Conv2d.from_torch(ref)
    assert ours.bias is None and ours.weight.dtype == F64 and not ours.weight.requires_grad


def test_from_torch_rejects_another_layer():
    with pytest.raises(TypeError, match=r"Conv2d.from_torch: expected torch.nn.Conv2d, got Conv1d"):
        Conv2d.from_torch(nn.Conv1d(1, 1, 1))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_shape_op_params_build_the_torch_layer(nd):
    layer = OURS[nd](3, 6, 2, padding="same", padding_mode="reflect", dtype=F64)
    assert_shape_op(layer, randn(2, 3, *([5] * nd)), TORCH[nd], f"conv{nd}d")


def test_shape_op_example_from_the_issue():
    assert Conv2d(3, 16, 3, padding=1).layerlab_shape_op() == ("conv2d", {
        "in_channels": 3, "out_channels": 16, "kernel_size": (3, 3), "stride": (1, 1), "padding": (1, 1),
        "dilation": (1, 1), "groups": 1, "padding_mode": "zeros"})


def test_extra_repr_shows_non_defaults_like_torch():
    assert repr(Conv2d(3, 8, 3)) == repr(nn.Conv2d(3, 8, 3))
    assert repr(Conv2d(3, 6, 2, stride=2, padding=1, groups=3, bias=False, padding_mode="circular")) == (
        "Conv2d(3, 6, kernel_size=(2, 2), stride=(2, 2), padding=(1, 1), groups=3, bias=False, "
        "padding_mode='circular')")


@pytest.mark.parametrize("make, x, message", [
    (lambda: Conv2d(3, 8, 3), torch.randn(2, 4, 8, 8),
     r"Conv2d: input: expected 3 channels at dim 1 \(in_channels=3\), got 4 channels in input of shape "
     r"\(2, 4, 8, 8\) → set in_channels=4"),
    (lambda: Conv2d(3, 8, 3), torch.randn(3, 8),
     r"Conv2d: input: expected a 4-D \(N, C, H, W\) or 3-D unbatched \(C, H, W\) tensor, got a 2-D tensor .*"
     r"→ add a channel dim of size 1: x.unsqueeze\(-3\)"),
    (lambda: Conv1d(3, 8, 3), torch.randn(2, 3, 4, 4),
     r"Conv1d: input: expected a 3-D .* got a 4-D tensor of shape \(2, 3, 4, 4\)"),
    (lambda: Conv2d(1, 1, 5, dilation=2), torch.randn(1, 1, 8, 9),
     r"Conv2d: input: expected padded spatial size ≥ dilation·\(kernel_size − 1\) \+ 1 = \(9, 9\), "
     r"got spatial size \(8, 9\), padded to \(8, 9\)"),
    (lambda: Conv2d(1, 1, 3, padding=2, padding_mode="reflect"), torch.randn(1, 1, 2, 5),
     r"Conv2d: padding: expected padding < input size H=2 with padding_mode='reflect', got padding \(2, 2\) along H"),
    (lambda: Conv1d(1, 1, 1, padding=4, padding_mode="circular"), torch.randn(1, 1, 3),
     r"Conv1d: padding: expected padding ≤ input size L=3 with padding_mode='circular'"),
    (lambda: Conv2d(1, 1, 1), torch.randn(1, 1, 2, 2, dtype=F64),
     r"Conv2d: input: expected dtype torch.float32 \(the layer's parameters\), got dtype torch.float64 → "
     r"convert the input with x.to\(torch.float32\) or the layer with layer.to\(torch.float64\)"),
])
def test_input_errors_say_expected_got_and_fix(make, x, message):
    with pytest.raises(ValueError, match=message):
        make()(x)


@pytest.mark.parametrize("kwargs, message", [
    (dict(in_channels=4, out_channels=6, kernel_size=3, groups=3),
     r"Conv2d: groups: expected a divisor of in_channels=4, got 3 → use groups in \[1, 2\]"),
    (dict(in_channels=3, out_channels=4, kernel_size=3, groups=3),
     r"Conv2d: groups: expected a divisor of out_channels=4, got 3"),
    (dict(in_channels=3, out_channels=4, kernel_size=3, padding="full"),
     r"Conv2d: padding: expected 'same', 'valid', an int or a tuple, got 'full'"),
    (dict(in_channels=3, out_channels=4, kernel_size=3, padding="same", stride=2),
     r"Conv2d: padding: expected stride=1 with padding='same', got stride=\(2, 2\)"),
    (dict(in_channels=3, out_channels=4, kernel_size=(3, 3, 3)),
     r"Conv2d: kernel_size: expected an int ≥ 1 or a tuple of 2 such ints, got \(3, 3, 3\)"),
    (dict(in_channels=3, out_channels=4, kernel_size=3, padding=-1),
     r"Conv2d: padding: expected an int ≥ 0 or a tuple of 2 such ints, got -1"),
    (dict(in_channels=0, out_channels=4, kernel_size=3),
     r"Conv2d: in_channels: expected a positive int, got 0"),
    (dict(in_channels=3, out_channels=4, kernel_size=3, padding_mode="mirror"),
     r"Conv2d: padding_mode: expected one of 'zeros', 'reflect', 'replicate', 'circular', got 'mirror'"),
])
def test_construction_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Conv2d(**kwargs)
