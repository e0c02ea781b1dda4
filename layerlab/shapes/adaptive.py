"""AdaptiveAvgPool / AdaptiveMaxPool 1d/2d/3d: output size, the bins, and where torch raises (§6).

Module semantics: ``nn.AdaptiveAvgPool2d(output_size)(x)``.

Shape::

    output = input.shape[:-nd] + output_size        (whatever the input size)

``None`` entries (2-D/3-D) copy the matching input dim, counted from the end. ``0`` gives an
empty tensor. Output index ``i`` of a dim with input ``L`` and output ``O`` reads the bin
``[⌊i·L/O⌋, ⌈(i+1)·L/O⌉)``: equal bins when ``L % O == 0``, overlapping bins otherwise, and
repeated pixels when ``O > L``. No pixel is ever cropped.

Checks, in torch 2.13's order (messages quoted below):

* 2-D/3-D, in Python first: a tuple ``output_size`` needs ``input.dim() > len(output_size)``
  (``ValueError: Input dimension should be at least …``), then ``None`` is replaced.
* AdaptiveAvgPool2d/3d: length of output_size → negative entries → **fast path**: an all-ones
  output is ``mean(last nd dims, keepdim=True)`` with no rank or empty check (only an IndexError
  when the input has fewer than nd dims) → rank → empty dims (2-D: the spatial dims only; 3-D:
  every non-batch dim).
* AdaptiveMaxPool2d/3d: length → rank → empty non-batch dims → negative sizes are *not*
  validated and fail when the output tensor is created.
* 1-D: ``None`` is a TypeError of the argument parser; rank 2/3 → length. AdaptiveAvgPool1d then
  runs as 2-D on ``(…, 1, L)`` with output ``(1, O)`` (so its messages say ``adaptive_avg_pool2d``);
  AdaptiveMaxPool1d checks empty dims itself, then creates ``(…, 1, O)``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.arith import adaptive_bins
from layerlab.shapes.fpad import shape_str
from layerlab.shapes.pool import index_error
from layerlab.shapes.pool_steps import DIM_NAMES
from layerlab.shapes.result import DimStep, Explanation, ShapeNote

#: Bins are listed in steps and notes only up to this many outputs per dim (keeps JSON small).
MAX_LISTED_BINS = 1024


def _raise(message: str, torch_message: str, exc: str = "RuntimeError", rule: str = "§6.3", **kw: Any) -> None:
    raise TorchWouldRaise(message, torch_exception=exc, torch_message=torch_message, rule=rule, **kw)


def _normalise(value: Any) -> Any:
    """``output_size`` as an int, ``None`` or a tuple of ints/None (lists become tuples)."""
    if isinstance(value, list):
        value = tuple(value)
    for v in value if isinstance(value, tuple) else (value,):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise UsageError("output_size must be an int, None or a tuple of them", where="output_size", got=value)
    return value


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """Adaptive avg/max pool 1d/2d/3d: steps with the bins, notes, output shape; raise like torch."""
    variant = "avg" if spec.name.startswith("adaptive_avg") else "max"
    nd = spec.nd
    size = _normalise(params["output_size"])
    if nd == 1:
        out = _one_d(ex, variant, shape, size)
    else:
        out = _nd(ex, variant, nd, shape, size)
    ex.output_shape = out


# --------------------------------------------------------------------------------------------
# 1-D


def _one_d(ex: Explanation, variant: str, shape: Tuple[int, ...], size: Any) -> Tuple[int, ...]:
    fn = f"adaptive_{variant}_pool1d"
    if size is None or (isinstance(size, tuple) and None in size):
        # The argument parser words a None first entry differently from a later one.
        if size is None or size[0] is None:
            tail = "not NoneType" if size is None else "but found element of type NoneType at pos 0"
            msg = f"{fn}(): argument 'output_size' (position 2) must be tuple of ints, {tail}"
        else:
            msg = (f"{fn}(): argument 'output_size' failed to unpack the object at pos {size.index(None) + 1} "
                   'with error "type must be tuple of ints,but got NoneType"')
        _raise("a 1-D adaptive pool has no None form: output_size must be an int", msg, exc="TypeError",
               where="output_size", got=size, suggestions=["output_size=<int>"])
    if len(shape) not in (2, 3):
        _raise(f"{fn} needs a 2-D (C, L) or 3-D (N, C, L) input, got {len(shape)}-D",
               f"Expected 2 to 3 dimensions, but got {len(shape)}-dimensional tensor for argument #1 'self' "
               f"(while checking arguments for {fn})", where="input", expected="2 or 3 dims", got=len(shape),
               suggestions=["input (N, C, L) or (C, L)"])
    if isinstance(size, tuple) and len(size) != 1:
        _raise(f"output_size of a 1-D adaptive pool must be an int or a 1-tuple, got {len(size)} values",
               f"{fn}() argument 'output_size' should contain one int (got {len(size)})", where="output_size",
               expected="an int or a 1-tuple", got=size,
               suggestions=[f"output_size={size[0]}" if size else "output_size=<int>"])
    O = size[0] if isinstance(size, tuple) else size
    if variant == "avg":
        # adaptive_avg_pool1d = adaptive_avg_pool2d on (…, 1, L) with output (1, O).
        ex.notes.append(ShapeNote("info", "AdaptiveAvgPool1d runs as AdaptiveAvgPool2d on (…, 1, L) with output "
                                  "(1, O); its errors show that shape.", severity="info"))
        out = _avg_nd(ex, 2, shape[:-1] + (1, shape[-1]), (1, O), names=(None, "L"))
        return out[:-2] + out[-1:]
    _steps(ex, ("L",), shape[-1:], (O,))
    _empty_check(shape, range(1, len(shape)), "adaptive_max_pool1d")
    if O < 0:
        _negative(shape[:-1] + (1, O), O)
    _bin_notes(ex, ("L",), shape[-1:], (O,))
    return shape[:-1] + (O,)


# --------------------------------------------------------------------------------------------
# 2-D / 3-D


def _nd(ex: Explanation, variant: str, nd: int, shape: Tuple[int, ...], size: Any) -> Tuple[int, ...]:
    fn = f"adaptive_{variant}_pool{nd}d"
    if isinstance(size, tuple):
        # F.adaptive_*_pool{2,3}d: _list_with_default, before any C++ check.
        if len(shape) <= len(size):
            _raise(f"output_size has {len(size)} entries, so the input needs more than {len(size)} dims",
                   f"Input dimension should be at least {len(size) + 1}", exc="ValueError", where="input",
                   expected=f"≥ {len(size) + 1} dims", got=len(shape),
                   suggestions=[f"input (N, C, *{nd} spatial dims)"])
        kept = tuple(v is None for v in size)
        size = tuple(v if v is not None else L for v, L in zip(size, shape[-len(size):])) if size else ()
        if len(size) != nd and variant == "avg":
            _length_error(fn, nd, size, f"{fn}: output_size must be {nd}")
    elif size is None:
        # _list_with_default takes len(None).
        _raise("output_size=None: give an int or a tuple (None entries keep that input dim)",
               "object of type 'NoneType' has no len()", exc="TypeError", where="output_size",
               suggestions=[f"output_size=({', '.join(['None'] * nd)}) to keep the input size"])
    else:
        size, kept = (size,) * nd, (False,) * nd
    if variant == "avg":
        return _avg_nd(ex, nd, shape, size, names=DIM_NAMES[nd], kept=kept)
    if len(shape) not in (nd + 1, nd + 2):
        _raise(f"{fn} needs a {nd + 1}-D or {nd + 2}-D input, got {len(shape)}-D",
               f"{fn}(): Expected {nd + 1}D or {nd + 2}D tensor, but got: {shape_str(shape)}", where="input",
               expected=f"{nd + 1} or {nd + 2} dims", got=len(shape),
               suggestions=[f"input of rank {nd + 1} or {nd + 2}"])
    _empty_check(shape, range(1, len(shape)), fn)
    if len(size) != nd:  # AdaptiveMaxPool checks the length after the input
        _length_error(fn, nd, size, f"{fn}(): internal error: output_size.size() must be {nd}")
    _steps(ex, DIM_NAMES[nd], shape[-nd:], size, kept)
    if any(o < 0 for o in size):
        _negative(shape[:-nd] + size, next(o for o in size if o < 0))
    _bin_notes(ex, DIM_NAMES[nd], shape[-nd:], size)
    return shape[:-nd] + size


def _avg_nd(ex: Explanation, nd: int, shape: Tuple[int, ...], size: Tuple[int, ...],
            names: Tuple[Optional[str], ...], kept: Sequence[bool] = ()) -> Tuple[int, ...]:
    """ATen's adaptive_avg_pool2d/3d after Python: negative sizes, the mean fast path, rank, empties."""
    fn = f"adaptive_avg_pool{nd}d"
    if any(o < 0 for o in size):
        # torch prints the 3-D sizes as "{a, b,c}" (sic).
        shown = ", ".join(str(o) for o in size) if nd == 2 else f"{size[0]}, {size[1]},{size[2]}"
        _raise("output_size entries must be ≥ 0", f"{fn}: elements of output_size must be greater than or "
               f"equal to 0 but received {{{shown}}}", where="output_size", expected="≥ 0", got=size,
               suggestions=["output_size ≥ 0 (0 gives an empty tensor)"])
    if all(o == 1 for o in size):
        # mean(dims=(-1, …, -nd), keepdim=True): no rank check, no empty check.
        rank = max(len(shape), 1)  # mean() wraps dims of a 0-d tensor like a 1-d one
        if rank < nd:
            _raise(f"the all-ones output takes the mean of the last {nd} dims, but the input has only "
                   f"{len(shape)}", index_error(rank, -rank - 1), exc="IndexError", where="input",
                   expected=f"≥ {nd} dims", got=len(shape), suggestions=[f"input (N, C, *{nd} spatial dims)"])
        ex.notes.append(ShapeNote("info", f"output_size of all ones is a mean over the last {nd} dims: torch skips "
                                  "the rank and empty-input checks here (an empty input gives NaN).", severity="info"))
        _steps(ex, names, shape[-nd:], size, kept)
        return shape[:-nd] + size
    if nd == 3:
        # adaptive_avg_pool3d checks every dim but the first for emptiness, before the rank.
        _empty_check(shape, range(1, len(shape)), fn)
    if len(shape) not in (nd + 1, nd + 2):
        _raise(f"{fn} needs a {nd + 1}-D or {nd + 2}-D input, got {len(shape)}-D",
               f"{fn}(): Expected {nd + 1}D or {nd + 2}D tensor, but got {shape_str(shape)}", where="input",
               expected=f"{nd + 1} or {nd + 2} dims", got=len(shape),
               suggestions=[f"input of rank {nd + 1} or {nd + 2}"])
    _steps(ex, names, shape[-nd:], size, kept)
    if nd == 2:
        # adaptive_avg_pool2d checks the spatial dims only: C = 0 passes.
        _empty_check(shape, range(len(shape) - 2, len(shape)), fn)
    _bin_notes(ex, names, shape[-nd:], size)
    return shape[:-nd] + size


