"""Conv1d / Conv2d / Conv3d written out: torch's parameters, torch's init, padding computed here.

The layers hold ``weight`` and ``bias`` exactly as ``torch.nn.ConvNd`` does, so weights copy
both ways (:meth:`_ConvNd.from_torch`, :meth:`_ConvNd.to_torch`) and parity is one call. What
torch hides is spelled out: the initial distribution, and the padding. Every padding, including
``'same'`` with an even kernel (one more pixel at the end than at the start) and the
``reflect``/``replicate``/``circular`` modes, is computed in :meth:`_ConvNd._explicit_padding`
and applied with ``F.pad`` before a padding-free convolution, unless it is symmetric zero
padding, which the op applies itself without copying the input.

Legend for the shape comments:
    N batch · C_in, C_out channels · G groups · S the spatial sizes (L | H, W | D, H, W)
    k kernel · s stride · p padding · d dilation · E = d·(k − 1) + 1, the span of one window
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._checks import (
    IntOrTuple, check_channels, check_matches, check_rank, check_type, checking, copy_params, default_init,
    layer_error,
    ntuple, positive_int,
)

__all__ = ["Conv1d", "Conv2d", "Conv3d"]

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_DIM_NAMES = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


class _ConvNd(nn.Module):
    """Shared logic of :class:`Conv1d`, :class:`Conv2d` and :class:`Conv3d` (see their docs).

    ``forward`` is written in the subset TorchScript compiles (``torch.jit.script`` works): the
    dimensionality is an instance attribute ``_nd`` and the op is picked by it, the checks sit
    behind ``torch.jit.is_scripting()``, which the script compiler skips.
    """

    # set by each subclass (class attributes, not annotated: TorchScript would read the annotations
    # as the module's attribute types): _nd, the number of spatial dims; _torch_cls, the torch.nn class

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOrTuple,
        stride: IntOrTuple = 1,
        padding: Union[str, IntOrTuple] = 0,
        dilation: IntOrTuple = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        name, nd = type(self).__name__, self._nd
        self._nd = nd  # an instance attribute: TorchScript does not see class attributes
        self.in_channels = positive_int(name, "in_channels", in_channels)
        self.out_channels = positive_int(name, "out_channels", out_channels)
        self.groups = positive_int(name, "groups", groups)
        for arg, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if value % groups:
                divisors = [g for g in range(1, in_channels + 1) if in_channels % g == 0 and out_channels % g == 0]
                raise layer_error(name, "groups", expected=f"a divisor of {arg}={value}", got=groups,
                                  hint=f"use groups in {divisors}")
        self.kernel_size = ntuple(name, "kernel_size", kernel_size, nd)
        self.stride = ntuple(name, "stride", stride, nd)
        self.dilation = ntuple(name, "dilation", dilation, nd)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise layer_error(name, "padding", expected="'same', 'valid', an int or a tuple", got=repr(padding),
                                  hint="padding='same' keeps the size at stride 1")
            if padding == "same" and self.stride != (1,) * nd:
                raise layer_error(name, "padding", expected="stride=1 with padding='same'",
                                  got=f"stride={self.stride}",
                                  hint="compute the padding for the stride yourself, or use stride=1")
            self.padding: Union[str, Tuple[int, ...]] = padding
        else:
            self.padding = ntuple(name, "padding", padding, nd, minimum=0)
        if padding_mode not in PADDING_MODES:
            raise layer_error(name, "padding_mode", expected="one of " + ", ".join(map(repr, PADDING_MODES)),
                              got=repr(padding_mode))
        self.padding_mode = padding_mode
        self._pads = self._explicit_padding()  # ((left, right) per spatial dim, in tensor order)
        # Worked out once here, so forward only compares ints:
        # F.pad's argument lists pads from the last dim backwards: (W_left, W_right, H_left, H_right, …)
        self._pad_arg = tuple(v for left, right in reversed(self._pads) for v in (left, right))
        # symmetric zeros are left to the op, which pads on the fly without copying the input
        symmetric = padding_mode == "zeros" and all(left == right for left, right in self._pads)
        self._op_padding: Optional[Tuple[int, ...]] = tuple(left for left, _ in self._pads) if symmetric else None
        self._no_padding = (0,) * nd
        # the smallest input that still holds one window: span − left − right per dim
        self._min_size = tuple(d * (k - 1) + 1 - left - right
                               for k, d, (left, right) in zip(self.kernel_size, self.dilation, self._pads))

        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(  # (C_out, C_in/G, *k)
            (out_channels, in_channels // groups, *self.kernel_size), **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels, **factory))  # (C_out,)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's default init, written out (same RNG calls in the same order as ``nn.ConvNd``).

        ``kaiming_uniform_(weight, a=√5)`` draws from ``U(−b, b)`` with ``b = √3 · gain / √fan_in``
        and ``gain = √(2 / (1 + a²)) = √(1/3)``, so ``b = 1/√fan_in``, where
        ``fan_in = (C_in / groups) · ∏ kernel_size``. The bias uses the same bound.
        """
        default_init(self.weight, self.bias, self.weight.shape[1] * math.prod(self.kernel_size))

    def _explicit_padding(self) -> Tuple[Tuple[int, int], ...]:
        """``(left, right)`` zeros/reflect/… added to each spatial dim before the convolution."""
        if self.padding == "valid":
            return ((0, 0),) * self._nd
        if self.padding == "same":
            pads = []
            for k, d in zip(self.kernel_size, self.dilation):
                total = d * (k - 1)  # L_out = L + total − E + 1 = L exactly when total = E − 1
                left = total // 2
                pads.append((left, total - left))  # odd total (even k): the extra pixel goes at the end
            return tuple(pads)
        return tuple((p, p) for p in self.padding)

    def _check_input(self, x: Tensor) -> None:
        """Cheap int comparisons on the common path; the detailed checks only build the message."""
        nd, w = self._nd, self.weight
        shape = x.shape
        if (len(shape) - nd not in (1, 2) or shape[-nd - 1] != self.in_channels or x.dtype != w.dtype
                or x.device != w.device):
            name = type(self).__name__
            check_rank(name, x, nd)
            check_channels(name, x, nd, self.in_channels)
            check_matches(name, x, w)
        sizes = tuple(shape[-nd:])
        if self.padding_mode in ("reflect", "circular"):
            self._check_mode_padding(sizes)
        if any(size < least for size, least in zip(sizes, self._min_size)):
            padded = tuple(size + left + right for size, (left, right) in zip(sizes, self._pads))
            span = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation))
            raise layer_error(
                type(self).__name__, "input",
                expected=f"padded spatial size ≥ dilation·(kernel_size − 1) + 1 = {span}",
                got=f"spatial size {sizes}, padded to {padded}",
                hint="use a larger input, more padding, or a smaller kernel_size/dilation")

    def _check_mode_padding(self, sizes: Tuple[int, ...]) -> None:
        # F.pad's limits: reflect mirrors without repeating the edge, circular wraps at most once
        for dim, size, (left, right) in zip(_DIM_NAMES[self._nd], sizes, self._pads):
            if max(left, right) >= size + (self.padding_mode == "circular"):
                limit = "<" if self.padding_mode == "reflect" else "≤"
                raise layer_error(
                    type(self).__name__, "padding", expected=f"padding {limit} input size {dim}={size} with "
                    f"padding_mode={self.padding_mode!r}", got=f"padding ({left}, {right}) along {dim}",
                    hint="use a larger input, less padding, or padding_mode='replicate'")

    def forward(self, input: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # the script compiler skips this branch
            if checking():
                self._check_input(input)
        return self._conv_forward(input)

    def _conv_forward(self, input: Tensor) -> Tensor:
        """The convolution itself, for an input already checked (composite layers call it directly)."""
        x = input
        padding = self._op_padding
        if padding is None:
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            x = F.pad(input, self._pad_arg, mode=mode)  # (N, C_in, *(S + left + right))
            padding = self._no_padding
        return self._convolve(x, padding)  # (N, C_out, *S_out)

    def _convolve(self, x: Tensor, padding: List[int]) -> Tensor:
        if self._nd == 1:
            return F.conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)
        if self._nd == 2:
            return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)
        return F.conv3d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    # -- interop ---------------------------------------------------------------------------------

    def _config(self) -> Dict:
        return dict(
            in_channels=self.in_channels, out_channels=self.out_channels, kernel_size=self.kernel_size,
            stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
            padding_mode=self.padding_mode,
        )

    @classmethod
    def from_torch(cls, module: nn.Module) -> "_ConvNd":
        """A layer with ``module``'s configuration and a copy of its weights (same dtype, device)."""
        check_type(cls.__name__, module, cls._torch_cls)
        layer = cls(
            module.in_channels, module.out_channels, module.kernel_size, stride=module.stride,
            padding=module.padding, dilation=module.dilation, groups=module.groups,
            bias=module.bias is not None, padding_mode=module.padding_mode,
            device=module.weight.device, dtype=module.weight.dtype,
        )
        copy_params(layer, module, [(n, n) for n, _ in layer.named_parameters()])
        return layer

    def to_torch(self) -> nn.Module:
        """The ``torch.nn`` counterpart with a copy of this layer's weights."""
        module = self._torch_cls(**self._config(), bias=self.bias is not None,
                                 device=self.weight.device, dtype=self.weight.dtype)
        copy_params(module, self, [(n, n) for n, _ in module.named_parameters()])
        return module

    def layerlab_shape_op(self) -> Tuple[str, Dict]:
        """The explain-shape op and its parameters (torch names) that predict this layer's output size."""
        return f"conv{self._nd}d", self._config()

    def extra_repr(self) -> str:
        nd = self._nd
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * nd:
            s += f", padding={self.padding!r}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return s


