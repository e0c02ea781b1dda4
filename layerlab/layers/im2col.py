"""Conv2d as im2col: cut the input into patches (``F.unfold``), then one matrix product.

This is the textbook form of a convolution, and the form most CPU/GPU kernels reduce to: every
output pixel is a dot product between one flattened input patch and one flattened filter. The
layer keeps the patch matrix so it can be looked at (:meth:`Im2colConv2d.patches` for any input,
``last_patches`` after a forward).

Legend for the shape comments:
    N batch · C_in, C_out channels · G groups · K = (C_in / G)·kh·kw values per patch and group
    kh, kw kernel · H_out, W_out output size · P = H_out·W_out patches (output pixels)
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from layerlab.layers._checks import checking
from layerlab.layers.conv import Conv2d

__all__ = ["Im2colConv2d"]


class Im2colConv2d(Conv2d):
    r"""A 2-D convolution computed as ``weight_matrix @ patch_matrix``; equal to :class:`torch.nn.Conv2d`.

    Same arguments, parameters, initialisation, padding rules and checks as
    :class:`layerlab.layers.conv.Conv2d` (including ``'same'`` with even kernels and every
    ``padding_mode``); only the computation differs. Per group ``g``::

        patches = unfold(x_pad)                                 # (N, C_in·kh·kw, P)
        out[:, g] = weight[g].reshape(C_out/G, K) @ patches[:, g·K:(g+1)·K]   # (N, C_out/G, P)

    ``unfold`` orders a patch's values channel-major (``c, u, v``), exactly like
    ``weight[j].flatten()``, so the weight needs no permutation, and the channels of group ``g``
    are the contiguous rows ``g·K … (g+1)·K − 1`` of the patch matrix. Hence groups are supported.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
        padding_mode: as :class:`layerlab.layers.conv.Conv2d`.
        keep_patches (bool, optional): If ``True``, each forward stores its patch matrix in
            ``last_patches``. It is the very tensor the product used (not detached), so when the
            input requires grad, ``torch.autograd.grad(out.sum(), layer.last_patches)`` gives the
            gradient per patch;
            it costs no extra memory while autograd keeps it for the weight gradient, but keeps it
            alive after that. ``torch.compile`` replays the attribute write; a ``torch.jit.trace``
            does not (a trace records tensor ops only), so a traced layer leaves ``last_patches``
            as it was at tracing time. Default: ``True``

    Attributes:
        weight (Tensor): ``(C_out, C_in / groups, kh, kw)``, from ``U(−1/√fan_in, 1/√fan_in)``,
            ``fan_in = (C_in / groups)·kh·kw``.
        bias (Tensor or None): ``(C_out,)``, from ``U(−1/√fan_in, 1/√fan_in)``.
        last_patches (Tensor or None): ``(N, C_in·kh·kw, P)`` from the last forward (batched form
            even for an unbatched input), or ``None``.

    Shape:
        - Input: ``(N, C_in, H, W)`` or ``(C_in, H, W)``
        - Patches: ``(N, C_in·kh·kw, P)`` with ``P = H_out·W_out``
        - Output: ``(N, C_out, H_out, W_out)`` or ``(C_out, H_out, W_out)``, with

          ``H_out = ⌊(H + p_top + p_bottom − d_H·(kh − 1) − 1) / s_H⌋ + 1`` (W likewise)

          where ``p_top``/``p_bottom`` are the explicit pads of :class:`Conv2d` (equal for an
          int padding; for ``'same'`` the extra pixel of an odd total is at the bottom/right).

    Example::

        >>> conv = Im2colConv2d(3, 8, 3, padding=1)
        >>> conv.patches(torch.randn(2, 3, 5, 5)).shape   # 27 values per patch, 25 patches
        torch.Size([2, 27, 25])
    """

    # the attribute's type, so torch.jit.script accepts the first write; a real object, not the
    # string ``from __future__ import annotations`` would make of an annotation, which it cannot read
    __annotations__ = {"last_patches": Optional[Tensor]}

    def __init__(self, *args, keep_patches: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keep_patches = keep_patches
        self.last_patches: Optional[Tensor] = None

    def _padded(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # the script compiler skips this branch
            if checking():
                self._check_input(x)
        if x.dim() == 3:
            x = x.unsqueeze(0)  # unbatched (C, H, W) → (1, C, H, W)
        mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
        return F.pad(x, self._pad_arg, mode=mode)  # (N, C_in, H + p_top + p_bottom, W + p_left + p_right)

    def _unfold(self, x_pad: Tensor) -> Tensor:
        return F.unfold(x_pad, self.kernel_size, dilation=self.dilation, stride=self.stride)  # (N, C_in·kh·kw, P)

    def patches(self, input: Tensor) -> Tensor:
        """The patch matrix ``(N, C_in·kh·kw, P)``: column ``q`` is the flattened window of output pixel ``q``."""
        return self._unfold(self._padded(input))

    def forward(self, input: Tensor) -> Tensor:
        x = self._padded(input)  # (N, C_in, H_pad, W_pad)
        cols = self._unfold(x)  # (N, C_in·kh·kw, P)
        if self.keep_patches:
            self.last_patches = cols
        N, _, P = cols.shape
        G, C_out = self.groups, self.out_channels
        H_out = (x.shape[-2] - self.dilation[0] * (self.kernel_size[0] - 1) - 1) // self.stride[0] + 1
        W_out = (x.shape[-1] - self.dilation[1] * (self.kernel_size[1] - 1) - 1) // self.stride[1] + 1
        w = self.weight.reshape(G, C_out // G, -1)  # (G, C_out/G, K)
        out = w @ cols.reshape(N, G, -1, P)  # (G, C_out/G, K) @ (N, G, K, P) → (N, G, C_out/G, P)
        out = out.reshape(N, C_out, P)  # (N, C_out, P)
        if self.bias is not None:
            out = out + self.bias[:, None]  # bias per output channel, broadcast over patches
        out = out.reshape(N, C_out, H_out, W_out)  # (N, C_out, H_out, W_out)
        return out if input.dim() == 4 else out.squeeze(0)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.keep_patches else ", keep_patches=False")
