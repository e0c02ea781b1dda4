"""Splitting the spec's batch across ranks: which dim of each input holds the samples, and rank r's part.

The batch dim of each input tensor comes from the Target's ``batch_dims:`` when the user gave them,
else from the layout inference every batch-aware check uses (:func:`layerlab.checks.layout.layout`:
the module's contract, then the shapes). Inputs without a batch dim (a causal mask, a position
table) go whole to every rank, as a DDP user passes them.

Shards are equal — ``B`` must be a multiple of the world size — because only then is the average of
the ranks' means the mean over the batch (a ``DistributedSampler(drop_last=True)`` does the same).
Rank ``r`` gets samples ``r·b … (r+1)·b − 1`` with ``b = B / world``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from torch import Tensor

from layerlab.errors import UsageError
from layerlab.target.bind import Arg, input_tensors

__all__ = ["BatchPlan", "plan", "shard_args"]


@dataclass(frozen=True)
class BatchPlan:
    """``batch``: the whole batch's size; ``dims``: input tensor path → batch dim (``None``: shared)."""

    batch: int
    world: int
    dims: Dict[str, Optional[int]]

    @property
    def per_rank(self) -> int:
        return self.batch // self.world


def plan(module: Any, args: List[Arg], batch_dims: Dict[str, Optional[int]], world: int) -> BatchPlan:
    """The batch layout of ``args`` and a check that it splits into ``world`` equal shards (exit 2 if not)."""
    from layerlab.checks.layout import describe, layout, unbatched_reason

    tensors = input_tensors(args)
    # batch_dims are given per argument name; a nested argument's tensors (hx[0]) inherit it
    named = {p: batch_dims[p.split("[", 1)[0]] for p, _ in tensors if p.split("[", 1)[0] in batch_dims}
    why = unbatched_reason(module, tensors, named)
    B, ids = layout(module, tensors, named)
    if why or B == 0:
        raise UsageError(f"no input has a batch dim to split across ranks{f': {why}' if why else ''}",
                         where="inputs", got={p: list(t.shape) for p, t in tensors},
                         hint="give the spec a batch (input: {shape: [8, …]}) or say where it is: "
                              "batch_dims: {x: 0}")
    if B % world or B < world:
        dims = describe(ids, tensors)
        at = next((f" (dim {d} of {p})" for p, d in dims.items() if d is not None), "")
        what = (f"a batch of {B}{at} cannot feed {world} ranks: each rank needs at least one sample" if B < world
                else f"a batch of {B}{at} does not split into {world} equal shards")
        raise UsageError(what, where="--nproc",
                         expected=f"a batch that is a multiple of {world}", got=B,
                         hint=f"use --input-shape with a batch of {max(world, B - B % world) or world} or "
                              f"--nproc that divides {B}: DDP's average equals the whole batch's mean only "
                              "on equal shards (DistributedSampler drops the remainder)")
    return BatchPlan(batch=B, world=world, dims=describe(ids, tensors))


def shard_args(args: List[Arg], plan: BatchPlan, rank: int) -> List[Arg]:
    """Rank ``rank``'s shard: every batched tensor narrowed to its ``b`` samples, the rest as they are."""
    b = plan.per_rank

    def cut(value: Any, path: str) -> Any:
        if isinstance(value, Tensor):
            d = plan.dims.get(path)
            if d is None or plan.world == 1:
                return value
            part = value.detach().narrow(d, rank * b, b).clone()
            return part.requires_grad_(value.requires_grad)
        if isinstance(value, (tuple, list)):
            items = [cut(v, f"{path}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if isinstance(value, tuple) else items
        if isinstance(value, dict):
            return {k: cut(v, f"{path}[{k!r}]") for k, v in value.items()}
        return value

    return [Arg(a.name, cut(a.value, a.name), a.keyword, a.no_grad) for a in args]
