"""ViT patch embedding: cut an image into P×P patches and project each one to D numbers.

Two forms of the same linear map, both here so their equality can be checked:

* conv: a ``Conv2d`` with ``kernel_size = stride = P`` (what ViT/timm run), then
  ``flatten(2).transpose(1, 2)`` to get one row per patch;
* unfold + linear: ``F.unfold`` gives each patch as a column of ``C·P·P`` values, and a
  ``Linear`` with the conv weight reshaped to ``(D, C·P·P)`` projects it. ``unfold`` orders a
  patch channel-major (``c, row, col``), exactly like ``weight[d].flatten()``, so the reshape is
  all it takes.

Patches never overlap and never pad: when ``H`` or ``W`` is not a multiple of ``P`` the last
``H mod P`` rows / ``W mod P`` columns are silently dropped by both torch forms. This layer warns
(or raises, with ``strict=True``).

Legend for the shape comments:
    N batch · C channels · H, W image size · P = (ph, pw) patch size · D embed_dim ·
    H' = H // ph, W' = W // pw patches per column/row · L = H'·W' number of patches
"""

from __future__ import annotations

import warnings
from typing import Dict, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._checks import (
    checking,
    IntOrTuple, check_channels, check_matches, check_rank, check_type, layer_error, ntuple,
)
from layerlab.layers.conv import Conv2d

__all__ = ["PatchEmbedding"]


