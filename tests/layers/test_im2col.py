"""layerlab.layers.im2col: Conv2d as unfold + matmul, against torch.nn.Conv2d."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from torch import nn

from layerlab.layers.im2col import Im2colConv2d
from tests.layers._spatial_checks import (
    F64, assert_compiles, assert_gradcheck, assert_parity, assert_shape_op, assert_traces, randn,
)
from tests.layers.test_conv import _case, conv_cases

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")


@settings(max_examples=50, deadline=None)
@given(conv_cases(nds=(2,)))
@example(_case(2, (2, 6, 6, 5), in_channels=6, out_channels=3, kernel_size=(4, 2), padding="same", groups=3,
               padding_mode="reflect"))
def test_forward_backward_parity_with_torch(case):
    ref = nn.Conv2d(**case["args"], dtype=F64)
    ours = Im2colConv2d.from_torch(ref)
    assert_parity(ours, ref, randn(*case["shape"]))


def test_patch_matrix_is_torchs_unfold_of_the_padded_input():
    layer = Im2colConv2d(2, 4, (2, 3), stride=(1, 2), padding=(1, 0), dilation=(2, 1), dtype=F64)
    x = randn(3, 2, 7, 8)
    patches = layer.patches(x)
    expected = F.unfold(x, (2, 3), dilation=(2, 1), padding=(1, 0), stride=(1, 2))
    assert patches.shape == (3, 2 * 2 * 3, 7 * 3)  # (N, C·kh·kw, H_out·W_out): H_out = 7, W_out = 3
    torch.testing.assert_close(patches, expected)


def test_last_patches_after_forward_and_their_gradient():
    layer = Im2colConv2d(3, 5, 3, padding=1, dtype=F64)
    x = randn(2, 3, 4, 4, requires_grad=True)  # patches are in the graph when the input is
    out = layer(x)
    torch.testing.assert_close(layer.last_patches, layer.patches(x))
    # out[n, j, q] = Σ_r W[j, r] · patches[n, r, q]  ⇒  ∂ Σ out / ∂ patches[n, r, q] = Σ_j W[j, r]
    (grad,) = torch.autograd.grad(out.sum(), layer.last_patches)
    expected = layer.weight.reshape(5, -1).sum(0)[None, :, None].expand(2, -1, 16)
    torch.testing.assert_close(grad, expected)


def test_keep_patches_false_stores_nothing():
    layer = Im2colConv2d(1, 1, 1, keep_patches=False)
    layer(torch.randn(1, 1, 2, 2))
    assert layer.last_patches is None and "keep_patches=False" in repr(layer)


def test_unbatched_input():
    ref = nn.Conv2d(2, 3, 3, dtype=F64)
    assert_parity(Im2colConv2d.from_torch(ref), ref, randn(2, 5, 6))


def test_gradcheck_trace_and_compile():
    layer = Im2colConv2d(4, 6, (3, 2), stride=(2, 1), padding="valid", dilation=(1, 2), groups=2).double()
    x = randn(2, 4, 7, 6)
    assert_gradcheck(layer, x)
    assert_traces(layer, x)
    assert_compiles(layer, x)  # also stores last_patches: dynamo replays the attribute write


def test_round_trip_and_shape_op():
    ref = nn.Conv2d(3, 6, 3, padding=1, groups=3, dtype=F64)
    layer = Im2colConv2d.from_torch(ref)
    assert torch.equal(layer.to_torch().weight, ref.weight)
    assert_shape_op(layer, randn(1, 3, 5, 5), nn.Conv2d, "conv2d")


def test_input_error_names_the_layer():
    with pytest.raises(ValueError, match=r"Im2colConv2d: input: expected 3 channels"):
        Im2colConv2d(3, 4, 3)(torch.randn(1, 2, 5, 5))


def test_a_traced_layer_does_not_update_last_patches():
    layer = Im2colConv2d(2, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(layer, torch.randn(1, 2, 6, 6))
    at_tracing = layer.last_patches
    traced(torch.randn(1, 2, 6, 6))
    assert layer.last_patches is at_tracing  # documented: use eager or torch.compile to read patches
