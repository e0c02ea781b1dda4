"""Adaptive pooling with torch's bins written out, and a soft (temperature) version of it.

Adaptive pooling asks for an output size ``O`` instead of a kernel: output ``i`` along a dim of
input size ``L`` reads the bin ``[⌊i·L/O⌋, ⌈(i+1)·L/O⌉)`` (:func:`adaptive_bins`). Bins differ in
size by at most one and overlap when ``O ∤ L``, so they cannot be cut with one ``unfold``. Here
each dim gathers its bins into a ``(O, K)`` index table (``K`` = largest bin; shorter bins repeat
their last index and are masked), which gives every bin as a row of ``K_1·K_2`` values:

* max: ``windows.max(-1)``. A repeated index always comes after the original in row-major
  order, so the first maximum is a real pixel, the one torch picks, and gradients of ties match.
* avg: masked sum / bin size.
* soft: a softmax over each bin with temperature ``τ``; ``τ → 0`` is max, ``τ → ∞`` is avg.

``torch.compile(fullgraph=True)`` captures these layers whole (recompiling per input size). A
``torch.jit.trace`` bakes the bin tables of the traced size in, so it holds for that size only
(another size raises in the TorchScript interpreter): trace once per size.

Legend for the shape comments:
    N batch · C channels · S spatial sizes (L | H, W) · O output sizes · K elements per bin (padded)
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from layerlab.layers._checks import check_floating, check_rank, check_type, layer_error

__all__ = [
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "SoftAdaptivePool2d",
    "adaptive_bins",
]

OutputSize = Union[int, None, Sequence[Optional[int]]]


def adaptive_bins(size: int, out: int) -> List[Tuple[int, int]]:
    """``[(start, end), …]`` read by each of ``out`` outputs along a dim of ``size`` (end exclusive).

    ``start_i = ⌊i·L/O⌋``, ``end_i = ⌈(i+1)·L/O⌉``; e.g. L=10, O=4 → [0,3) [2,5) [5,8) [7,10).
    """
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


class _AdaptivePoolNd(nn.Module):
    _nd: int
    _op: str

    def __init__(self, output_size: OutputSize) -> None:
        super().__init__()
        name, nd = type(self).__name__, self._nd
        items = (output_size,) * nd if output_size is None or isinstance(output_size, int) else output_size
        try:
            items = tuple(items)
        except TypeError:
            items = ()
        ok = len(items) == nd and all(
            (v is None and nd > 1) or (isinstance(v, int) and not isinstance(v, bool) and v >= 1) for v in items)
        if not ok:
            none = " or None (keep the input size)" if nd > 1 else ""
            raise layer_error(name, "output_size", expected=f"an int ≥ 1{none}, or a tuple of {nd} of them",
                              got=repr(output_size), hint=f"e.g. output_size={(7,) * nd if nd > 1 else 7}")
        self.output_size = items if nd > 1 else items[0]

    def _resolve(self, x: Tensor) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        name, nd = type(self).__name__, self._nd
        check_rank(name, x, nd)
        check_floating(name, x)
        sizes = tuple(x.shape[-nd:])
        if min(sizes) < 1 or x.shape[-nd - 1] < 1:
            raise layer_error(name, "input", expected="non-empty channel and spatial dims",
                              got=f"shape {tuple(x.shape)}", hint="check the previous layer's output")
        requested = self.output_size if nd > 1 else (self.output_size,)
        outs = tuple(size if o is None else o for size, o in zip(sizes, requested))
        return sizes, outs

    def _bin_windows(self, x: Tensor, sizes: Sequence[int], outs: Sequence[int]):
        """Every bin as a row: ``(windows (N, C, *O, K), valid (*O, K), bin size (*O), input index (*O, K))``."""
        nd, dev = self._nd, x.device
        first = x.dim() - nd
        valid = torch.ones((), dtype=torch.bool, device=dev)
        count = torch.ones((), dtype=x.dtype, device=dev)
        flat_index = torch.zeros((), dtype=torch.long, device=dev)
        for i, (size, out) in enumerate(zip(sizes, outs)):
            bins = adaptive_bins(size, out)
            k = max(end - start for start, end in bins)
            rows = [[min(start + t, end - 1) for t in range(k)] for start, end in bins]  # pad: repeat last
            index = torch.tensor(rows, device=dev)  # (O_i, K_i)
            # dims so far: (…, O_0, K_0, …, S_i, …); swap S_i for (O_i, K_i)
            x = x.index_select(first + 2 * i, index.flatten()).unflatten(first + 2 * i, (out, k))
            # this dim's tables, placed on axes (O_i, K_i) of the (*O, *K) layout
            shape = [1] * (2 * nd)
            shape[i], shape[nd + i] = out, k
            lengths = torch.tensor([end - start for start, end in bins], device=dev)
            valid = valid & (torch.arange(k, device=dev) < lengths[:, None]).reshape(shape)
            count = count * lengths.to(x.dtype).reshape(shape[:nd])
            flat_index = flat_index + index.reshape(shape) * math.prod(sizes[i + 1:])
        order = list(range(first)) + [first + 2 * i for i in range(nd)] + [first + 2 * i + 1 for i in range(nd)]
        windows = x.permute(order).flatten(-nd)  # (N, C, *O, K)
        full = (*outs, -1)
        return windows, valid.reshape(full), count, flat_index.reshape(full)

    def layerlab_shape_op(self) -> Tuple[str, Dict]:
        """The explain-shape op and its parameters (torch names) that predict this layer's output size."""
        return self._op, self._config()

    def _config(self) -> Dict:
        return {"output_size": self.output_size}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self._config().items())