_ARGS_DOC = """
    Args:
        in_channels (int): Number of channels in the input, ``C_in``.
        out_channels (int): Number of channels produced, ``C_out``.
        kernel_size (int or tuple): Size of the kernel ``k``.
        stride (int or tuple, optional): Step between windows ``s``. Default: 1
        padding (int, tuple or str, optional): Padding ``p`` added to both sides of each spatial
            dim, or ``'valid'`` (no padding) or ``'same'`` (output size = input size; stride must
            be 1; when ``d·(k − 1)`` is odd the extra pixel is added at the end). Default: 0
        dilation (int or tuple, optional): Spacing ``d`` between kernel elements. Default: 1
        groups (int, optional): Number of blocked connections from input to output channels; both
            channel counts must be divisible by it. Default: 1
        bias (bool, optional): If ``True``, adds a learnable bias. Default: ``True``
        padding_mode (str, optional): ``'zeros'``, ``'reflect'``, ``'replicate'`` or ``'circular'``.
            ``reflect`` needs padding < input size, ``circular`` padding ≤ input size. Default: ``'zeros'``

    Attributes:
        weight (Tensor): ``(C_out, C_in / groups, *kernel_size)``, initialised from
            ``U(−1/√fan_in, 1/√fan_in)`` with ``fan_in = (C_in / groups) · ∏ kernel_size``
            (torch's ``kaiming_uniform_(a=√5)``, written out in :meth:`reset_parameters`).
        bias (Tensor or None): ``(C_out,)``, from ``U(−1/√fan_in, 1/√fan_in)``.

    Shape:
        - Input: ``(N, C_in, {s})`` or unbatched ``(C_in, {s})``
        - Output: ``(N, C_out, {so})`` or ``(C_out, {so})``, where for each spatial dim

          ``L_out = ⌊(L + p_left + p_right − d·(k − 1) − 1) / s⌋ + 1``

          where:
              ``L`` is that dim's input size ({s}), ``p_left = p_right = p`` for an int/tuple padding,
              ``'valid'`` gives 0 and ``'same'`` gives ``p_left = ⌊d·(k − 1)/2⌋``,
              ``p_right = d·(k − 1) − p_left``. The padded size must be ≥ ``d·(k − 1) + 1``.
"""


