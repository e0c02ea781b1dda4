"""FractionalMaxPool2d / 3d: the output size is asked for, not computed from a stride.

Shape: ``(N, C, *S)`` or unbatched ``(C, *S)`` → the same with the spatial sizes replaced by

* ``output_size`` (an int is used for every dim), or
* ``output_ratio``: ``int(L · r)`` per dim — Python's float product, truncated (``9 · 0.5 → 4``).

The windows start at pseudo-random positions, so the size never depends on the random samples.

Checks, in torch 2.13's order (``torch/nn/modules/pooling.py``, ``F.fractional_max_pool*d``, ATen):

1. module only: ``FractionalMaxPool3d`` refuses ``kernel_size ≤ 0`` (ValueError; 2d does not);
   neither or both of ``output_size``/``output_ratio`` (ValueError); a ratio outside (0, 1)
   (ValueError). The functional checks only "neither", and takes a ratio ≥ 1 (the pool check
   below then fails) — and ``F.fractional_max_pool2d`` calls ``len()`` on the ratio: a plain
   number is a TypeError there (the module passes a pair);
2. Python: ``input.size(-2)`` / ``size(-3)`` … read for the ratio and the random samples — an
   input with too few dims is an IndexError here, before the rank check;
3. ATen: kernel_size and output_size lengths, rank 3/4 (3d: 4/5), every non-batch dim non-empty
   (unbatched: C may be 0), then per dim ``out + k − 1 ≤ L`` ("pool height … too large"; 3d:
   ``out + k − 1 < L``, strictly, checked T, W, H — so 3d cannot give 9 → 8 with k=2), then
   the output is allocated (a negative size fails there). ``out = 0`` is accepted (empty output).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.fpad import negative_dimension, shape_str
from layerlab.shapes.pool import index_error
from layerlab.shapes.pool_steps import DIM_NAMES
from layerlab.shapes.result import DimStep, Explanation

_WORD = {"T": "time", "H": "height", "W": "width"}


def _raise(message: str, exc: str, torch_message: str, **kw: Any) -> None:
    raise TorchWouldRaise(message, torch_exception=exc, torch_message=torch_message, rule="§3", **kw)


def _ntuple(value: Any, n: int) -> Any:
    """``_pair`` / ``_triple``: an iterable is kept as a tuple, a scalar repeated."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,) * n


def _size(shape: Tuple[int, ...], dim: int) -> int:
    """``input.size(dim)`` for a negative or non-negative ``dim``, IndexError like torch."""
    r = len(shape)
    if not -r <= dim < r:
        _raise(f"the {r}-D input has no dim {dim}", "IndexError", index_error(r, dim), where="input",
               got=list(shape), suggestions=["an (N, C, *spatial) or (C, *spatial) input"])
    return shape[dim]


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """``nn.FractionalMaxPool{nd}d(...)(x)`` or ``F.fractional_max_pool{nd}d(x, ...)``."""
    nd = spec.nd
    kernel, size, ratio = params["kernel_size"], params["output_size"], params["output_ratio"]
    fn = f"fractional_max_pool{nd}d"
    if not spec.functional:
        kernel, size, ratio = _construct(nd, kernel, size, ratio)
    if size is None and ratio is None:
        _raise("give output_size or output_ratio", "ValueError",
               f"{fn} requires specifying either an output_size or an output_ratio", where="output_size",
               suggestions=["output_size=…", "output_ratio=0.5"])
    if size is None:
        if nd == 2:
            if not isinstance(ratio, (tuple, list)):
                _raise("F.fractional_max_pool2d takes output_ratio as a tuple", "TypeError",
                       f"object of type '{type(ratio).__name__}' has no len()", where="output_ratio", got=ratio,
                       suggestions=[f"output_ratio=({ratio}, {ratio})"])
            if len(ratio) > 2:
                _raise("output_ratio has more than 2 values", "ValueError",
                       "fractional_max_pool2d requires output_ratio to either be a single Int or tuple of Ints.",
                       where="output_ratio", got=ratio)
        r = _ntuple(ratio, nd)
        size = []
        for i in range(nd):
            L = _size(shape, i - nd)
            if i >= len(r):
                _raise("output_ratio has fewer values than spatial dims", "IndexError", "tuple index out of range",
                       where="output_ratio", got=ratio)
            size.append(int(L * r[i]))
            ex.steps.append(DimStep(DIM_NAMES[nd][i], L, "int(L · r)", f"int({L} · {r[i]})", size[-1],
                                    {"r": r[i]}))
    elif isinstance(size, int):
        size = (size,) * nd
    # the random samples: (N or 1, C, nd)
    if len(shape) != nd + 1:
        _size(shape, 0)
    _size(shape, -nd - 1)
    _aten(ex, nd, shape, _ntuple(kernel, nd), tuple(size), ratio is None)


