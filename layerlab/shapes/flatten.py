"""nn.Flatten(start_dim=1, end_dim=-1) — ``input.flatten(start_dim, end_dim)`` (shape_rules.md §10).

* With ``n = max(input.dim(), 1)`` each of ``start_dim`` / ``end_dim`` must lie in ``[−n, n−1]``
  (``start_dim`` is checked first), else ``IndexError: Dimension out of range (expected to be in
  range of [-n, n-1], but got X)``. So ``nn.Flatten()`` fails on a 1-D input: dim 1 does not exist.
* After wrapping negative values, ``start > end`` →
  ``RuntimeError: flatten() has invalid args: start_dim cannot come after end_dim``.
* Output ``shape[:start] + (prod(shape[start:end+1]),) + shape[end+1:]``; a 0-d input gives ``(1,)``.
"""

from __future__ import annotations

from typing import Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.result import DimStep, Explanation, ShapeNote


def _wrap(dim: int, n: int, name: str) -> int:
    if not -n <= dim <= n - 1:
        raise TorchWouldRaise(
            f"{name}={dim} is not a dim of a {n}-D tensor" if n > 1 else f"{name}={dim}: the input has one dim only",
            torch_exception="IndexError",
            torch_message=f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})",
            rule="§10", where=name, expected=f"{-n} … {n - 1}", got=dim,
            suggestions=[f"{name}={max(min(dim, n - 1), -n)}"],
        )
    return dim % n


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """``input.flatten(start_dim, end_dim)``."""
    start, end = params["start_dim"], params["end_dim"]
    for name, v in (("start_dim", start), ("end_dim", end)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise UsageError(f"{name} must be an int", where=name, got=v)
    n = max(len(shape), 1)
    s, e = _wrap(start, n, "start_dim"), _wrap(end, n, "end_dim")
    if s > e:
        raise TorchWouldRaise(
            f"start_dim={start} is dim {s} and end_dim={end} is dim {e}: the range is empty",
            torch_exception="RuntimeError",
            torch_message="flatten() has invalid args: start_dim cannot come after end_dim",
            rule="§10", where="start_dim", got=[start, end], suggestions=[f"start_dim={e}", f"end_dim={s}"],
        )
    if not shape:
        ex.output_shape = (1,)
        ex.notes.append(ShapeNote("info", "a 0-d tensor flattens to shape (1,)", severity="info"))
        return
    merged = shape[s:e + 1]
    size = 1
    for v in merged:
        size *= v
    if size > (1 << 63) - 1:  # only possible when another dim is 0 (else the input could not exist)
        raise TorchWouldRaise(
            f"the merged size {' · '.join(map(str, merged))} = {size} does not fit in a 64-bit integer",
            torch_exception="RuntimeError", torch_message="Stride calculation overflowed", rule="§10",
            where="start_dim", got=size, suggestions=["flatten fewer dims"])
    ex.steps.append(DimStep(
        f"{s}..{e}" if s != e else str(s), None, f"prod(shape[{s}:{e + 1}])",
        " · ".join(str(v) for v in merged), size, {"start_dim": s, "end_dim": e}))
    ex.output_shape = shape[:s] + (size,) + shape[e + 1:]
    if s == e:
        ex.notes.append(ShapeNote("info", "start_dim and end_dim name the same dim: the shape is unchanged",
                                  severity="info"))
