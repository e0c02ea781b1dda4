"""Depthwise-separable Conv2d: a per-channel spatial conv, then a 1×1 conv that mixes channels.

A full ``k×k`` convolution mixes space and channels at once with ``C_out·C_in·k²`` weights. The
separable form (MobileNet, Xception) does the two jobs one after the other:

* depthwise: ``groups = C_in``, each input channel gets its own ``m`` filters of size ``k×k``
  (``m`` = ``depth_multiplier``) → ``C_in·m·k²`` weights;
* pointwise: a ``1×1`` conv from ``C_in·m`` to ``C_out`` channels → ``C_in·m·C_out`` weights.

Its torch reference is the same pair of ``torch.nn.Conv2d`` in an ``nn.Sequential``.

Legend for the shape comments: N batch · C_in, C_out channels · m depth multiplier ·
H, W input size · H_out, W_out output size.
"""

from __future__ import annotations

from typing import Dict, Tuple, Union

from torch import Tensor, nn

from layerlab.layers._checks import IntOrTuple, check_type, layer_error, positive_int
from layerlab.layers.conv import Conv2d

__all__ = ["SeparableConv2d"]


class SeparableConv2d(nn.Module):
    r"""Depthwise ``k×k`` conv (``groups=C_in``) followed by a pointwise ``1×1`` conv.

    Equal to ``nn.Sequential(nn.Conv2d(C_in, C_in·m, k, stride, padding, dilation, groups=C_in),
    nn.Conv2d(C_in·m, C_out, 1))`` with the same weights (see :meth:`to_torch`).

    Args:
        in_channels (int): Number of input channels ``C_in``.
        out_channels (int): Number of output channels ``C_out``.
        kernel_size (int or tuple): Depthwise kernel size ``k``.
        stride (int or tuple, optional): Depthwise stride. Default: 1
        padding (int, tuple or str, optional): Depthwise padding, as :class:`Conv2d`
            (``'same'`` and ``'valid'`` included). Default: 0
        dilation (int or tuple, optional): Depthwise dilation. Default: 1
        depth_multiplier (int, optional): Filters per input channel ``m``. Default: 1
        bias (bool, optional): If ``True``, the pointwise conv has a bias. Default: ``True``
        depthwise_bias (bool, optional): If ``True``, the depthwise conv has a bias too. It is off
            by default because a bias before a linear 1×1 conv only adds a constant that the
            pointwise bias can absorb. Default: ``False``
        padding_mode (str, optional): Depthwise padding mode, as :class:`Conv2d`. Default: ``'zeros'``

    Attributes:
        depthwise (Conv2d): weight ``(C_in·m, 1, kh, kw)``, from ``U(−1/√(kh·kw), 1/√(kh·kw))``.
        pointwise (Conv2d): weight ``(C_out, C_in·m, 1, 1)``, from ``U(−1/√(C_in·m), 1/√(C_in·m))``;
            bias ``(C_out,)`` from the same distribution.

    Shape:
        - Input: ``(N, C_in, H, W)`` or ``(C_in, H, W)``
        - Output: ``(N, C_out, H_out, W_out)`` or ``(C_out, H_out, W_out)``, where

          ``H_out = ⌊(H + p_top + p_bottom − d_H·(kh − 1) − 1) / s_H⌋ + 1`` (W likewise)

          where ``p_top``, ``p_bottom`` are the depthwise pads (see :class:`Conv2d`); the pointwise
          conv keeps the size.

    Example::

        >>> sep = SeparableConv2d(32, 64, 3, padding=1)      # 32·9 + 32·64 + 64 = 2400 parameters
        >>> sep(torch.randn(1, 32, 28, 28)).shape           # a full Conv2d would need 18496
        torch.Size([1, 64, 28, 28])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOrTuple,
        stride: IntOrTuple = 1,
        padding: Union[str, IntOrTuple] = 0,
        dilation: IntOrTuple = 1,
        depth_multiplier: int = 1,
        bias: bool = True,
        depthwise_bias: bool = False,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        positive_int(name, "in_channels", in_channels)
        self.depth_multiplier = positive_int(name, "depth_multiplier", depth_multiplier)
        mid = in_channels * depth_multiplier
        factory = {"device": device, "dtype": dtype}
        self.depthwise = Conv2d(in_channels, mid, kernel_size, stride, padding, dilation, groups=in_channels,
                                bias=depthwise_bias, padding_mode=padding_mode, **factory)
        self.pointwise = Conv2d(mid, out_channels, 1, bias=bias, **factory)

    @property
    def in_channels(self) -> int:
        return self.depthwise.in_channels

    @property
    def out_channels(self) -> int:
        return self.pointwise.out_channels

    def forward(self, input: Tensor) -> Tensor:
        x = self.depthwise(input)  # (N, C_in·m, H_out, W_out): each channel filtered on its own
        # the depthwise output always fits the pointwise conv, so its input check is skipped
        return self.pointwise._conv_forward(x)  # (N, C_out, H_out, W_out): channels mixed pixel by pixel

    @classmethod
    def from_torch(cls, module: nn.Module) -> "SeparableConv2d":
        """Build from ``nn.Sequential(depthwise nn.Conv2d, pointwise 1×1 nn.Conv2d)``, copying weights."""
        name = cls.__name__
        check_type(name, module, nn.Sequential)
        if len(module) != 2:
            raise layer_error(name, "module", expected="nn.Sequential of 2 Conv2d (depthwise, pointwise)",
                              got=f"{len(module)} modules")
        dw, pw = module[0], module[1]
        check_type(name, dw, nn.Conv2d)
        check_type(name, pw, nn.Conv2d)
        if dw.groups != dw.in_channels or dw.out_channels % dw.in_channels:
            raise layer_error(name, "module[0]", expected="a depthwise Conv2d (groups = in_channels)",
                              got=f"groups={dw.groups}, in_channels={dw.in_channels}")
        if pw.kernel_size != (1, 1) or pw.stride != (1, 1) or pw.padding not in ((0, 0), "valid") or pw.groups != 1:
            raise layer_error(name, "module[1]", expected="a 1×1 Conv2d (stride 1, padding 0, groups 1)",
                              got=f"kernel_size={pw.kernel_size}, stride={pw.stride}, padding={pw.padding}, "
                              f"groups={pw.groups}")
        layer = cls(
            dw.in_channels, pw.out_channels, dw.kernel_size, dw.stride, dw.padding, dw.dilation,
            depth_multiplier=dw.out_channels // dw.in_channels, bias=pw.bias is not None,
            depthwise_bias=dw.bias is not None, padding_mode=dw.padding_mode,
            device=dw.weight.device, dtype=dw.weight.dtype,
        )
        layer.depthwise = Conv2d.from_torch(dw)
        layer.pointwise = Conv2d.from_torch(pw)
        layer.train(module.training)
        return layer

    def to_torch(self) -> nn.Sequential:
        """The equivalent ``nn.Sequential(nn.Conv2d, nn.Conv2d)`` with a copy of the weights."""
        return nn.Sequential(self.depthwise.to_torch(), self.pointwise.to_torch())

    def layerlab_shape_op(self) -> Tuple[str, Dict]:
        """The output size is the depthwise conv's, with ``C_out`` channels."""
        op, params = self.depthwise.layerlab_shape_op()
        return op, {**params, "out_channels": self.out_channels, "groups": 1}

    def extra_repr(self) -> str:
        return "" if self.depth_multiplier == 1 else f"depth_multiplier={self.depth_multiplier}"
