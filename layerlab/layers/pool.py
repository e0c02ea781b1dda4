"""MaxPool1d/2d and AvgPool1d/2d with the window arithmetic written out.

torch's pooling kernels hide three rules that decide the output: the output size (floor or ceil
mode, and the ceil-mode rule that drops a last window starting in the right padding), which
pixels a window covers, and what an average divides by. Here each rule is a few lines of Python:

1. :func:`pool_output_size` computes ``L_out``.
2. ``_windows`` pads the input (−inf for max, 0 for avg) to exactly the span the ``L_out``
   windows need, cuts every window out with ``Tensor.unfold`` and flattens it into the last dim.
3. max is ``windows.max(-1)`` (first maximum wins, as in torch, so gradients of ties match);
   avg is ``windows.sum(-1) / divisor`` with the divisor from :func:`avg_pool_counts`.

``torch.compile(fullgraph=True)`` captures these layers whole (it guards on the input size and
recompiles for a new one). A ``torch.jit.trace`` made at one size holds at others: under tracing
the sizes are traced values, and everything computed from them (output sizes, the ceil-mode drop,
pads, divisors) is arithmetic or tensor ops on them, never a Python ``if`` or ``torch.tensor`` of
them, so nothing is frozen at the traced size. ``torch.jit.script`` does not compile them.

Legend for the shape comments:
    N batch · C channels · S spatial sizes (L | H, W) · S_out output sizes · K elements per window
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._checks import (
    IntOrTuple, check_floating, check_rank, check_type, checking, layer_error, ntuple,
)

__all__ = ["MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "pool_output_size", "avg_pool_counts"]

_DIM_NAMES = {1: ("L",), 2: ("H", "W")}


def pool_output_size(size: int, kernel_size: int, stride: int, padding: int = 0, dilation: int = 1,
                     ceil_mode: bool = False) -> int:
    """Number of windows along one dim, as ATen's ``pooling_output_shape``.

    ``L_out = ⌊(L + 2p − E) / s⌋ + 1`` (or ``⌈…⌉`` in ceil mode) with ``E = d·(k − 1) + 1``; in
    ceil mode the last window is dropped when it would start at or after ``L + p`` (inside the
    right padding), so every window starts on a real pixel or in the left padding.
    """
    span = dilation * (kernel_size - 1) + 1
    out = (size + 2 * padding - span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode:
        # Drop the last window when a = (out − 1)·s − (L + p) ≥ 0, written without an ``if``: under
        # torch.jit.trace ``size`` is a traced 0-dim tensor and a Python branch would freeze the
        # traced size's answer. From the ceil above, p − E ≤ a ≤ p − E + s − 1, so with
        # M = E + s + p, a + M lies in [0, 2M): (a + M) // M is 1 exactly when a ≥ 0.
        bound = span + stride + padding
        out = out - ((out - 1) * stride - size - padding + bound) // bound
    return out


def avg_pool_counts(size: int, kernel_size: int, stride: int, padding: int, out: int,
                    count_include_pad: bool) -> List[int]:
    """Per output index, how many elements an average along one dim divides by.

    Window ``i`` covers ``[i·s − p, i·s − p + k)``, clipped to the padded axis ``[−p, L + p)``
    (a ceil-mode window may run past it). With ``count_include_pad`` the padding counts, else
    only real pixels ``[0, L)``. A 2-D window's divisor is the product of its two 1-D counts.
    """
    counts = []
    for i in range(out):
        start = i * stride - padding
        end = min(start + kernel_size, size + padding)
        counts.append(end - start if count_include_pad else min(end, size) - max(start, 0))
    return counts


class _PoolNd(nn.Module):
    _nd: int
    _torch_cls: type
    _op: str

    def __init__(self, kernel_size: IntOrTuple, stride: Optional[IntOrTuple], padding: IntOrTuple,
                 dilation: IntOrTuple, ceil_mode: bool) -> None:
        super().__init__()
        name, nd = type(self).__name__, self._nd
        self.kernel_size = ntuple(name, "kernel_size", kernel_size, nd, broadcast_one=True)
        # torch: stride=None (or an empty tuple) means stride = kernel_size, non-overlapping windows
        no_stride = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
        self.stride = self.kernel_size if no_stride else ntuple(name, "stride", stride, nd, broadcast_one=True)
        self.padding = ntuple(name, "padding", padding, nd, minimum=0, broadcast_one=True)
        self.dilation = ntuple(name, "dilation", dilation, nd, broadcast_one=True)
        self.ceil_mode = bool(ceil_mode)
        for dim, k, p in zip(_DIM_NAMES[nd], self.kernel_size, self.padding):
            if p > k // 2:  # torch checks the raw kernel, whatever the dilation
                raise layer_error(name, "padding", expected=f"padding ≤ kernel_size // 2 = {k // 2} along {dim}",
                                  got=p, hint=f"use padding ≤ {k // 2} or a larger kernel_size")

    def _output_size(self, x: Tensor) -> Tuple[int, ...]:
        name, nd = type(self).__name__, self._nd
        if checking():
            check_rank(name, x, nd)
            check_floating(name, x)
        sizes = tuple(x.shape[-nd:])
        outs = tuple(pool_output_size(*a, self.ceil_mode) for a in
                     zip(sizes, self.kernel_size, self.stride, self.padding, self.dilation))
        if checking():
            self._check_windows(sizes, outs)
        return outs

    def _check_windows(self, sizes: Tuple[int, ...], outs: Tuple[int, ...]) -> None:
        name, nd = type(self).__name__, self._nd
        if any(o < 1 for o in outs):
            raise layer_error(name, "input", expected="at least one window along every spatial dim",
                              got=f"input size {sizes} → output size {outs}",
                              hint="use a larger input, a smaller kernel_size, more padding or ceil_mode=True")
        # Without dilation every window holds a real pixel (p ≤ k // 2 and the ceil-mode drop rule
        # see to that). With it, the taps can jump over a small input: torch then returns −inf and
        # sends that window's gradient to a wrong index, so refuse instead.
        for dim, size, out, k, s, p, d in zip(_DIM_NAMES[nd], sizes, outs, self.kernel_size, self.stride,
                                              self.padding, self.dilation):
            for j in range(out if d > 1 else 0):
                taps = [j * s - p + t * d for t in range(k)]
                if not any(0 <= t < size for t in taps):
                    raise layer_error(
                        name, "input", expected="every window to read at least one input pixel",
                        got=f"window {j} along {dim} reads only padding (taps {taps}, input size {size})",
                        hint="use a larger input, less padding or a smaller dilation")

    def _windows(self, x: Tensor, outs: Sequence[int], pad_value: float) -> Tensor:
        """Every window, flattened into the last dim: ``(N, C, *S_out, K)``."""
        nd = self._nd
        sizes = x.shape[-nd:]
        pads = []
        for size, out, k, s, p, d in zip(sizes, outs, self.kernel_size, self.stride, self.padding, self.dilation):
            # The last window ends at (out − 1)·s + E on the padded axis. Pad the right side to
            # exactly that: more than p in ceil mode, less (a negative pad crops) when the floor
            # leaves trailing pixels that no window reads.
            right = (out - 1) * s + d * (k - 1) + 1 - size - p
            pads.append((p, right))
        pad = tuple(v for left, right in reversed(pads) for v in (left, right))  # F.pad: last dim first
        x = F.pad(x, pad, value=pad_value)  # (N, C, *S_pad) with S_pad = (S_out − 1)·s + E
        first = x.dim() - nd
        for i, (k, s, d) in enumerate(zip(self.kernel_size, self.stride, self.dilation)):
            x = x.unfold(first + i, d * (k - 1) + 1, s)  # appends the window span as a new last dim
        # (N, C, *S_out, *E): keep every d-th element of each span, the dilated kernel taps
        x = x[(Ellipsis, *(slice(None, None, d) for d in self.dilation))]  # (N, C, *S_out, *k)
        return x.flatten(-nd)  # (N, C, *S_out, K) with K = ∏k

    def _config(self) -> Dict:
        raise NotImplementedError

    @classmethod
    def from_torch(cls, module: nn.Module) -> "_PoolNd":
        """A layer with ``module``'s configuration (pooling has no weights)."""
        check_type(cls.__name__, module, cls._torch_cls)
        layer = cls(**{k: getattr(module, k) for k in cls._torch_args})
        return layer.train(module.training)

    def to_torch(self) -> nn.Module:
        """The ``torch.nn`` counterpart with the same configuration."""
        return self._torch_cls(**self._config())

    def layerlab_shape_op(self) -> Tuple[str, Dict]:
        """The explain-shape op and its parameters (torch names) that predict this layer's output size."""
        return self._op, self._config()

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self._config().items())


