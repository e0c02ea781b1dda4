"""torch.jit.script compiles the conv family and Linear, and the scripted module equals eager."""

from __future__ import annotations

import pytest
import torch

from layerlab.layers import Conv1d, Conv2d, Conv3d, Linear
from layerlab.layers.im2col import Im2colConv2d
from layerlab.layers.patch import PatchEmbedding
from layerlab.layers.separable import SeparableConv2d


@pytest.mark.parametrize("make, shape", [
    (lambda: Conv2d(3, 4, 4, padding="same"), (2, 3, 9, 9)),  # even kernel: asymmetric pads, F.pad path
    (lambda: Conv2d(3, 4, 3, padding=2, padding_mode="reflect", bias=False), (2, 3, 9, 9)),
    (lambda: Conv1d(3, 6, 2, padding="same", groups=3, padding_mode="circular"), (2, 3, 9)),
    (lambda: Conv3d(3, 4, 3, stride=2, dilation=2, padding=1), (2, 3, 9, 9, 9)),
    (lambda: Conv2d(3, 4, 3), (3, 9, 9)),  # unbatched
    (lambda: Im2colConv2d(4, 6, 3, padding=1, groups=2), (2, 4, 7, 7)),
    (lambda: SeparableConv2d(4, 8, 3, padding=1), (2, 4, 7, 7)),
    (lambda: PatchEmbedding(4, 3, 16), (2, 3, 16, 16)),
    (lambda: Linear(5, 3), (2, 7, 5)),
])
def test_scripted_equals_eager(make, shape):
    torch.manual_seed(0)
    layer = make()
    scripted = torch.jit.script(layer)
    x = torch.randn(*shape)
    torch.testing.assert_close(scripted(x), layer(x), rtol=0, atol=0)


def test_eager_keeps_its_readable_errors_after_scripting():
    layer = Conv2d(3, 4, 3)
    torch.jit.script(layer)
    with pytest.raises(ValueError, match="Conv2d: input: expected 3 channels"):
        layer(torch.randn(1, 5, 8, 8))
