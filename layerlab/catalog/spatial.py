"""Registry entries of the spatial reference layers (static data; importing this never imports torch).

Each entry's ``reference`` is the ``torch.nn`` class its ``from_torch``/``to_torch`` convert to.
Two need a note:

* ``separable_conv2d`` has no single torch class; its ``to_torch()`` returns the equivalent
  ``nn.Sequential(depthwise nn.Conv2d, pointwise nn.Conv2d)``, so ``reference`` is ``None``.
* ``patch_embedding``'s reference ``nn.Conv2d`` (kernel = stride = patch) outputs ``(N, D, H', W')``;
  the layer returns that map as ``flatten(2).transpose(1, 2)``, i.e. ``(N, L, D)``.
"""

from __future__ import annotations

from typing import List

from layerlab.registry_types import LayerEntry

_IMAGE = {"input": {"shape": [2, 3, 16, 16]}}

ENTRIES: List[LayerEntry] = [
    LayerEntry(
        name="conv1d", target="layerlab.layers.conv:Conv1d", reference="torch.nn:Conv1d",
        args={"in_channels": 3, "out_channels": 8, "kernel_size": 3, "padding": 1},
        inputs={"input": {"shape": [2, 3, 32]}},
        summary="1-D convolution with torch's init written out and padding computed explicitly",
    ),
    LayerEntry(
        name="conv2d", target="layerlab.layers.conv:Conv2d", reference="torch.nn:Conv2d",
        args={"in_channels": 3, "out_channels": 16, "kernel_size": 3, "padding": 1},
        inputs=_IMAGE,
        summary="2-D convolution; 'same' for even kernels and reflect/replicate/circular padding spelled out",
    ),
    LayerEntry(
        name="conv3d", target="layerlab.layers.conv:Conv3d", reference="torch.nn:Conv3d",
        args={"in_channels": 3, "out_channels": 8, "kernel_size": 3, "padding": 1},
        inputs={"input": {"shape": [2, 3, 8, 8, 8]}},
        summary="3-D convolution with torch's init written out and padding computed explicitly",
    ),
    LayerEntry(
        name="conv2d_im2col", target="layerlab.layers.im2col:Im2colConv2d", reference="torch.nn:Conv2d",
        args={"in_channels": 3, "out_channels": 16, "kernel_size": 3, "padding": 1},
        inputs=_IMAGE,
        summary="Conv2d as unfold + matmul, exposing the patch matrix (N, C·kh·kw, L)",
    ),
    LayerEntry(
        name="separable_conv2d", target="layerlab.layers.separable:SeparableConv2d", reference=None,
        args={"in_channels": 8, "out_channels": 16, "kernel_size": 3, "padding": 1},
        inputs={"input": {"shape": [2, 8, 16, 16]}},
        summary="depthwise (groups=C) then pointwise 1×1 conv; to_torch() gives the nn.Conv2d pair",
    ),
    LayerEntry(
        name="max_pool1d", target="layerlab.layers.pool:MaxPool1d", reference="torch.nn:MaxPool1d",
        args={"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        inputs={"input": {"shape": [2, 3, 32]}},
        summary="max pooling with the output-size and ceil-mode arithmetic written out (unfold + max)",
    ),
    LayerEntry(
        name="max_pool2d", target="layerlab.layers.pool:MaxPool2d", reference="torch.nn:MaxPool2d",
        args={"kernel_size": 3, "stride": 2, "padding": 1},
        inputs=_IMAGE,
        summary="max pooling with the output-size and ceil-mode arithmetic written out (unfold + max)",
    ),
    LayerEntry(
        name="avg_pool1d", target="layerlab.layers.pool:AvgPool1d", reference="torch.nn:AvgPool1d",
        args={"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        inputs={"input": {"shape": [2, 3, 32]}},
        summary="average pooling with the divisor (count_include_pad, ceil mode) computed explicitly",
    ),
    LayerEntry(
        name="avg_pool2d", target="layerlab.layers.pool:AvgPool2d", reference="torch.nn:AvgPool2d",
        args={"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
        inputs=_IMAGE,
        summary="average pooling with the divisor (count_include_pad, ceil mode, override) computed explicitly",
    ),
    LayerEntry(
        name="adaptive_avg_pool1d", target="layerlab.layers.adaptive:AdaptiveAvgPool1d",
        reference="torch.nn:AdaptiveAvgPool1d", args={"output_size": 5},
        inputs={"input": {"shape": [2, 3, 32]}},
        summary="mean over torch's adaptive bins [⌊i·L/O⌋, ⌈(i+1)·L/O⌉)",
    ),
    LayerEntry(
        name="adaptive_avg_pool2d", target="layerlab.layers.adaptive:AdaptiveAvgPool2d",
        reference="torch.nn:AdaptiveAvgPool2d", args={"output_size": [5, 5]}, inputs=_IMAGE,
        summary="mean over torch's adaptive bins [⌊i·L/O⌋, ⌈(i+1)·L/O⌉), overlapping when O ∤ L",
    ),
    LayerEntry(
        name="adaptive_max_pool1d", target="layerlab.layers.adaptive:AdaptiveMaxPool1d",
        reference="torch.nn:AdaptiveMaxPool1d", args={"output_size": 5},
        inputs={"input": {"shape": [2, 3, 32]}},
        summary="max over torch's adaptive bins [⌊i·L/O⌋, ⌈(i+1)·L/O⌉)",
    ),
    LayerEntry(
        name="adaptive_max_pool2d", target="layerlab.layers.adaptive:AdaptiveMaxPool2d",
        reference="torch.nn:AdaptiveMaxPool2d", args={"output_size": [5, 5]}, inputs=_IMAGE,
        summary="max over torch's adaptive bins [⌊i·L/O⌋, ⌈(i+1)·L/O⌉), overlapping when O ∤ L",
    ),
    LayerEntry(
        name="soft_adaptive_pool2d", target="layerlab.layers.adaptive:SoftAdaptivePool2d", reference=None,
        args={"output_size": [5, 5], "temperature": 1.0}, inputs=_IMAGE,
        summary="softmax-weighted adaptive pooling, learnable temperature: τ→0 is max, τ→∞ is avg",
    ),
    LayerEntry(
        name="linear", target="layerlab.layers.linear:Linear", reference="torch.nn:Linear",
        args={"in_features": 64, "out_features": 32}, inputs={"input": {"shape": [8, 64]}},
        summary="y = x Wᵀ + b with torch's init written out; says which in_features to set",
    ),
    LayerEntry(
        name="patch_embedding", target="layerlab.layers.patch:PatchEmbedding", reference="torch.nn:Conv2d",
        args={"patch_size": 4, "in_channels": 3, "embed_dim": 64}, inputs={"input": {"shape": [2, 3, 32, 32]}},
        summary="ViT patches: Conv2d(kernel = stride = P) → (N, num_patches, D), also as unfold + linear",
    ),
]