class _TorchAdaptivePoolNd(_AdaptivePoolNd):
    """An adaptive pool with a ``torch.nn`` counterpart ``_torch_cls``."""

    _torch_cls: type
    _config_keys: Tuple[str, ...]

    @classmethod
    def from_torch(cls, module: nn.Module) -> "_TorchAdaptivePoolNd":
        """A layer with ``module``'s configuration (no weights)."""
        check_type(cls.__name__, module, cls._torch_cls)
        return cls(**{k: getattr(module, k) for k in cls._config_keys}).train(module.training)

    def to_torch(self) -> nn.Module:
        """The ``torch.nn`` counterpart with the same configuration."""
        return self._torch_cls(**self._config())


class _AdaptiveAvgPoolNd(_TorchAdaptivePoolNd):
    _config_keys = ("output_size",)

    def forward(self, input: Tensor) -> Tensor:
        sizes, outs = self._resolve(input)
        windows, valid, count, _ = self._bin_windows(input, sizes, outs)  # (N, C, *O, K)
        # where, not multiply: a masked slot must not turn an inf elsewhere in the input into nan
        return torch.where(valid, windows, 0.0).sum(-1) / count  # (N, C, *O)


class _AdaptiveMaxPoolNd(_TorchAdaptivePoolNd):
    _config_keys = ("output_size", "return_indices")

    def __init__(self, output_size: OutputSize, return_indices: bool = False) -> None:
        super().__init__(output_size)
        self.return_indices = bool(return_indices)

    def _config(self) -> Dict:
        return {"output_size": self.output_size, "return_indices": self.return_indices}

    def forward(self, input: Tensor):
        sizes, outs = self._resolve(input)
        windows, _, _, flat_index = self._bin_windows(input, sizes, outs)  # (N, C, *O, K)
        values, arg = windows.max(-1)  # (N, C, *O); repeated slots come last, so never win a tie
        if not self.return_indices:
            return values
        return values, flat_index.expand(*arg.shape, -1).gather(-1, arg.unsqueeze(-1)).squeeze(-1)


_SHAPE_DOC = """
    Shape:
        - Input: ``(N, C, {s})`` or ``(C, {s})``
        - Output: ``(N, C, {so})`` or ``(C, {so})``, ``({so}) = output_size``{none}.
          Output ``i`` along a dim reads the input bin

          ``[⌊i·L/O⌋, ⌈(i+1)·L/O⌉)``

          where ``L`` is that dim's input size and ``O`` its output size. Bins have ``⌊L/O⌋`` to
          ``⌈L/O⌉ + 1`` elements, overlap when ``O ∤ L`` and repeat pixels when ``O > L``; every
          pixel is in some bin.

    Note:
        A ``torch.jit.trace`` of this layer is valid for the traced input size only (the bin
        tables are built in Python from it); ``torch.compile`` has no such limit.
"""
_ARGS_DOC = """
    Args:
        output_size (int{tup}): Target output size ``O``{none_arg}.{ri}
"""
_RI = """
        return_indices (bool, optional): Also return each maximum's flat index into the input's
            spatial dims, as torch. Default: ``False``"""