# --------------------------------------------------------------------------------------------
# steps, notes, shared errors


def _bins(L: int, O: int) -> Optional[List[Tuple[int, int]]]:
    return adaptive_bins(L, O) if 0 < O <= MAX_LISTED_BINS and L > 0 else None


def _steps(ex: Explanation, names: Sequence[Optional[str]], spatial: Sequence[int], size: Sequence[int],
           kept: Sequence[bool] = ()) -> None:
    """One step per real dim; ``kept`` marks the dims whose size came from a ``None``."""
    for i, (name, L, O) in enumerate(zip(names, spatial, size)):
        if name is None:
            continue
        if i < len(kept) and kept[i]:
            ex.steps.append(DimStep(name, L, "L (None keeps the input size)", f"{L}", O, {"O": O, "kept": True}))
            continue
        bins = _bins(L, O)
        values = {"O": O, "bin_start": "⌊i·L/O⌋", "bin_end": "⌈(i+1)·L/O⌉"}
        if bins is not None:
            values["bins"] = bins
        ex.steps.append(DimStep(name, L, "O (the requested output_size)", f"{O}", O, values))


def _bin_notes(ex: Explanation, names: Sequence[Optional[str]], spatial: Sequence[int], size: Sequence[int]) -> None:
    for name, L, O in zip(names, spatial, size):
        if name is None or O <= 0 or L <= 0:
            if name is not None and O == 0:
                ex.notes.append(ShapeNote("info", f"{name}: output_size 0 gives an empty tensor.", dim=name,
                                          severity="info"))
            continue
        bins = _bins(L, O)
        data = {"L": L, "O": O, "bins": bins, "sizes": sorted({e - s for s, e in bins}) if bins else None}
        listed = " ".join(f"[{s},{e})" for s, e in bins) if bins and len(bins) <= 16 else None
        if O > L:
            ex.notes.append(ShapeNote(
                "bins-repeat",
                f"{name}: {O} outputs from {L} input pixels — bins of size 1–2 repeat pixels (upsampling by "
                f"replication)" + (f": {listed}" if listed else "") + ".", dim=name, severity="info", data=data))
        elif L % O:
            ex.notes.append(ShapeNote(
                "bins-overlap",
                f"{name}: {L} is not a multiple of {O}, so the bins overlap and may differ in size"
                + (f": {listed}" if listed else "") + ".", dim=name, severity="info", data=data))
        else:
            ex.notes.append(ShapeNote(
                "info", f"{name}: {O} equal bins of {L // O} (the same as pooling with kernel = stride = {L // O}).",
                dim=name, severity="info", data=data))


def _empty_check(shape: Tuple[int, ...], dims: Any, fn: str) -> None:
    for i in dims:
        if shape[i] == 0:
            _raise("the input has an empty dim that adaptive pooling cannot read",
                   f"{fn}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes "
                   f"{shape_str(shape)} with dimension {i} being empty", where="input", got=list(shape),
                   suggestions=["every non-batch dim ≥ 1"])


def _length_error(fn: str, nd: int, size: Tuple[int, ...], msg: str) -> None:
    _raise(f"output_size needs {nd} entries (or one int), got {len(size)}", msg, where="output_size",
           expected=f"{nd} values", got=size, suggestions=[f"output_size as an int or a {nd}-tuple"])


def _negative(out_shape: Tuple[int, ...], first: int) -> None:
    _raise("AdaptiveMaxPool does not validate output_size; a negative entry fails when the output is created",
           f"Trying to create tensor with negative dimension {first}: {shape_str(out_shape)}", where="output_size",
           expected="≥ 0", got=first, suggestions=["output_size ≥ 0"])