class Conv1d(_ConvNd):
    _nd, _torch_cls = 1, nn.Conv1d
    __doc__ = ("""Applies a 1-D convolution over ``(N, C_in, L)``, equal to :class:`torch.nn.Conv1d`.

    ``out[n, j, t] = bias[j] + Σ_{c in group(j)} Σ_i weight[j, c, i] · x_pad[n, c, t·s + i·d]``
""" + _ARGS_DOC.format(s="L", so="L_out") + """
    Example::

        >>> conv = Conv1d(16, 33, 3, stride=2)
        >>> conv(torch.randn(20, 16, 50)).shape
        torch.Size([20, 33, 24])
""")


class Conv2d(_ConvNd):
    _nd, _torch_cls = 2, nn.Conv2d
    __doc__ = ("""Applies a 2-D convolution over ``(N, C_in, H, W)``, equal to :class:`torch.nn.Conv2d`.

    ``out[n, j, y, x] = bias[j] + Σ_{c in group(j)} Σ_{u,v} weight[j, c, u, v]
    · x_pad[n, c, y·s_H + u·d_H, x·s_W + v·d_W]``
""" + _ARGS_DOC.format(s="H, W", so="H_out, W_out") + """
    Example::

        >>> conv = Conv2d(3, 16, 4, padding="same")     # even kernel: 1 pixel before, 2 after
        >>> conv(torch.randn(2, 3, 32, 32)).shape
        torch.Size([2, 16, 32, 32])
""")


class Conv3d(_ConvNd):
    _nd, _torch_cls = 3, nn.Conv3d
    __doc__ = ("""Applies a 3-D convolution over ``(N, C_in, D, H, W)``, equal to :class:`torch.nn.Conv3d`.
""" + _ARGS_DOC.format(s="D, H, W", so="D_out, H_out, W_out") + """
    Example::

        >>> conv = Conv3d(4, 8, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2))
        >>> conv(torch.randn(2, 4, 8, 16, 16)).shape
        torch.Size([2, 8, 8, 8, 8])
""")