def _construct(nd: int, kernel, size, ratio):
    """``FractionalMaxPool{nd}d.__init__``: the attributes it keeps, or its ValueError."""
    if nd == 3 and ((isinstance(kernel, int) and kernel <= 0) or
                    (isinstance(kernel, (tuple, list)) and not all(k > 0 for k in kernel))):
        _raise("kernel_size must be at least 1", "ValueError", f"kernel_size must be greater than 0, but got {kernel}",
               where="kernel_size", got=kernel, suggestions=["kernel_size=2"])
    k = _ntuple(kernel, nd)
    s = _ntuple(size, nd) if size is not None else None
    r = _ntuple(ratio, nd) if ratio is not None else None
    if size is None and ratio is None:
        _raise("give output_size or output_ratio", "ValueError",
               f"FractionalMaxPool{nd}d requires specifying either an output size, or a pooling ratio",
               where="output_size", suggestions=["output_size=…", "output_ratio=0.5"])
    if size is not None and ratio is not None:
        _raise("give output_size or output_ratio, not both", "ValueError",
               "only one of output_size and output_ratio may be specified", where="output_ratio",
               suggestions=["drop output_ratio", "drop output_size"])
    if r is not None:
        for i in range(nd):
            if i >= len(r):
                _raise("output_ratio has fewer values than spatial dims", "IndexError", "tuple index out of range",
                       where="output_ratio", got=ratio)
            if not isinstance(r[i], (int, float)) or isinstance(r[i], bool):
                raise UsageError("output_ratio must be a number or a tuple of numbers", where="output_ratio", got=ratio)
            if not 0 < r[i] < 1:
                _raise("output_ratio must be strictly between 0 and 1", "ValueError",
                       f"output_ratio must be between 0 and 1 (got {ratio})", where="output_ratio", got=ratio,
                       suggestions=["output_ratio=0.5", "output_size=… for an exact size"])
    return k, s, r


def _aten(ex: Explanation, nd: int, shape: Tuple[int, ...], k: tuple, size: tuple, show_size: bool) -> None:
    fn = "fractional_max_pool2d()" if nd == 2 else "fractional_max_pool3d_out()"
    three = "" if nd == 2 else "three "
    for name, t in (("kernel_size", k), ("output_size", size)):
        if len(t) != nd:
            _raise(f"{name} needs {nd} values, got {len(t)}", "RuntimeError",
                   f"fractional_max_pool{nd}d: {name} must either be a single Int or tuple of {three}Ints",
                   where=name, got=t, suggestions=[f"{name} as an int or a tuple of {nd} ints"])
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
            raise UsageError(f"{name} must be an int or a tuple of ints", where=name, got=t)
    r = len(shape)
    if r not in (nd + 1, nd + 2):
        _raise(f"FractionalMaxPool{nd}d takes a {nd + 1}-D or {nd + 2}-D input, not {r}-D", "RuntimeError",
               f"{fn}: Expected {nd + 1}D or {nd + 2}D tensor, but got: {shape_str(shape)}", where="input",
               got=list(shape))
    for i in range(1, r):
        if shape[i] == 0:
            _raise("only the batch dim may be empty", "RuntimeError",
                   f"{fn}: Expected input to have non-zero size for non-batch dimensions, but got"
                   f"{shape_str(shape)} with dimension {i} being empty.", where="input", got=list(shape))
    letters = ("H", "W") if nd == 2 else ("T", "H", "W")
    spatial = shape[-nd:]
    if show_size:
        for name, L, o in zip(DIM_NAMES[nd], spatial, size):
            ex.steps.append(DimStep(name, L, "output_size", f"{o}", o, {"output_size": o}))
    # 2d: out + k − 1 ≤ L, H then W; 3d: out + k − 1 < L (strict, sic), T then W then H
    order = (0, 1) if nd == 2 else (0, 2, 1)
    for i in order:
        letter, L, ki, o = letters[i], spatial[i], k[i], size[i]
        if o + ki - 1 > L - (nd == 3):
            word = _WORD[letter]
            _raise(f"{word}: output_size {o} + kernel_size {ki} − 1 = {o + ki - 1} is more than the input's {L}",
                   "RuntimeError", f"{fn}: pool {word} {ki} too large relative to input {word} {L}",
                   where=letter, expected=f"output_size + kernel_size − 1 ≤ {L - (nd == 3)}", got=o + ki - 1,
                   suggestions=[f"output_size ≤ {L - ki + 1 - (nd == 3)}", f"kernel_size ≤ {L + 1 - o - (nd == 3)}"])
    out = tuple(shape[:-nd]) + tuple(size)
    if any(v < 0 for v in out):
        _raise("an output size is negative", "RuntimeError", negative_dimension(out), where="output_size",
               got=list(size), suggestions=["output_size ≥ 0"])
    ex.output_shape = out
