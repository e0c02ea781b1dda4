"""PixelShuffle / PixelUnshuffle: the output size and where torch raises (shape_rules.md §9).

Shape (every dim before the last three is a batch dim, any number of them)::

    PixelShuffle(r):    (*, C·r², H, W)  →  (*, C, H·r, W·r)
    PixelUnshuffle(r):  (*, C, H·r, W·r) →  (*, C·r², H, W)

Checks, in order: at least 3 dims → ``r > 0`` → shuffle: ``C % r² == 0``; unshuffle:
``H % r == 0`` then ``W % r == 0``.

Quirk (torch 2.13, CPU): PixelUnshuffle of an *empty* tensor (any dim 0) passes the checks and
returns a tensor of the input's shape unchanged, not ``(*, C·r², H/r, W/r)``.
"""

from __future__ import annotations

import math
from typing import Any, Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.result import DimStep, Explanation, ShapeNote


def _raise(message: str, torch_message: str, **kw: Any) -> None:
    raise TorchWouldRaise(message, torch_exception="RuntimeError", torch_message=torch_message, rule="§9", **kw)


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """Pixel (un)shuffle: C/H/W steps and the output shape; raise where torch raises."""
    shuffle = spec.name == "pixel_shuffle"
    fn = spec.name
    arg = "upscale_factor" if shuffle else "downscale_factor"
    r = params[arg]
    if isinstance(r, bool) or not isinstance(r, int):
        raise UsageError(f"{arg} must be an int", where=arg, got=r)
    if len(shape) < 3:
        _raise(f"{fn} needs (*, C, H, W): at least 3 dims, got {len(shape)}",
               f"{fn} expects input to have at least 3 dimensions, but got input with {len(shape)} dimension(s)",
               where="input", expected="≥ 3 dims", got=len(shape), suggestions=["input (N, C, H, W) or (C, H, W)"])
    if r <= 0:
        _raise(f"{arg} must be ≥ 1", f"{fn} expects a positive {arg}, but got {r}", where=arg,
               expected="≥ 1", got=r, suggestions=[f"{arg} ≥ 1"])
    C, H, W = shape[-3:]
    batch = shape[:-3]
    if shuffle:
        if C % (r * r):
            lo, hi = (C // (r * r)) * r * r, (C // (r * r) + 1) * r * r
            _raise(f"channels {C} are not divisible by upscale_factor² = {r * r}",
                   f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of "
                   f"upscale_factor, but input.size(-3)={C} is not divisible by {r * r}", where="C",
                   expected=f"a multiple of {r * r}", got=C,
                   suggestions=[f"C = {hi}" if lo == 0 else f"C = {lo} or {hi}"]
                   + [f"upscale_factor={f}" for f in _divisor_roots(C) if f > 1][:2])
        out = (C // (r * r), H * r, W * r)
        ex.steps += [
            DimStep("C", C, "C / r²", f"{C} / {r}² = {C} / {r * r}", out[0], {"r": r}),
            DimStep("H", H, "H · r", f"{H} · {r}", out[1], {"r": r}),
            DimStep("W", W, "W · r", f"{W} · {r}", out[2], {"r": r}),
        ]
    else:
        for name, size, idx in (("H", H, -2), ("W", W, -1)):
            if size % r:
                word = "height" if name == "H" else "width"
                _raise(f"{word} {size} is not divisible by downscale_factor {r}",
                       f"pixel_unshuffle expects {word} to be divisible by downscale_factor, but "
                       f"input.size({idx})={size} is not divisible by {r}", where=name,
                       expected=f"a multiple of {r}", got=size,
                       suggestions=[f"{name} = {size - size % r or r} or {size - size % r + r}"])
        out = (C * r * r, H // r, W // r)
        ex.steps += [
            DimStep("C", C, "C · r²", f"{C} · {r}²", out[0], {"r": r}),
            DimStep("H", H, "H / r", f"{H} / {r}", out[1], {"r": r}),
            DimStep("W", W, "W / r", f"{W} / {r}", out[2], {"r": r}),
        ]
        if math.prod(shape) == 0 and r > 1:
            ex.notes.append(ShapeNote(
                "info", "the input is empty: torch's pixel_unshuffle returns it with its shape unchanged "
                f"({tuple(shape)}), not {batch + out}.", data={"arithmetic": batch + out}))
            out = (C, H, W)
    ex.output_shape = batch + out


def _divisor_roots(C: int) -> list:
    """Factors ``f`` with ``f² | C`` (the upscale factors this channel count allows)."""
    return [f for f in range(1, math.isqrt(max(C, 0)) + 1) if C % (f * f) == 0] if C > 0 else []
