"""layerlab.layers.patch: ViT patch embedding, conv form and unfold + linear form, against torch.nn.Conv2d."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.patch import PatchEmbedding
from tests.layers._spatial_checks import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn


def tokens(y):
    return y.flatten(-2).transpose(-2, -1)  # torch's conv map (N, D, H', W') → (N, L, D)


@pytest.fixture(autouse=True)
def _no_crop_warnings():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PatchEmbedding: a .* image is not a multiple")
        yield


@st.composite
def patch_cases(draw):
    patch = draw(st.tuples(st.integers(1, 4), st.integers(1, 4)))
    c, d = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    h = patch[0] * draw(st.integers(1, 3)) + draw(st.integers(0, patch[0] - 1))  # remainders included
    w = patch[1] * draw(st.integers(1, 3)) + draw(st.integers(0, patch[1] - 1))
    batch = (draw(st.integers(1, 2)),) if draw(st.booleans()) else ()
    return patch, c, d, draw(st.booleans()), (*batch, c, h, w)


@settings(max_examples=50, deadline=None)
@given(patch_cases())
def test_conv_form_parity_with_torch(case):
    patch, c, d, bias, shape = case
    ref = nn.Conv2d(c, d, patch, stride=patch, bias=bias, dtype=F64)
    ours = PatchEmbedding.from_torch(ref)
    names = {"proj.weight": "weight", "proj.bias": "bias"}
    assert_parity(ours, ref, randn(*shape), param_map=names, ref_out=tokens)


class UnfoldForm(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.embed = embed

    def forward(self, x):
        return self.embed.forward_unfold(x)


@settings(max_examples=50, deadline=None)
@given(patch_cases(), st.booleans())
def test_unfold_linear_form_is_the_same_map(case, flatten):
    patch, c, d, bias, shape = case
    conv_form = PatchEmbedding(patch, c, d, bias=bias, flatten=flatten, dtype=F64)
    unfold_form = UnfoldForm(PatchEmbedding(patch, c, d, bias=bias, flatten=flatten, dtype=F64))
    unfold_form.embed.load_state_dict(conv_form.state_dict())
    names = {f"embed.{k}": k for k, _ in conv_form.named_parameters()}
    assert_parity(unfold_form, conv_form, randn(*shape), param_map=names)


def test_patches_are_rows_of_c_times_p_times_p_values():
    embed = PatchEmbedding(2, 3, 8, dtype=F64)
    x = randn(1, 3, 4, 6)
    p = embed.patches(x)
    assert p.shape == (1, 6, 12)  # (N, L = 2·3, C·P·P = 3·2·2)
    # patch 4 is row 1, column 1 of the 2×3 grid: pixels [2:4, 2:4], channel-major
    torch.testing.assert_close(p[0, 4], x[0, :, 2:4, 2:4].flatten())


def test_vit_base_shapes():
    embed = PatchEmbedding(16, 3, 768)
    assert embed(torch.randn(1, 3, 224, 224)).shape == (1, 196, 768)
    assert PatchEmbedding(16, 3, 32, flatten=False)(torch.randn(1, 3, 64, 32)).shape == (1, 32, 4, 2)
    assert embed.grid(224, 224) == (14, 14)


def test_cropping_warns_or_raises():
    x = torch.randn(1, 3, 33, 30)
    with pytest.warns(UserWarning, match=r"PatchEmbedding: a 33×30 image is not a multiple of patch_size=\(8, 8\): "
                      r"the last 1 row\(s\) and 6 column\(s\) are dropped → resize/pad to 32×24 or 40×32"):
        assert PatchEmbedding(8, 3, 4)(x).shape == (1, 4 * 3, 4)
    with pytest.raises(ValueError, match=r"PatchEmbedding: input: expected H, W multiples of patch_size=\(8, 8\), "
                       r"got 33×30 → resize, crop or pad the image to 32×24 or 40×32"):
        PatchEmbedding(8, 3, 4, strict=True)(x)


@pytest.mark.parametrize("x, message", [
    (torch.randn(1, 3, 4, 20), r"PatchEmbedding: input: expected an image of at least one patch 8×8, got 4×20"),
    (torch.randn(3, 16), r"PatchEmbedding: input: expected a 4-D \(N, C, H, W\) or 3-D"),
    (torch.randn(1, 1, 16, 16), r"PatchEmbedding: input: expected 3 channels .* → set in_channels=1"),
    (torch.randn(1, 3, 16, 16, dtype=torch.float64), r"PatchEmbedding: input: expected dtype torch.float32"),
])
def test_input_errors(x, message):
    with pytest.raises(ValueError, match=message):
        PatchEmbedding(8, 3, 4)(x)


def test_gradcheck_trace_and_compile():
    embed = PatchEmbedding((2, 3), 2, 4).double()
    x = randn(2, 2, 4, 6)
    assert_gradcheck(embed, x)
    assert_traces(embed, x)
    assert_compiles(embed, x)
    assert_compiles(UnfoldForm(embed), x)


def test_compile_skips_the_crop_warning_instead_of_breaking_the_graph():
    # warnings.warn cannot be captured by dynamo; under torch.compile the layer skips it (documented)
    embed = PatchEmbedding(4, 1, 2).double()
    x = randn(1, 1, 9, 8)
    torch._dynamo.reset()
    compiled = torch.compile(embed, fullgraph=True, backend="aot_eager")  # aot_eager: see _spatial_checks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = compiled(x)
    torch.testing.assert_close(out, embed(x))  # eager (warning filtered by the fixture)


def test_round_trip_and_shape_op():
    ref = nn.Conv2d(3, 16, 4, stride=4, dtype=F64)
    embed = PatchEmbedding.from_torch(ref)
    assert embed.patch_size == (4, 4) and embed.in_channels == 3 and embed.embed_dim == 16
    back = embed.to_torch()
    assert torch.equal(back.weight, ref.weight) and torch.equal(back.bias, ref.bias)
    assert embed.layerlab_shape_op() == ("patch_embed", {"patch_size": 4, "in_channels": 3, "embed_dim": 16,
                                                         "flatten": True})
    holder = nn.Module()
    holder.proj = ref
    assert torch.equal(PatchEmbedding.from_torch(holder).proj.weight, ref.weight)  # timm-style .proj


def test_from_torch_rejects_overlapping_convs():
    with pytest.raises(ValueError, match=r"PatchEmbedding: module: expected Conv2d with kernel_size == stride"):
        PatchEmbedding.from_torch(nn.Conv2d(3, 8, 4, stride=2))
