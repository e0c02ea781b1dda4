"""A ``torch.cat`` that fails because one operand was shaped wrong just before it.

* A feature map joined with flat features (image + tabular): ``cat`` of (B, C, H, W) and (B, F)
  raises on the rank. When a Linear of the model takes exactly C·H·W + F, the map was meant to be
  flattened: ``f.flatten(1)``. (Unsqueezing the flat side would also join, tiling it over pixels —
  another model.) Without such a Linear the rule names flatten and pooling and picks neither. A 3-D
  tensor is read as a sequence (B, T, D) when a Linear takes D + F: features per position, joined
  with a per-sample vector that is to be repeated over the T positions — a hint, no fix.
* A head's output reshaped by the wrong factor: ``cls.permute(0, 2, 3, 1).reshape(B, -1, A)`` of a
  conv with A·K channels, where ``reshape(B, -1, K)`` lines up with the box tensor it is joined to.
  Offered when the conv's channels are exactly the product of both, anchors × classes (the two
  factors swapped). A conv whose channels merely divide by another factor (a class conv built for
  2 anchors, where regrouping the *box* tensor would make the rows agree) is not this mistake.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.op_walk import back_to, int_args
from layerlab.probe.report import Diagnosis, FixStep


def _items(failed):
    seq = failed.args[0] if failed.args else failed.kwargs.get("tensors")
    if isinstance(seq, (list, tuple)) and len(seq) >= 2 and all(isinstance(t, torch.Tensor) for t in seq):
        return list(seq)
    return None


@register_rule("join/unflattened-map", stage="op", on=ops.JOINS, order=230)
def unflattened_map(ctx) -> Optional[Diagnosis]:
    """A feature map joined with flat features: the map was meant to be flattened (a Linear of the model takes
    C·H·W + F)."""
    failed = ctx.failed_op
    items = _items(failed)
    if items is None or failed.record.op not in ("cat", "concat", "concatenate"):
        return None
    ranks = [t.dim() for t in items]
    maps = [i for i, r in enumerate(ranks) if r >= 3]
    if len(maps) != 1 or any(r != 2 for i, r in enumerate(ranks) if i != maps[0]):
        return None
    dim = failed.args[1] if len(failed.args) > 1 else failed.kwargs.get("dim", 0)
    if dim not in (1, -1):
        return None
    m = maps[0]
    flat = math.prod(items[m].shape[1:])
    total = flat + sum(t.shape[1] for i, t in enumerate(items) if i != m)
    record = failed.record
    takers = [name for name, mod in ctx.recorder.root.named_modules()
              if isinstance(mod, torch.nn.Linear) and mod.in_features == total]
    per_position = total - flat + items[m].shape[-1]
    if items[m].dim() == 3 and not takers:
        return _per_position(ctx, failed, items, m, per_position)
    message = (f"cat{op_at(record)} joins tensors[{m}] {list(items[m].shape)}, a feature map, with flat "
               f"features {[list(t.shape) for i, t in enumerate(items) if i != m]}; {ctx.origin(f'tensors[{m}]', items[m]).text}")
    base = dict(expected="2-D tensors (B, features)", got=[list(t.shape) for t in items], cause="rank",
                rule="cat: every tensor of the same rank; features join on dim 1",
                alternatives=["not an unsqueeze of the flat features: tiling them over the pixels is another model"])
    if not takers:
        return Diagnosis(message + "; no Linear of the model takes the flattened sum",
                         hint=f"flatten the map first (tensors[{m}].flatten(1) → {flat} features) or pool it "
                              "(F.adaptive_avg_pool2d(…, 1).flatten(1)), and size the next Linear for the sum", **base)
    return Diagnosis(
        message + f"; `{takers[0]}` (Linear) takes {total} = {flat} + {total - flat}: the map was meant flattened",
        hint=f"flatten the map before the cat: tensors[{m}].flatten(1){op_at(record)} → [{items[m].shape[0]}, {flat}]",
        fix=FixStep("replace-op", record.source or "", f"tensors[{m}].flatten(1)",
                    op_site(record, rewrite="flatten-item", item=m)), **base)


def _per_position(ctx, failed, items, m, width) -> Optional[Diagnosis]:
    """``cat([h (B, T, D), cond (B, F)], dim=-1)`` before a Linear of ``D + F``: ``cond`` per position."""
    takers = [name for name, mod in ctx.recorder.root.named_modules()
              if isinstance(mod, torch.nn.Linear) and mod.in_features == width]
    if not takers:
        return None
    B, T, D = items[m].shape
    flats = [i for i in range(len(items)) if i != m]
    record = failed.record
    return Diagnosis(
        f"cat{op_at(record)} joins tensors[{m}] {list(items[m].shape)}, one vector of {D} per position (B, T, D), "
        f"with per-sample features {[list(items[i].shape) for i in flats]}; `{takers[0]}` (Linear) takes {width} "
        f"= {D} + {width - D}: one position's features and the per-sample ones",
        expected=f"every tensor (B, T, …) = ({B}, {T}, …)", got=[list(t.shape) for t in items], cause="rank",
        hint=f"repeat the per-sample features over the {T} positions before the cat: "
             + ", ".join(f"tensors[{i}][:, None].expand(-1, {T}, -1)" for i in flats),
        alternatives=[f"not a flatten of tensors[{m}]: {takers[0]} reads one position at a time"],
        rule="cat: every tensor of the same rank; features join on the last dim",
    )


@register_rule("join/reshape-factor", stage="op", on=ops.JOINS, order=240)
def reshape_factor(ctx) -> Optional[Diagnosis]:
    """A ``cat`` operand reshaped by the wrong factor just before it."""
    failed = ctx.failed_op
    items = _items(failed)
    if items is None or failed.record.op not in ("cat", "concat", "concatenate"):
        return None
    if len({t.dim() for t in items}) != 1 or items[0].dim() != 3:
        return None
    dim = failed.args[1] if len(failed.args) > 1 else failed.kwargs.get("dim", 0)
    if dim % 3 != 2 or len({t.shape[1] for t in items}) == 1:
        return None
    for j, t in enumerate(items):
        others = {o.shape[1] for i, o in enumerate(items) if i != j}
        if len(others) != 1:
            continue
        rows = others.pop()
        made, _ = back_to(ctx, t, {"reshape", "view"})
        sizes = int_args(made) if made is not None else []
        if len(sizes) != 3 or sizes[1] != -1 or t.numel() % (t.shape[0] * rows):
            continue
        last = t.numel() // (t.shape[0] * rows)
        conv = _channels(ctx, made)
        if conv is None or last == sizes[2] or conv[1] != last * sizes[2]:
            continue
        label, channels = conv
        shape = [sizes[0], -1, last]
        record = failed.record
        return Diagnosis(
            f"cat{op_at(record)} along the last dim needs the rows to agree, but tensors[{j}] has "
            f"{t.shape[1]} and the others {rows}; tensors[{j}] came from `{made.op}({', '.join(map(str, sizes))})`"
            f"{op_at(made)} of {label}'s {channels} channels = {channels // last} × {last}: grouped by {sizes[2]}, "
            f"not {last}",
            expected=[t.shape[0], rows, last], got=list(t.shape), cause="reshape-factor",
            hint=f"group the channels by {last}: {made.op}({', '.join(map(str, shape))}){op_at(made)} → "
                 f"[{t.shape[0]}, {rows}, {last}] (channels laid out as {channels // last} × {last}, e.g. anchors × classes)",
            fix=FixStep("replace-op", made.source or "", f"{made.op}({', '.join(map(str, shape))})",
                        op_site(made, rewrite="shape", shape=shape)),
            rule="a head's A·K channels reshape to (B, H·W·A, K): the per-anchor values last",
        )
    return None


def _channels(ctx, record):
    """``(label, channels)`` of the conv whose output the reshape read (through a permute)."""
    op_index, call_index = record.inputs[0].from_op, record.inputs[0].from_call
    for _ in range(3):
        move = ctx.op(op_index)
        if move is None or not move.inputs:
            break
        op_index, call_index = move.inputs[0].from_op, move.inputs[0].from_call
    call = ctx.call(call_index)
    if call is None:
        return None
    module = ctx.recorder.modules[call.index]
    if not isinstance(module, torch.nn.modules.conv._ConvNd):
        return None
    return f"`{call.label}` ({call.class_name})", module.out_channels