class _MaxPoolNd(_PoolNd):
    _torch_args = ("kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")

    def __init__(self, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None, padding: IntOrTuple = 0,
                 dilation: IntOrTuple = 1, return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode)
        self.return_indices = bool(return_indices)

    def _config(self) -> Dict:
        return dict(kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                    dilation=self.dilation, return_indices=self.return_indices, ceil_mode=self.ceil_mode)

    def forward(self, input: Tensor):
        outs = self._output_size(input)
        windows = self._windows(input, outs, float("-inf"))  # (N, C, *S_out, K); padding never wins
        values, arg = windows.max(dim=-1)  # (N, C, *S_out); ties: the first maximum, as torch
        if not self.return_indices:
            return values
        return values, self._input_index(arg, tuple(input.shape[-self._nd:]), outs)

    def _input_index(self, arg: Tensor, sizes: Tuple[int, ...], outs: Tuple[int, ...]) -> Tensor:
        """Window-local argmax → flat index into the input's spatial dims (torch's ``indices``)."""
        nd = self._nd
        index = torch.zeros_like(arg)
        rest = arg
        for i in reversed(range(nd)):  # arg = Σ tap_i · ∏_{j>i} k_j, row-major over the kernel
            k, s, p, d = self.kernel_size[i], self.stride[i], self.padding[i], self.dilation[i]
            tap, rest = rest % k, rest // k
            start = torch.arange(outs[i], device=arg.device).reshape(-1, *([1] * (nd - 1 - i))) * s - p
            index = index + (start + tap * d) * math.prod(sizes[i + 1:])  # position along dim i
        return index


