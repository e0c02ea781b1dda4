"""A ``cat`` that grew a tensor along the wrong axis, seen where the result meets another operand.

A decoder's KV cache (B, H, T, d) extended with ``torch.cat([past_k, k], dim=1)`` doubles the
heads; the next ``q @ k.transpose(-2, -1)`` raises on the batch dims. When an operand of the
failing op came (through axis moves) from a ``cat`` of equal parts, the clashing axis is the one
the cat grew, and joining along exactly one other dim makes the failing op's shapes agree (checked
by replaying the moves and the op on meta tensors), that dim is the fix — and only when it is the
sequence axis of a cache, dim 2 of (B, H, T, d) or dim 1 of (B, T, D). A cat already along the
sequence is no cache bug: two segments joined along T meeting a positional table built for one
(a join along the batch would run, the table broadcasting over it), or a cache met by a query with
twice the heads (a join along the heads would run), are another operand's fault.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site, op_tensors, op_text
from layerlab.probe.op_walk import back_to, replay
from layerlab.probe.report import Diagnosis, FixStep


def _runs(failed, which: int, moved: torch.Tensor) -> bool:
    args = [torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
            for a in failed.args]
    positions = [i for i, a in enumerate(failed.args) if isinstance(a, torch.Tensor)]
    args[positions[which]] = moved
    try:
        failed.func(*args, **failed.kwargs)
    except Exception:  # noqa: BLE001 - the shapes still do not agree
        return False
    return True


@register_rule("cache/cat-grew-wrong-axis", stage="op", on=ops.MATMUL + ops.BROADCAST, order=280)
def grown_axis(ctx) -> Optional[Diagnosis]:
    """A ``cat`` grew a cache along the wrong axis (heads instead of the sequence); seen where it meets
    another operand."""
    failed = ctx.failed_op
    tensors = op_tensors(failed)
    if len(tensors) != 2 or len(failed.args) < 2:
        return None
    for which, t in enumerate(tensors):
        made, moves = back_to(ctx, t, {"cat", "concat", "concatenate"}, moves=True)
        if made is None or len(made.inputs) < 2:
            continue
        parts = [i.shape for i in made.inputs]
        if any(p != parts[0] for p in parts) or made.outputs[0] is None:
            continue
        rank = len(parts[0])
        dim = made.args.get("dim", made.args.get("1", 0))
        dim = dim % rank if isinstance(dim, int) else 0
        sequence = {4: 2, 3: 1}.get(rank)
        if sequence is None or dim == sequence:
            continue
        works: List[int] = []
        for d in range(rank):
            if d == dim:
                continue
            shape = list(parts[0])
            shape[d] *= len(parts)
            moved = replay(shape, moves)
            if moved is not None and _runs(failed, which, moved):
                works.append(d)
        if works != [sequence]:
            continue  # no join fits, several do, or the one that fits is not the sequence
        d = works[0]
        grown = list(parts[0])
        grown[d] *= len(parts)
        record = failed.record
        return Diagnosis(
            f"`{op_text(record)}`{op_at(record)} fails on {list(t.shape)}, which `{op_text(made)}`{op_at(made)} "
            f"grew along dim {dim} from {len(parts)} parts {parts[0]}; the other operand keeps dim {dim} at "
            f"{parts[0][dim]}: the join belongs on dim {d} (a cache grows along the sequence)",
            expected=grown, got=made.outputs[0], cause="cat-dim",
            hint=f"join along dim {d}: {made.op}(…, dim={d}){op_at(made)} → {grown} — and the same for every "
                 "tensor cached alike (keys and values)",
            fix=FixStep("replace-op", made.source or "", f"{made.op}(…, dim={d})", op_site(made, dim=d)),
            rule="a cat grows one axis; every later op sees that axis longer",
        )
    return None