class PatchEmbedding(nn.Module):
    r"""Splits ``(N, C, H, W)`` into non-overlapping patches and embeds each: ``(N, L, D)``.

    Equal to ``nn.Conv2d(C, D, kernel_size=P, stride=P)`` followed by ``flatten(2).transpose(1, 2)``
    (see :meth:`to_torch`), and to :meth:`forward_unfold` (unfold + linear) with the same weights.

    Args:
        patch_size (int or tuple): Patch size ``P`` or ``(ph, pw)``. Default: 16
        in_channels (int): Image channels ``C``. Default: 3
        embed_dim (int): Embedding size ``D``. Default: 768
        bias (bool, optional): If ``True``, the projection has a bias. Default: ``True``
        flatten (bool, optional): If ``True``, return ``(N, L, D)``; else the conv map
            ``(N, D, H', W')``. Default: ``True``
        strict (bool, optional): If ``True``, an image size that is not a multiple of the patch
            size raises a ``ValueError``; else it warns that rows/columns are dropped. Under
            ``torch.compile`` the warning is skipped (dynamo cannot capture ``warnings.warn`` in a
            full graph); ``strict`` still raises. Default: ``False``

    Attributes:
        proj (Conv2d): weight ``(D, C, ph, pw)`` from ``U(−1/√(C·ph·pw), 1/√(C·ph·pw))`` and bias
            ``(D,)`` from the same distribution (torch's Conv2d init).

    Shape:
        - Input: ``(N, C, H, W)`` or ``(C, H, W)``
        - Output: ``(N, L, D)`` or ``(L, D)`` (``flatten=True``), else ``(N, D, H', W')``, where

          ``H' = ⌊H / ph⌋``, ``W' = ⌊W / pw⌋``, ``L = H'·W'``

          where the last ``H − H'·ph`` rows and ``W − W'·pw`` columns are read by no patch.

    Example::

        >>> embed = PatchEmbedding(16, 3, 768)
        >>> embed(torch.randn(2, 3, 224, 224)).shape        # 14·14 = 196 patches
        torch.Size([2, 196, 768])
    """

    def __init__(self, patch_size: IntOrTuple = 16, in_channels: int = 3, embed_dim: int = 768,
                 bias: bool = True, flatten: bool = True, strict: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        self.patch_size = ntuple("PatchEmbedding", "patch_size", patch_size, 2)
        self.flatten = bool(flatten)
        self.strict = bool(strict)
        self.proj = Conv2d(in_channels, embed_dim, self.patch_size, stride=self.patch_size, bias=bias,
                           device=device, dtype=dtype)

    @property
    def in_channels(self) -> int:
        return self.proj.in_channels

    @property
    def embed_dim(self) -> int:
        return self.proj.out_channels

    def grid(self, height: int, width: int) -> Tuple[int, int]:
        """Patches per column and row, ``(H', W')``, for an ``H×W`` image."""
        return height // self.patch_size[0], width // self.patch_size[1]

    def _check(self, x: Tensor) -> None:
        shape, w = x.shape, self.proj.weight
        if len(shape) not in (3, 4) or shape[-3] != self.in_channels or x.dtype != w.dtype or x.device != w.device:
            check_rank("PatchEmbedding", x, 2)
            check_channels("PatchEmbedding", x, 2, self.in_channels)
            check_matches("PatchEmbedding", x, w)
        (H, W), (ph, pw) = shape[-2:], self.patch_size
        if H < ph or W < pw:
            raise layer_error("PatchEmbedding", "input", expected=f"an image of at least one patch {ph}×{pw}",
                              got=f"{H}×{W}", hint="use a larger image or a smaller patch_size")
        if H % ph or W % pw:
            fit = f"{H - H % ph}×{W - W % pw} or {-(-H // ph) * ph}×{-(-W // pw) * pw}"
            if self.strict:
                raise layer_error("PatchEmbedding", "input", expected=f"H, W multiples of patch_size={self.patch_size}",
                                  got=f"{H}×{W}", hint=f"resize, crop or pad the image to {fit}")
            if not torch.compiler.is_compiling():  # warnings.warn would break a fullgraph capture
                warnings.warn(
                    f"PatchEmbedding: a {H}×{W} image is not a multiple of patch_size={self.patch_size}: the last "
                    f"{H % ph} row(s) and {W % pw} column(s) are dropped → resize/pad to {fit}, or pass strict=True",
                    stacklevel=3)

    def forward(self, input: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # the script compiler skips this branch
            if checking():
                self._check(input)
        x = self.proj._conv_forward(input)  # (N, D, H', W'): one conv window per patch (input checked above)
        if not self.flatten:
            return x
        return x.flatten(-2).transpose(-2, -1)  # (N, L, D), patches in row-major order

    def patches(self, input: Tensor) -> Tensor:
        """Every patch flattened: ``(N, L, C·ph·pw)``, values ordered ``(c, row, col)``."""
        self._check(input)
        cols = F.unfold(input if input.dim() == 4 else input.unsqueeze(0), self.patch_size,
                        stride=self.patch_size)  # (N, C·ph·pw, L)
        cols = cols.transpose(1, 2)  # (N, L, C·ph·pw)
        return cols if input.dim() == 4 else cols.squeeze(0)

    def forward_unfold(self, input: Tensor) -> Tensor:
        """The same map as :meth:`forward`, as unfold + linear with the conv weight reshaped."""
        weight = self.proj.weight.flatten(1)  # (D, C, ph, pw) → (D, C·ph·pw), same (c, row, col) order
        out = F.linear(self.patches(input), weight, self.proj.bias)  # (N, L, D)
        if self.flatten:
            return out
        return out.transpose(-2, -1).unflatten(-1, self.grid(*input.shape[-2:]))  # (N, D, H', W')

    @classmethod
    def from_torch(cls, module: nn.Module, flatten: bool = True, strict: bool = False) -> "PatchEmbedding":
        """Build from an ``nn.Conv2d`` with ``kernel_size == stride`` (or a module whose ``proj`` is one)."""
        conv = module.proj if isinstance(getattr(module, "proj", None), nn.Conv2d) else module
        check_type(cls.__name__, conv, nn.Conv2d)
        if (conv.kernel_size != conv.stride or conv.padding not in ((0, 0), "valid") or conv.dilation != (1, 1)
                or conv.groups != 1):
            raise layer_error(cls.__name__, "module", expected="Conv2d with kernel_size == stride, padding 0, "
                              "dilation 1, groups 1", got=repr(conv))
        layer = cls(conv.kernel_size, conv.in_channels, conv.out_channels, bias=conv.bias is not None,
                    flatten=flatten, strict=strict, device=conv.weight.device, dtype=conv.weight.dtype)
        layer.proj = Conv2d.from_torch(conv)
        return layer.train(module.training)

    def to_torch(self) -> nn.Conv2d:
        """The projection as ``nn.Conv2d`` (its output, ``flatten(2).transpose(1, 2)``, is this layer's)."""
        return self.proj.to_torch()

    def layerlab_shape_op(self) -> Tuple[str, Dict]:
        """The explain-shape op and its parameters (torch names) that predict this layer's output size."""
        ph, pw = self.patch_size
        return "patch_embed", {"patch_size": ph if ph == pw else (ph, pw), "in_channels": self.in_channels,
                               "embed_dim": self.embed_dim, "flatten": self.flatten}

    def extra_repr(self) -> str:
        s = f"patch_size={self.patch_size}"
        if not self.flatten:
            s += ", flatten=False"
        if self.strict:
            s += ", strict=True"
        return s
