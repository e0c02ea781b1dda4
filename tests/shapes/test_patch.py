"""ViT patch embedding (Conv2d, kernel = stride = patch, then flatten(2).transpose(1, 2)) against torch
(shape_rules.md §11, §15 E40)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from tests.shapes.oracle import Outcome, assert_same_outcome, layerlab_outcome, torch_outcome


def run_torch(shape, patch_size, embed_dim=768, in_channels=None, flatten=True) -> Outcome:
    c = in_channels if in_channels is not None else (shape[-3] if len(shape) >= 3 else 1)

    def fn():
        y = torch.nn.Conv2d(c, embed_dim, kernel_size=patch_size, stride=patch_size)(torch.zeros(shape))
        return y.flatten(2).transpose(1, 2) if flatten else y

    return torch_outcome(fn)


def check(shape, **params) -> Outcome:
    theirs = run_torch(shape, **params)
    assert_same_outcome(layerlab_outcome("patch_embed", shape, **params), theirs, f"patch{tuple(shape)} {params}")
    return theirs


@settings(max_examples=100, deadline=None, derandomize=True)
@given(batch=st.sampled_from([None, 0, 1, 2]), c=st.sampled_from([1, 3]), h=st.integers(0, 40), w=st.integers(0, 40),
       patch=st.one_of(st.integers(1, 16), st.tuples(st.integers(1, 12), st.integers(1, 12)),
                       st.sampled_from([0, -1])),
       embed_dim=st.sampled_from([1, 8, 0]), in_channels=st.sampled_from([None, None, None, 2]),
       flatten=st.booleans())
def test_patch_matches_torch(batch, c, h, w, patch, embed_dim, in_channels, flatten):
    shape = ([] if batch is None else [batch]) + [c, h, w]
    theirs = check(tuple(shape), patch_size=patch, embed_dim=embed_dim, in_channels=in_channels, flatten=flatten)
    event(f"torch raises {theirs.exc}" if theirs.raised else "torch returns a shape")


def test_e40_cropped_patches():
    theirs = check((1, 3, 225, 225), patch_size=16, embed_dim=8)
    assert theirs.shape == (1, 196, 8)  # 14 × 14 patches; row 224 and column 224 dropped
    ex = explain("patch_embed", (1, 3, 225, 225), patch_size=16, embed_dim=8)
    notes = [n for n in ex.notes if n.code == "patch-cropped"]
    assert [(n.dim, n.data["pixels"]) for n in notes] == [("H", [224]), ("W", [224])]
    assert [(s.dim, s.output) for s in ex.steps] == [("H", 14), ("W", 14), ("patches", 196)]


def test_exact_fit_has_no_note():
    ex = explain("patch_embed", (2, 3, 224, 224), patch_size=16, embed_dim=768)
    assert ex.output_shape == (2, 196, 768)
    assert not [n for n in ex.notes if n.code == "patch-cropped"]


def test_image_smaller_than_patch_is_the_conv_error():
    theirs = check((1, 3, 8, 8), patch_size=16, embed_dim=8)
    assert theirs.message == ("Calculated padded input size per channel: (8 x 8). Kernel size: (16 x 16). "
                              "Kernel size can't be greater than actual input size")
    with pytest.raises(TorchWouldRaise, match="does not fit") as info:
        output_shape("patch_embed", (1, 3, 8, 8), patch_size=16, embed_dim=8)
    assert info.value.rule == "§1.1"


def test_no_flatten_keeps_the_grid():
    assert check((2, 3, 32, 48), patch_size=(16, 8), embed_dim=4, flatten=False).shape == (2, 4, 2, 6)
