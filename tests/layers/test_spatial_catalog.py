"""The spatial registry entries: static data without torch, and each one builds and runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from layerlab.catalog import spatial
from layerlab.registry import REGISTRY

NAMES = [e.name for e in spatial.ENTRIES]


def test_the_catalog_does_not_import_torch():
    code = "import sys, layerlab.catalog.spatial, layerlab.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_every_layer_of_the_issue_is_registered():
    expected = {"conv1d", "conv2d", "conv3d", "conv2d_im2col", "separable_conv2d", "max_pool1d", "max_pool2d",
                "avg_pool1d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "soft_adaptive_pool2d",
                "linear", "patch_embedding"}
    assert expected <= set(NAMES) and all(REGISTRY[n] is e for n, e in zip(NAMES, spatial.ENTRIES))


@pytest.mark.parametrize("entry", spatial.ENTRIES, ids=NAMES)
def test_entry_builds_runs_and_matches_its_torch_twin(entry):
    torch.manual_seed(0)
    layer = entry.load()(**entry.args)
    (spec,) = entry.inputs.values()
    x = torch.randn(spec["shape"])
    out = layer(x)
    if not hasattr(layer, "to_torch"):  # soft_adaptive_pool2d: no torch counterpart
        assert entry.reference is None
        return
    twin = layer.to_torch()
    if entry.reference is not None:
        assert isinstance(twin, entry.load_reference())
    expected = twin(x)
    if entry.name == "patch_embedding":
        expected = expected.flatten(2).transpose(1, 2)  # the reference Conv2d's map, one row per patch
    torch.testing.assert_close(out, expected)
    if hasattr(layer, "layerlab_shape_op"):
        from layerlab.shapes import OPS, output_shape

        op, params = layer.layerlab_shape_op()
        assert op in OPS and set(params) <= set(OPS[op].defaults)
        assert output_shape(op, tuple(x.shape), **params) == tuple(out.shape)


def _extra_layers():
    from layerlab.layers import AdaptiveMaxPool2d, Conv2d, Conv3d, MaxPool2d, PatchEmbedding, SeparableConv2d
    return [
        (Conv2d(3, 8, 4, padding="same", padding_mode="reflect"), (2, 3, 9, 7)),
        (Conv3d(2, 4, (1, 3, 2), stride=(1, 2, 3), dilation=2, groups=2), (2, 2, 4, 9, 9)),
        (SeparableConv2d(4, 6, 3, stride=2, padding=1), (4, 8, 8)),
        (MaxPool2d(3, 2, 1, ceil_mode=True), (1, 2, 10, 9)),
        (AdaptiveMaxPool2d((3, None)), (1, 2, 10, 9)),
        (PatchEmbedding(4, 3, 8, flatten=False), (2, 3, 16, 12)),
    ]


@pytest.mark.parametrize("layer, shape", [pytest.param(*case, id=type(case[0]).__name__) for case in _extra_layers()])
def test_shape_op_names_a_known_op_and_predicts_the_output_shape(layer, shape):
    from layerlab.shapes import OPS, output_shape

    op, params = layer.layerlab_shape_op()
    assert op in OPS and set(params) <= set(OPS[op].defaults)
    # the shapes engine is written separately; this cross-checks it against the real layer
    assert output_shape(op, shape, **params) == tuple(layer(torch.randn(shape)).shape)
