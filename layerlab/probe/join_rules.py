"""Three ways a join (``torch.stack`` / ``torch.cat``) fails for a reason upstream of it.

* **stack for cat.** ``torch.stack([a, b], dim=1)`` of ``(N, 16)`` and ``(N, 32)``: stack wants one
  shape, and the shapes differ on exactly one dim — what ``cat`` joins. ``cat(…, dim=d)`` is offered
  only when a layer that has not run yet takes the joined size (a head ``Linear(48, …)``); without that,
  stacking may be what was meant and one size is wrong (two conv scales of lengths 10 and 8, meant to be
  averaged per scale: cat would run and average across the scales). It is verified on a copy *alone*:
  if the layer after the join then fails, the verification says so instead of resizing on.
* **squeeze() ate the batch.** ``f = pool(x).squeeze()`` turns ``(1, C, 1, 1)`` into ``(C,)`` for a
  batch of one, and the next ``cat(…, dim=1)`` finds a 1-D tensor. The fix is at the squeeze: drop only
  the size-1 dims after the batch (``flatten(1)`` when they are the trailing ones).
* **features joined on purpose.** ``cat([conv_a(x), conv_b(x)], dim=1)`` failing on the length (a
  branch lost its padding): the makers put their features on the joined dim, so the odd length is the
  bug; ``cat(…, dim=2)`` would run and join the branches along time (:func:`features_joined`).
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.layout import made
from layerlab.probe.report import Diagnosis, FixStep


def operand_shapes(failed) -> Optional[List[list]]:
    """The shapes of a failed ``cat``/``stack``'s tensors (``None`` unless it joins two or more tensors)."""
    seq = failed.args[0] if failed.args else failed.kwargs.get("tensors")
    if not isinstance(seq, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in seq) or len(seq) < 2:
        return None
    return [list(t.shape) for t in seq]


@register_rule("join/stack-for-cat", stage="op", on=ops.STACK, order=430)
def stack_for_cat(ctx) -> Optional[Diagnosis]:
    """``torch.stack`` of tensors whose shapes differ on exactly one dim, where a layer after it takes the
    joined size: ``cat`` was meant."""
    failed = ctx.failed_op
    shapes = operand_shapes(failed)
    return _stack_for_cat(ctx, failed, shapes) if shapes is not None else None


@register_rule("join/squeezed-batch", stage="op", on=ops.JOINS + ops.STACK, order=431)
def squeezed_batch(ctx) -> Optional[Diagnosis]:
    """A cat whose lower-rank operand came from a bare ``squeeze()`` of a batch of one."""
    failed = ctx.failed_op
    shapes = operand_shapes(failed)
    return _squeezed_batch(ctx, failed, shapes) if shapes is not None else None


def _stack_for_cat(ctx, failed, shapes) -> Optional[Diagnosis]:
    record = failed.record
    if len({len(s) for s in shapes}) != 1:
        return None
    differ = [k for k in range(len(shapes[0])) if len({s[k] for s in shapes}) > 1]
    if len(differ) != 1:
        return None
    d = differ[0]
    out = list(shapes[0])
    out[d] = sum(s[d] for s in shapes)
    if not _consumer_takes(ctx, d, len(out), out[d]):
        return None  # nothing says the sizes are meant to add up: stacking may be right, one size wrong
    named = [(f"tensors[{i}]", t) for i, t in enumerate(failed.args[0])]
    return Diagnosis(
        f"stack needs tensors of one shape, got {shapes}: they differ only on dim {d}, which is what cat joins; "
        + ctx.origins(named),
        expected=shapes[0], got=shapes, cause="size",
        hint=f"to join them use torch.cat(…, dim={d}){op_at(record)} → {out}; if they are meant to be stacked, "
             "one of them has the wrong size",
        fix=FixStep("replace-op", record.source or "", f"torch.cat(…, dim={d})",
                    op_site(record, **{"with": "cat", "dim": d, "alone": True})),
        rule="stack: every tensor the same shape (a new dim is added); cat: sizes may differ along the joined dim",
    )


def _consumer_takes(ctx, d: int, rank: int, total: int) -> bool:
    """Whether a layer that has not run yet takes ``total`` features on the joined dim: a Linear's
    ``in_features`` when it is the last dim, a conv's or norm's channels when it is dim 1."""
    ran = {id(m) for m in ctx.recorder.modules}
    for module in ctx.recorder.root.modules():
        if id(module) in ran:
            continue
        if d == rank - 1 and isinstance(module, nn.Linear) and module.in_features == total:
            return True
        size = getattr(module, "in_channels", None) or getattr(module, "num_features", None)
        if d == 1 and rank >= 3 and size == total:
            return True
    return False


def _squeezed_batch(ctx, failed, shapes) -> Optional[Diagnosis]:
    record = failed.record
    for operand, shape in zip(record.inputs, shapes):
        maker = ctx.op(operand.from_op)
        if maker is None or maker.op != "squeeze" or maker.args or not maker.inputs:
            continue
        before = maker.inputs[0].shape
        if len(before) < 2 or before[0] != 1 or len(shape) >= max(len(s) for s in shapes):
            continue
        ones = [k for k in range(1, len(before)) if before[k] == 1]
        trailing = ones == list(range(len(before) - len(ones), len(before)))
        code = "flatten(1)" if trailing else f"squeeze({tuple(ones)})"
        who = maker.receiver or "x"
        return Diagnosis(
            f"cat needs tensors with the same number of dims, got shapes {shapes}: {operand.name} {shape} is "
            f"`{who}.squeeze()`{op_at(maker)} of {before}, and squeeze() also dropped the batch dim (batch size 1)",
            expected=f"{[1, *[before[k] for k in range(1, len(before)) if before[k] != 1]]}", got=shape, cause="rank",
            hint=f"squeeze only the dims after the batch: {who}.{code}{op_at(maker)} (a batch of 1 then keeps its dim)",
            fix=FixStep("replace-op", maker.source or "", f"{who}.{code}", op_site(maker, squeeze_dims=ones)),
            rule="squeeze() drops every size-1 dim, the batch's too when N = 1",
        )
    return None


def features_joined(ctx, record, seq, dim: int, works: list, clash: list, base: str, shapes) -> Optional[Diagnosis]:
    """A cat along the very axis where every operand's maker puts its features (conv maps on dim 1,
    Linear outputs last) failing on another axis: joining the features is meant, and the odd size is
    a bug upstream (a padding, a stride). ``cat(…, dim=d)`` on the one axis that "works" would run and
    join two branches along time, so it is only named."""
    if not works or works[0] == dim:
        return None
    labels = []
    for t in seq:
        side, label = made(ctx, t)
        if side is None or dim != (1 if side == "first" else t.dim() - 1):
            return None
        labels.append(label)
    return Diagnosis(
        f"{base}; {labels[0]} puts its features on dim {dim}, the dim joined: joining the features is meant, and "
        f"the sizes on dim {clash[0]} differ — a size bug upstream (a padding, a stride, a length), not the cat's dim",
        expected=f"equal sizes except dim {dim}", got=shapes, cause="size",
        hint=f"make the operands agree on dim {clash[0]} (the padding or stride of the layer that made the odd one)",
        alternatives=[f"{record.op}(…, dim={works[0]}) runs, but joins them along dim {works[0]}, not their features"],
        rule="cat: sizes may differ only along the joined dim",
    )