def _doc(summary: str, nd: int, max_: bool = False) -> str:
    s, so = ("L", "L_out") if nd == 1 else ("H, W", "H_out, W_out")
    none = "" if nd == 1 else " (a ``None`` entry keeps that input dim)"
    return (summary + "\n" + _ARGS_DOC.format(tup="" if nd == 1 else " or tuple", none_arg=none,
                                              ri=_RI if max_ else "")
            + _SHAPE_DOC.format(s=s, so=so, none=" (``None``: the input size)" if nd > 1 else ""))


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    __doc__ = _doc("Mean over each adaptive bin of ``(N, C, L)``; equal to :class:`torch.nn.AdaptiveAvgPool1d`.", 1) + """
    Example::

        >>> AdaptiveAvgPool1d(4)(torch.arange(10.).reshape(1, 10))   # bins [0,3) [2,5) [5,8) [7,10)
        tensor([[1., 3., 6., 8.]])
"""
    _nd, _torch_cls, _op = 1, nn.AdaptiveAvgPool1d, "adaptive_avg_pool1d"


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    __doc__ = _doc("Mean over each adaptive bin of ``(N, C, H, W)``; equal to :class:`torch.nn.AdaptiveAvgPool2d`.", 2) + """
    Example::

        >>> AdaptiveAvgPool2d((5, None))(torch.randn(1, 64, 8, 9)).shape
        torch.Size([1, 64, 5, 9])
"""
    _nd, _torch_cls, _op = 2, nn.AdaptiveAvgPool2d, "adaptive_avg_pool2d"


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    __doc__ = _doc("Max over each adaptive bin of ``(N, C, L)``; equal to :class:`torch.nn.AdaptiveMaxPool1d`.", 1,
                   max_=True) + """
    Example::

        >>> AdaptiveMaxPool1d(4)(torch.arange(10.).reshape(1, 10))   # bins [0,3) [2,5) [5,8) [7,10)
        tensor([[2., 4., 7., 9.]])
"""
    _nd, _torch_cls, _op = 1, nn.AdaptiveMaxPool1d, "adaptive_max_pool1d"


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    __doc__ = _doc("Max over each adaptive bin of ``(N, C, H, W)``; equal to :class:`torch.nn.AdaptiveMaxPool2d`.", 2,
                   max_=True) + """
    Example::

        >>> AdaptiveMaxPool2d(7)(torch.randn(1, 512, 14, 14)).shape
        torch.Size([1, 512, 7, 7])
"""
    _nd, _torch_cls, _op = 2, nn.AdaptiveMaxPool2d, "adaptive_max_pool2d"


class SoftAdaptivePool2d(_AdaptivePoolNd):
    __doc__ = r"""Softmax-weighted pooling over torch's adaptive bins, with a learnable temperature.

    Each output is ``Σ_b softmax(x_b / τ) · x_b`` over the values ``x_b`` of its bin:

    * ``τ → 0``: all weight on the largest value → :class:`torch.nn.AdaptiveMaxPool2d`;
    * ``τ → ∞``: equal weights → :class:`torch.nn.AdaptiveAvgPool2d`;
    * in between, a smooth maximum that passes gradient to every pixel of the bin.

    ``τ = exp(log_temperature)`` so it stays positive while learned. There is no torch
    counterpart, hence no ``from_torch``/``to_torch``; :meth:`limit_module` gives the torch layer
    of either limit, for comparisons.

    Args:
        output_size (int or tuple): Target output size ``(H_out, W_out)``; ``None`` keeps that dim.
        temperature (float, optional): Initial ``τ > 0``. Default: 1.0
        learnable (bool, optional): If ``True``, ``log_temperature`` is a parameter, else a buffer.
            Default: ``True``

    Attributes:
        log_temperature (Tensor): ``()`` scalar, initialised to ``log(temperature)``.
""" + _SHAPE_DOC.format(s="H, W", so="H_out, W_out", none=" (``None``: the input size)") + """
    Example::

        >>> x = torch.randperm(36).reshape(1, 1, 6, 6).double()      # distinct values: no ties
        >>> sharp = SoftAdaptivePool2d(2, temperature=1e-3, dtype=torch.float64)
        >>> torch.allclose(sharp(x), nn.AdaptiveMaxPool2d(2)(x))
        True
"""

    _nd, _op = 2, "adaptive_avg_pool2d"

    def __init__(self, output_size: OutputSize, temperature: float = 1.0, learnable: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__(output_size)
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise layer_error(type(self).__name__, "temperature", expected="a finite float > 0",
                              got=repr(temperature), hint="use a small value (0.01) for max-like, large for avg-like")
        log_t = torch.tensor(math.log(temperature), device=device, dtype=dtype)
        if learnable:
            self.log_temperature = nn.Parameter(log_t)
        else:
            self.register_buffer("log_temperature", log_t)

    @property
    def temperature(self) -> Tensor:
        return self.log_temperature.exp()

    def forward(self, input: Tensor) -> Tensor:
        sizes, outs = self._resolve(input)
        windows, valid, _, _ = self._bin_windows(input, sizes, outs)  # (N, C, H_out, W_out, K)
        logits = torch.where(valid, windows / self.temperature, float("-inf"))  # masked slots: weight 0
        weights = logits.softmax(-1)  # (N, C, H_out, W_out, K), sums to 1 over each bin
        return (weights * torch.where(valid, windows, 0.0)).sum(-1)  # (N, C, H_out, W_out)

    def limit_module(self, limit: str) -> nn.Module:
        """``nn.AdaptiveMaxPool2d`` (``limit='max'``, τ → 0) or ``nn.AdaptiveAvgPool2d`` (``'avg'``, τ → ∞)."""
        if limit not in ("max", "avg"):
            raise layer_error(type(self).__name__, "limit", expected="'max' or 'avg'", got=repr(limit))
        cls = nn.AdaptiveMaxPool2d if limit == "max" else nn.AdaptiveAvgPool2d
        return cls(self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, temperature={self.temperature.item():.4g}"
