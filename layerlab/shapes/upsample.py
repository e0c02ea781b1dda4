"""nn.Upsample / F.interpolate: the output size, the float trap, and where torch raises (§8).

Module semantics: ``nn.Upsample(size=…, scale_factor=…, mode=…, align_corners=…,
recompute_scale_factor=…)(x)``; the input is ``(N, C, *S)`` with 1–3 spatial dims.
``F.interpolate`` (an ``F.`` op name) differs in two places: the scale is used as given (the
module turns a falsy ``scale_factor=0`` into "no scale"), and ``antialias=`` exists.

Shape, per spatial dim::

    size given:          out = size                      (an int is used for every dim)
    scale_factor given:  out = int(float(L) · scale)     (a double product, truncated toward 0)

The double product is the trap: ``100 × 0.29 = 28.999999999999996`` → 28, not 29.
``recompute_scale_factor`` never changes the shape (``mode='area'`` always recomputes).

Checks, in torch 2.13's order: align_corners with nearest/area/nearest-exact → both or neither of
size/scale_factor → tuple lengths → ``recompute_scale_factor=True`` with ``size`` → integer sizes →
mode vs rank → (C++) input and output sizes > 0 → non-empty ``N·C`` tensor. ``mode='area'`` is
``adaptive_avg_pool{1,2,3}d`` instead, so a 0-sized output is *returned*, not an error.

Module quirks: ``nn.Upsample`` turns ``scale_factor`` into floats (``scale_factor=0`` becomes
``None``!). A list ``scale_factor`` is taken as a tuple here (the module itself would fail
calling ``float()`` on it).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, List, Optional, Sequence, Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes import adaptive
from layerlab.shapes.arith import interpolate_out
from layerlab.shapes.ops import OPS
from layerlab.shapes.pool_steps import DIM_NAMES
from layerlab.shapes.result import DimStep, Explanation, ShapeNote

_LINEAR = {"linear": 3, "bilinear": 4, "trilinear": 5}
_ANY_RANK = ("nearest", "nearest-exact", "area")
_MODES = "nearest | linear | bilinear | bicubic | trilinear | lanczos | area | nearest-exact"


def _raise(message: str, torch_message: str, exc: str = "RuntimeError", rule: str = "§8.3", **kw: Any) -> None:
    raise TorchWouldRaise(message, torch_exception=exc, torch_message=torch_message, rule=rule, **kw)


def _module_scale(scale: Any) -> Any:
    """What ``nn.Upsample.__init__`` stores: floats, and ``None`` for any falsy scale (0 included)."""
    if isinstance(scale, (tuple, list)):
        try:
            return tuple(float(f) for f in scale)
        except (TypeError, ValueError):
            raise UsageError("scale_factor entries must be numbers", where="scale_factor", got=scale) from None
    if not scale:
        return None
    try:
        return float(scale)
    except (TypeError, ValueError):
        raise UsageError("scale_factor must be a number or a tuple of numbers", where="scale_factor",
                         got=scale) from None


def _functional_scale(scale: Any) -> Any:
    """What ``F.interpolate`` uses: the scale as given (0 stays 0: an empty output, not "no scale")."""
    if scale is None:
        return None
    if isinstance(scale, (tuple, list)):
        return tuple(_functional_scale(f) for f in scale)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise UsageError("scale_factor must be a number or a tuple of numbers", where="scale_factor", got=scale)
    return float(scale)


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """Upsample / interpolate: steps (with the float trap), output shape; raise where torch raises."""
    size = params.get("size")
    scale = (_functional_scale if spec.functional else _module_scale)(params.get("scale_factor"))
    mode = params.get("mode", "nearest")
    align = params.get("align_corners")
    recompute = params.get("recompute_scale_factor")
    rank = len(shape)
    dim = rank - 2
    spatial = list(shape[2:])

    if mode in _ANY_RANK and align is not None:
        _raise(f"align_corners only applies to the interpolating modes, not mode={mode!r}",
               "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | "
               "trilinear", exc="ValueError", where="align_corners", got=align,
               suggestions=["align_corners=None", "mode='bilinear' (or linear/bicubic/trilinear)"])
    if size is not None and scale is not None:
        _raise("give size or scale_factor, not both", "only one of size or scale_factor should be defined",
               exc="ValueError", where="size", suggestions=["drop scale_factor", "drop size"])
    if size is not None:
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                _raise(f"size has {len(size)} entries but the input has {max(dim, 0)} spatial dims",
                       "Input and output must have the same number of spatial dimensions, but got input with "
                       f"spatial dimensions of {spatial} and output size of {size!r}. Please provide input tensor "
                       "in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) format.",
                       exc="ValueError", where="size", expected=f"{max(dim, 0)} values", got=size,
                       suggestions=[f"size as an int or a {max(dim, 0)}-tuple"])
            if not all(_is_int(x) for x in size):
                types = ", ".join(f"<class '{type(x).__name__}'>" for x in size)
                _raise("size entries must be ints", "expected size to be one of int or Tuple[int] or "
                       "Tuple[int, int] or Tuple[int, int, int], but got size with types "
                       f"[{types}]", exc="TypeError", where="size", got=size,
                       suggestions=["size=(int, …)", "scale_factor=… for a fractional factor"])
            out = [int(x) for x in size]
        else:
            out = [size] * max(dim, 0)
        scales = None
    elif scale is not None:
        if isinstance(scale, tuple):
            if len(scale) != dim:
                _raise(f"scale_factor has {len(scale)} entries but the input has {max(dim, 0)} spatial dims",
                       "Input and scale_factor must have the same number of spatial dimensions, but got input with "
                       f"spatial dimensions of {spatial} and scale_factor of shape {scale!r}. Please provide input "
                       "tensor in (N, C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) format.",
                       exc="ValueError", where="scale_factor", expected=f"{max(dim, 0)} values", got=scale,
                       suggestions=[f"scale_factor as a number or a {max(dim, 0)}-tuple"])
            scales = list(scale)
        else:
            scales = [scale] * max(dim, 0)
        out = None
    else:
        _raise("give size or scale_factor", "either size or scale_factor should be defined", exc="ValueError",
               where="size", suggestions=["size=…", "scale_factor=…"])
    if recompute and size is not None:
        _raise("recompute_scale_factor=True needs scale_factor, not size",
               "recompute_scale_factor is not meaningful with an explicit size.", exc="ValueError",
               where="recompute_scale_factor", suggestions=["recompute_scale_factor=None"])

    names = DIM_NAMES.get(dim, tuple(f"S{i}" for i in range(max(dim, 0))))
    if out is None:
        out = [_scaled(ex, n, L, f) for n, L, f in zip(names, spatial, scales)]
    elif not isinstance(size, (list, tuple)) and not _is_int(size):
        out = _float_size(mode, rank, size)
    else:
        for n, L, o in zip(names, spatial, out):
            ex.steps.append(DimStep(n, L, "size", f"{o}", o, {"size": o}))
    if params.get("antialias") and not (mode in ("bilinear", "bicubic", "lanczos") and rank == 4):
        _raise("antialias=True works with mode='bilinear', 'bicubic' or 'lanczos' on a 4-D input only",
               "Anti-alias option is restricted to bilinear, bicubic, and lanczos modes and requires a 4-D tensor as "
               "input", exc="ValueError", where="antialias", got=f"mode={mode!r}, {rank}-D input",
               suggestions=["antialias=False", "mode='bilinear' on an (N, C, H, W) input"])
    _mode_vs_rank(mode, rank, align)

    if mode == "area":
        ex.notes.append(ShapeNote("info", "mode='area' is adaptive average pooling to the output size: a 0-sized "
                                  "output is returned (empty), not an error.", severity="info"))
        nd = dim
        pool = OPS[f"adaptive_avg_pool{nd}d"]
        sub = type(ex)(op=pool.name, call="", params={}, input_shape=shape)
        adaptive.explain(sub, pool, shape, {"output_size": tuple(out) if nd > 1 else list(out)})
        ex.notes += [n for n in sub.notes if n.code in ("bins-overlap", "bins-repeat")]  # what each output reads
        ex.output_shape = sub.output_shape
        return
    if any(L <= 0 for L in spatial) or any(o <= 0 for o in out):
        letters = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}[dim]
        given = ", ".join(f"{l}: {v}" for l, v in zip(letters, spatial))
        got = ", ".join(f"{l}: {v}" for l, v in zip(letters, out))
        joint = " and output" if dim == 1 else " output"  # the 1-D message says "and" (sic)
        _raise("every input and output spatial size must be ≥ 1 (only mode='area' allows an empty output)",
               f"Input and output sizes should be greater than 0, but got input ({given}){joint} ({got})",
               where=", ".join(n for n, L, o in zip(names, spatial, out) if L <= 0 or o <= 0),
               expected="≥ 1", got=tuple(out), suggestions=_size_fixes(spatial, out, scales))
    if shape[1] == 0:  # torch: numel() != 0 or prod(sizes[1:]) != 0 — with sizes > 0 that is C ≠ 0
        _raise("the channel dim is empty", f"Non-empty {rank}D data tensor expected but got a tensor with sizes "
               f"[{', '.join(str(x) for x in shape)}]", where="C", got=list(shape), suggestions=["C ≥ 1"])
    result = tuple(shape[:2]) + tuple(out)
    if _numel(result) * 4 > (1 << 63) - 1:  # float32: the byte count of the new tensor must fit in int64
        _raise(f"the output {result} would hold more than 2**63 bytes: torch cannot even size it",
               f"Storage size calculation overflowed with sizes=[{', '.join(map(str, result))}]", where="size",
               got=list(result), suggestions=["a smaller size or scale_factor"])
    ex.output_shape = result


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) or type(x).__name__ in ("SymInt",)


def _scaled(ex: Explanation, name: str, L: int, f: float) -> int:
    """``int(float(L)·f)`` with its step, and a ``float-trap`` note where the double product misleads."""
    product = float(L) * f
    if not math.isfinite(product):
        raise UsageError("scale_factor must be a finite number", where="scale_factor", got=f)
    if product >= 2.0 ** 63:
        _raise(f"{name}: {L} × {f!r} = {product!r} does not fit in a 64-bit integer",
               "value cannot be converted to type int64_t without overflow", where=name, got=product,
               suggestions=["a smaller scale_factor"])
    o = interpolate_out(L, f)
    ex.steps.append(DimStep(name, L, "int(float(L) · scale_factor)", f"int({float(L)!r} · {f!r}) = int({product!r})",
                            o, {"scale_factor": f, "product": product}))
    if math.isfinite(f):
        # The decimal the user wrote, times L, exactly. Only a double product that truncates BELOW
        # it is a trap (1/3 → 0.333…3 times 3 is 0.999…9 in decimal, but torch gives the expected 1).
        exact = Fraction(L) * Fraction(repr(f))
        if math.floor(exact) > o:
            ex.notes.append(ShapeNote(
                "float-trap",
                f"{name}: {L} × {f!r} is {exact if exact.denominator > 1 else int(exact)} in decimal, but as doubles "
                f"it is {product!r}, which truncates to {o}, not {math.floor(exact)}. Pass size= for the exact "
                "size, or nudge the scale (e.g. +1e-9).",
                dim=name, data={"L": L, "scale_factor": f, "product": product, "output": o,
                                "expected": math.floor(exact)},
            ))
    return o


def _float_size(mode: str, rank: int, size: Any) -> List[Any]:
    """An int-like ``size`` that is not an int reaches the C++ binding, which rejects it."""
    dim = rank - 2
    fn = {"nearest": f"upsample_nearest{dim}d", "nearest-exact": f"_upsample_nearest_exact{dim}d",
          "linear": "upsample_linear1d", "bilinear": "upsample_bilinear2d", "bicubic": "upsample_bicubic2d",
          "trilinear": "upsample_trilinear3d"}.get(mode)
    _mode_vs_rank(mode, rank, None)
    if mode == "area":
        msg = (f"adaptive_avg_pool{dim}d(): argument 'output_size' (position 2) must be tuple of ints, but found "
               f"element of type {type(size).__name__} at pos 0")
    else:
        args = "Tensor, list, NoneType" if mode in ("nearest", "nearest-exact") else "Tensor, list, bool, NoneType"
        msg = f"{fn}() received an invalid combination of arguments - got ({args}), but expected one of:"
    _raise("size must be an int (or a tuple of ints); use scale_factor for a fractional factor", msg,
           exc="TypeError", where="size", got=size, suggestions=[f"size={int(size)}", "scale_factor=…"])
    return []  # unreachable


def _mode_vs_rank(mode: str, rank: int, align: Optional[bool]) -> None:
    """§8.2: which mode runs on which rank; lanczos needs antialias, which nn.Upsample cannot pass."""
    if rank in (3, 4, 5):
        if mode in _ANY_RANK or _LINEAR.get(mode) == rank or (mode == "bicubic" and rank == 4):
            return
        if mode == "lanczos" and rank == 4:
            if align:
                _raise("lanczos does not support align_corners=True", "Lanczos mode does not support "
                       "align_corners=True", exc="ValueError", where="align_corners",
                       suggestions=["align_corners=None"])
            _raise("mode='lanczos' needs antialias=True, which nn.Upsample cannot pass (use F.interpolate)",
                   "Lanczos mode requires antialias=True", exc="ValueError", where="mode",
                   suggestions=["F.interpolate(..., mode='lanczos', antialias=True)", "mode='bicubic'"])
        if mode in _LINEAR:
            _raise(f"mode={mode!r} needs a {_LINEAR[mode]}-D input, got {rank}-D",
                   f"Got {rank}D input, but {mode} mode needs {_LINEAR[mode]}D input", exc="NotImplementedError",
                   rule="§8.2", where="mode", suggestions=[_fitting_mode(rank)])
    _raise(f"mode={mode!r} does not run on a {rank}-D input", "Input Error: Only 3D, 4D and 5D input Tensors "
           f"supported (got {rank}D) for the modes: {_MODES} (got {mode})", exc="NotImplementedError",
           rule="§8.2", where="mode", suggestions=[_fitting_mode(rank)] if rank in (3, 4, 5) else
           ["input (N, C, L), (N, C, H, W) or (N, C, D, H, W)"])


def _fitting_mode(rank: int) -> str:
    return {3: "mode='linear' or 'nearest'", 4: "mode='bilinear', 'bicubic' or 'nearest'",
            5: "mode='trilinear' or 'nearest'"}[rank]


def _size_fixes(spatial: Sequence[int], out: Sequence[int], scales: Optional[Sequence[float]]) -> List[str]:
    fixes = []
    if any(L <= 0 for L in spatial):
        fixes.append("input ≥ 1 in every spatial dim")
    if scales is not None and any(o <= 0 for o in out) and all(L > 0 for L in spatial):
        # The smallest 3-decimal scale whose double product reaches 1 in every dim.
        v = math.ceil(1000 / min(spatial)) / 1000
        while any(interpolate_out(L, v) < 1 for L in spatial):
            v += 0.001
        fixes.append(f"scale_factor ≥ {v:.3f} (so that every output is ≥ 1)")
    if any(o <= 0 for o in out):
        fixes.append("mode='area' (returns an empty tensor instead)")
    return fixes or ["size ≥ 1"]
