"""Other inputs than the example: how export-check tells a general program from an input-specific one.

A trace records what one input did. Run the traced program on an input of another batch size,
another length, or other values, next to eager on that same input: if eager runs and the traced
program raises or disagrees, the trace baked in a shape or a Python branch. The variants:

* ``batch``: every batched input one sample larger (batch dims as gradcheck guesses them, or the
  spec's ``batch_dims:``); floating inputs drawn afresh, integer ids and masks extended by
  repeating their first sample (so ids stay in range and masks stay valid).
* ``length``: the example's length one shorter (``T → T − 1``; ``L → L + 1`` when ``L ≤ 2``) along the
  time dim of a sequence (``batch_first`` decides (B, T, E) or (T, B, E)), the last dim of a
  channels-first 3-D input (B, C, L), or every spatial dim of a 4-D/5-D input. Every other input
  dim of the same size changes with it (a (T, T) mask, a key of the same length); masks and
  integers are cut (or extended), floats drawn afresh.
* ``values``: the same shapes, floating inputs negated: a branch on a sign (``if x.sum() > 0``)
  takes its other side.

Legend: B batch · T time (sequence position) · E features · C channels · L length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

from layerlab.checks.case import Arg, Case, batch_layout, flatten, has_batch_first, is_mask_name, map_tensors, seed_for

__all__ = ["Variant", "make_variants"]


@dataclass
class Variant:
    """Inputs that differ from the example in one way."""

    name: str
    description: str
    args: List[Arg]


def _map(args: Sequence[Arg], fn: Callable[[str, Tensor], Tensor]) -> List[Arg]:
    """Apply ``fn(arg_name, tensor)`` to every tensor; one tensor passed twice maps to one result."""
    memo: Dict[int, Any] = {}
    return [Arg(a.name, map_tensors(a.value, lambda t, name=a.name: fn(name, t), memo), a.keyword) for a in args]


def _tensors(args: Sequence[Arg]) -> List[tuple]:
    """``[(arg_name, tensor)]`` of every tensor in the arguments."""
    return [(a.name, t) for a in args for _, t in flatten(a.value)]


def _fresh(name: str, t: Tensor) -> bool:
    """Floating data inputs get new random values; masks and integers are cut or extended."""
    return t.is_floating_point() and not is_mask_name(name)


def _resize(t: Tensor, sizes: Dict[int, int], fresh: bool, gen: torch.Generator) -> Tensor:
    if not sizes:
        return t
    shape = list(t.shape)
    for d, n in sizes.items():
        shape[d] = n
    if fresh:
        return torch.randn(shape, generator=gen, dtype=t.dtype).to(t.device)
    out = t
    for d, n in sizes.items():
        have = out.shape[d]
        if n <= have:
            out = out.narrow(d, 0, n)
        else:
            reps = [out] + [out.narrow(d, 0, 1)] * (n - have)
            out = torch.cat(reps, dim=d)
    return out.clone()


def make_variants(module: nn.Module, args: Sequence[Arg], *, seed: int = 0,
                  batch_dims: Optional[Dict[str, Optional[int]]] = None,
                  tags: frozenset = frozenset()) -> List[Variant]:
    """The ``batch``, ``length`` and ``values`` variants of ``args`` that apply (see the module doc)."""
    case = Case(module=module, args=list(args), target="", tags=tags, batch_dims=dict(batch_dims or {}))
    B, dims = batch_layout(case, args)
    out: List[Variant] = []
    gen = torch.Generator().manual_seed(seed_for(seed, 101))
    if B:
        out.append(Variant("batch", f"batch {B + 1} (was {B})", _map(args, lambda n, t: _resize(
            t, {dims[id(t)]: B + 1} if dims.get(id(t)) is not None else {}, _fresh(n, t) and dims.get(id(t)) is not None,
            gen))))
    length = _length_variant(module, args, dims, gen)
    if length is not None:
        out.append(length)
    if any(_fresh(n, t) for n, t in _tensors(args)):
        out.append(Variant("values", "inputs negated", _map(args, lambda n, t: -t if _fresh(n, t) else t)))
    return out


def _length_dims(module: nn.Module, t: Tensor) -> List[int]:
    """The dims of the primary input that are a length: time, L, or H/W/D."""
    if has_batch_first(module):
        first = next((m for m in module.modules() if isinstance(getattr(m, "batch_first", None), bool)), module)
        if t.dim() == 3:
            return [1 if first.batch_first else 0]
        return [0] if t.dim() == 2 else []
    if t.dim() == 3:
        return [2]
    if t.dim() >= 4:
        return list(range(2, t.dim()))
    return []


def _length_variant(module: nn.Module, args: Sequence[Arg], dims: Dict[int, Optional[int]],
                    gen: torch.Generator) -> Optional[Variant]:
    primary = next(((n, t) for n, t in _tensors(args) if _fresh(n, t) and t.dim() >= 2), None)
    if primary is None:
        return None
    name, t = primary
    which = [d for d in _length_dims(module, t) if d != dims.get(id(t))]
    if not which:
        return None
    new = {t.shape[d]: (t.shape[d] - 1 if t.shape[d] > 2 else t.shape[d] + 1) for d in which}

    def resize(n: str, x: Tensor) -> Tensor:
        if x is t:
            sizes = {d: new[x.shape[d]] for d in which}
        else:
            skip = dims.get(id(x))
            sizes = {d: new[s] for d, s in enumerate(x.shape) if s in new and d != skip}
        return _resize(x, sizes, _fresh(n, x), gen) if sizes else x

    text = ", ".join(f"{old} → {n}" for old, n in new.items())
    return Variant("length", f"length {text}", _map(args, resize))