class _AvgPoolNd(_PoolNd):
    _torch_args = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")

    def __init__(self, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None, padding: IntOrTuple = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: Optional[int] = None) -> None:
        super().__init__(kernel_size, stride, padding, 1, ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        if divisor_override is not None and (not isinstance(divisor_override, int) or divisor_override == 0):
            raise layer_error(type(self).__name__, "divisor_override", expected="None or a non-zero int",
                              got=repr(divisor_override), hint="use None to divide by the window size")
        self.divisor_override = divisor_override

    def _config(self) -> Dict:
        return dict(kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                    ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad)

    def forward(self, input: Tensor) -> Tensor:
        outs = self._output_size(input)
        total = self._windows(input, outs, 0.0).sum(dim=-1)  # (N, C, *S_out); zero padding adds nothing
        if self.divisor_override is not None:
            return total / self.divisor_override
        divisor = torch.ones((), dtype=total.dtype, device=total.device)
        for i, (size, out) in enumerate(zip(input.shape[-self._nd:], outs)):
            counts = self._counts(size, out, i, total)
            shape = (-1, *([1] * (self._nd - 1 - i)))  # broadcast along output dim i
            divisor = divisor * counts.reshape(shape)
        return total / divisor  # (N, C, *S_out)

    def _counts(self, size: int, out: int, i: int, like: Tensor) -> Tensor:
        """:func:`avg_pool_counts` along dim ``i`` as tensor ops (``(S_out_i,)``), so that under
        ``torch.jit.trace`` (where ``size`` and ``out`` are traced sizes) the divisors follow the
        input's size instead of being frozen at the traced one."""
        k, s, p = self.kernel_size[i], self.stride[i], self.padding[i]
        start = torch.arange(out, device=like.device) * s - p  # window j covers [j·s − p, j·s − p + k)
        end = (start + k).clamp(max=size + p)  # clipped to the padded axis [−p, L + p)
        if not self.count_include_pad:  # only real pixels [0, L) count
            start, end = start.clamp(min=0), end.clamp(max=size)
        return (end - start).to(like.dtype)


_MAX_DOC = """Applies a {nd}-D max pooling over ``(N, C, {s})``, equal to :class:`torch.nn.MaxPool{nd}d`.

    ``out[n, c, {o}] = max over the window of x_pad``, where ``x_pad`` is the input with ``p``
    −inf on each side; a window starts at ``o·s`` (padded coordinates) and reads every ``d``-th
    element of its span ``E = d·(k − 1) + 1``.

    Args:
        kernel_size (int or tuple): Window size ``k``.
        stride (int or tuple, optional): Window step ``s``. Default: ``kernel_size``
        padding (int or tuple, optional): −inf padding ``p`` on both sides; at most
            ``kernel_size // 2``. Default: 0
        dilation (int or tuple, optional): Spacing ``d`` between window elements. Default: 1
        return_indices (bool, optional): Also return the argmax as a flat index into the
            input's spatial dims (as torch, for ``MaxUnpool``). Default: ``False``
        ceil_mode (bool, optional): Use ceil instead of floor for the output size. Default: ``False``

    Shape:
        - Input: ``(N, C, {s})`` or ``(C, {s})``
        - Output: ``(N, C, {so})`` or ``(C, {so})``, where for each spatial dim

          ``L_out = ⌊(L + 2p − d·(k − 1) − 1) / s⌋ + 1`` (floor mode), or
          ``L_out = ⌈(L + 2p − d·(k − 1) − 1) / s⌉ + 1``, minus one if ``(L_out − 1)·s ≥ L + p``
          (ceil mode)

          where ``L`` is that dim's input size ({s}): a ceil-mode window that would start in the
          right padding is dropped. ``L_out ≥ 1`` is required, and every window must read at least
          one input pixel (with dilation a small input can leave a window of padding only, where
          torch returns −inf; this layer raises a ``ValueError``).

    Note:
        A ``torch.jit.trace`` of this layer is valid for the traced input size only (see the module
        docstring); ``torch.compile`` has no such limit.
"""

_AVG_DOC = """Applies a {nd}-D average pooling over ``(N, C, {s})``, equal to :class:`torch.nn.AvgPool{nd}d`.

    ``out[n, c, {o}] = Σ window / divisor``: the window ``[o·s − p, o·s − p + k)`` is summed over
    the zero-padded input; the divisor is ``divisor_override`` if given, else the window's
    element count clipped to ``[−p, L + p)`` (``count_include_pad=True``) or to ``[0, L)`` (``False``),
    a product over dims (:func:`avg_pool_counts`).

    Args:
        kernel_size (int or tuple): Window size ``k``.
        stride (int or tuple, optional): Window step ``s``. Default: ``kernel_size``
        padding (int or tuple, optional): Zero padding ``p`` on both sides; at most
            ``kernel_size // 2``. Default: 0
        ceil_mode (bool, optional): Use ceil instead of floor for the output size. Default: ``False``
        count_include_pad (bool, optional): Count padding zeros in the divisor. Default: ``True``{extra}

    Shape:
        - Input: ``(N, C, {s})`` or ``(C, {s})``
        - Output: ``(N, C, {so})`` or ``(C, {so})``, where for each spatial dim

          ``L_out = ⌊(L + 2p − k) / s⌋ + 1`` (floor mode), or
          ``L_out = ⌈(L + 2p − k) / s⌉ + 1`` minus one if ``(L_out − 1)·s ≥ L + p`` (ceil mode)

          where ``L`` is that dim's input size ({s}). ``L_out ≥ 1`` is required.

    Note:
        A ``torch.jit.trace`` of this layer is valid for the traced input size only (see the module
        docstring); ``torch.compile`` has no such limit.
"""

_DIVISOR_DOC = """
        divisor_override (int, optional): Divide every window by this instead. Default: ``None``"""


class MaxPool1d(_MaxPoolNd):
    __doc__ = _MAX_DOC.format(nd=1, s="L", so="L_out", o="t") + """
    Example::

        >>> MaxPool1d(2, ceil_mode=True)(torch.tensor([[[1., 5., 2., 4., 3.]]]))   # last window: [3]
        tensor([[[5., 4., 3.]]])
"""
    _nd, _torch_cls, _op = 1, nn.MaxPool1d, "max_pool1d"


class MaxPool2d(_MaxPoolNd):
    __doc__ = _MAX_DOC.format(nd=2, s="H, W", so="H_out, W_out", o="y, x") + """
    Example::

        >>> pool = MaxPool2d(3, stride=2, padding=1)         # ResNet's stem pool
        >>> pool(torch.randn(1, 64, 112, 112)).shape
        torch.Size([1, 64, 56, 56])
"""
    _nd, _torch_cls, _op = 2, nn.MaxPool2d, "max_pool2d"


class AvgPool1d(_AvgPoolNd):
    __doc__ = _AVG_DOC.format(nd=1, s="L", so="L_out", o="t", extra="") + """
    Example::

        >>> x = torch.tensor([[[1., 2., 3.]]])                 # windows [pad, 1] and [2, 3]
        >>> AvgPool1d(2, padding=1)(x)                          # the pad counts: (0 + 1) / 2
        tensor([[[0.5000, 2.5000]]])
        >>> AvgPool1d(2, padding=1, count_include_pad=False)(x)    # it does not: 1 / 1
        tensor([[[1.0000, 2.5000]]])
"""
    _nd, _torch_cls, _op = 1, nn.AvgPool1d, "avg_pool1d"

    def __init__(self, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None, padding: IntOrTuple = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)  # torch: no divisor_override


class AvgPool2d(_AvgPoolNd):
    __doc__ = _AVG_DOC.format(nd=2, s="H, W", so="H_out, W_out", o="y, x", extra=_DIVISOR_DOC) + """
    Example::

        >>> AvgPool2d(2, divisor_override=1)(torch.ones(1, 1, 4, 4))   # window sums
        tensor([[[[4., 4.],
                  [4., 4.]]]])
"""
    _nd, _torch_cls, _op = 2, nn.AvgPool2d, "avg_pool2d"
    _torch_args = _AvgPoolNd._torch_args + ("divisor_override",)

    def _config(self) -> Dict:
        return {**super()._config(), "divisor_override": self.divisor_override}
