"""A graph's ``edge_index`` given as (E, 2) where message passing reads (2, E).

``src, dst = edge_index[0], edge_index[1]`` on an (E, 2) tensor takes the two nodes of the first
edge (and of the second) instead of the E sources and targets; ``h[src]`` then has 2 rows, and
the first op that meets a per-edge tensor (E weights) raises. When the short operand was gathered
with a row of a 2-D model input of shape (E, 2) and E is the clashing size, the fix is that
input's transpose, ``edge_index.t()`` — PyTorch Geometric's (2, E) layout. The per-edge operand must
have the gathered tensor's rank, so that its dim 0 meets the E gathered rows: a lower-rank one meets
a trailing axis, and the (E, 2) may be coordinates for a 2-D lookup (``vol[pos[:, 0], pos[:, 1]]``).
"""

from __future__ import annotations

from typing import Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_tensors, op_text
from layerlab.probe.report import Diagnosis, FixStep


def _row_of_input(ctx, op_index):
    """The (E, 2) shape of the model input a ``x[0]``/``x[1]`` row was taken from, else ``None``."""
    record = ctx.op(op_index)
    if record is None or record.op not in ("__getitem__", "select") or len(record.inputs) != 1:
        return None
    source = record.inputs[0]
    if source.from_op is not None or source.from_call is not None or len(source.shape) != 2 or source.shape[1] != 2:
        return None
    return source.shape


def _root_argument(ctx, shape):
    """Where the model was given the tensor of ``shape``: ``(position or keyword)``, if exactly one."""
    path, args, kwargs = ctx.outer[0] if ctx.outer else (ctx.path, ctx.args, ctx.kwargs)
    if path:
        return None
    found = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and list(a.shape) == list(shape)]
    found += [k for k, a in kwargs.items() if isinstance(a, torch.Tensor) and list(a.shape) == list(shape)]
    return found[0] if len(found) == 1 else None


@register_rule("layout/edge-index-transposed", stage="op", on=ops.BROADCAST, order=270)
def edge_index_layout(ctx) -> Optional[Diagnosis]:
    """A graph's ``edge_index`` given as (E, 2) where message passing reads (2, E): ``edge_index.t()``."""
    failed = ctx.failed_op
    tensors = op_tensors(failed)
    if len(tensors) != 2:
        return None
    for t, other in ((tensors[0], tensors[1]), (tensors[1], tensors[0])):
        gather = ctx.producer_op(t)
        if gather is None or gather.op != "__getitem__" or len(gather.inputs) != 2:
            continue
        index = gather.inputs[1]
        shape = _row_of_input(ctx, index.from_op) if len(index.shape) == 1 and index.shape[0] == 2 else None
        if shape is None or other.dim() != t.dim() or shape[0] != other.shape[0] or t.shape[0] != 2:
            continue
        record = failed.record
        key = _root_argument(ctx, shape)
        return Diagnosis(
            f"`{op_text(record)}`{op_at(record)} meets {list(t.shape)} with {list(other.shape)}: the 2 rows came "
            f"from `{op_text(gather)}`{op_at(gather)}, indexed by a row of a model input {shape} — an edge list "
            f"(E, 2) = ({shape[0]}, 2) read as (2, E): its row 0 is the first edge's two nodes, not the {shape[0]} "
            "sources",
            expected=[2, shape[0]], got=shape, cause="layout",
            hint=f"pass the edges as (2, E): edge_index.t() → [2, {shape[0]}] (PyTorch Geometric's layout), or "
                 "take columns: edge_index[:, 0], edge_index[:, 1]",
            fix=FixStep("permute-input", "", "edge_index.t()", {"arg": key, "dims": [1, 0]}) if key is not None else None,
            alternatives=["not a slice or expand of the per-edge tensor: the messages would still come from 2 nodes"],
            rule="message passing: edge_index (2, E), row 0 the sources, row 1 the targets",
        )
    return None
