"""A padding mask built for the tokens, passed after extra positions were joined to the sequence.

Legend: N batch, T the tokens' length (the mask's), j extra positions, S = T + j keys.

A classifier prepends a learned CLS token (``torch.cat([cls.expand(N, -1, -1), x], dim=1)``), or
appends memory/register tokens, and then passes the tokenizer's padding mask ``(N, T)`` as
``key_padding_mask``; nn.MultiheadAttention wants ``(N, S)``. The generic rule says the mask must be
``(N, S)``; this one finds the ``cat`` along the sequence that made the keys ``j`` positions longer,
and whether the extra positions went before or after the tokens. Those positions are real (they
are not padding), so the mask gets ``j`` columns of "keep" (``False``, or ``0.`` for an additive
float mask) on that side, written where the user passes the mask. Padding the mask on the other
side, or cutting the sequence back to ``T``, would run and hide or drop the wrong positions: never
offered. Extra positions on both sides, or no such ``cat``: the generic diagnosis stays. So too when
the extra positions are not learned tokens — a parameter expanded over the batch (``cls.expand(N, -1,
-1)``, ``.repeat``): a second token sequence joined to the first (question + context) has padding of its
own, and "keep" columns would attend to it.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import op_at
from layerlab.probe.report import Diagnosis, FixStep

#: Steps followed back from the keys to the ``cat`` (through shape-keeping ops and modules).
_STEPS = 6


@register_rule("mask/mask-before-prefix-token", stage="refine", order=40)
def mask_before_prefix(ctx) -> Optional[Diagnosis]:
    """Refine MultiheadAttention's "key_padding_mask must be (N, S)" when a ``cat`` added the extra keys."""
    found = ctx.found
    m = ctx.module
    if not isinstance(m, nn.MultiheadAttention) or found.cause != "mask-shape" \
            or not found.message.startswith("key_padding_mask"):
        return None
    key, kpm = ctx.arg("key", 1), ctx.arg("key_padding_mask", 3)
    if not isinstance(key, torch.Tensor) or not isinstance(kpm, torch.Tensor) or key.dim() != 3 or kpm.dim() != 2:
        return None
    seq_dim = 1 if m.batch_first else 0
    S, T = key.shape[seq_dim], kpm.shape[1]
    if T >= S:
        return None
    joined = _joining_cat(ctx, key, seq_dim)
    if joined is None:
        return None
    record, before, after = joined
    if (before, after) not in ((S - T, 0), (0, S - T)):
        return None  # extra positions on both sides, or the tokens' part is not T long: not this case
    sizes = [i.shape[seq_dim] for i in record.inputs]
    longest = max(range(len(sizes)), key=lambda i: sizes[i])
    batch_dim = 0 if m.batch_first else 1
    if not all(_learned_tokens(ctx, part, batch_dim) for i, part in enumerate(record.inputs) if i != longest):
        return None  # the extra positions are data of their own (with their own padding): not keep columns
    j, front = S - T, before > 0
    where, arg, name = _passed_by_user(ctx, kpm)
    side = "before" if front else "after"
    zeros = f"{name}.new_zeros({kpm.shape[0]}, {j})"
    code = f"torch.cat([{zeros}, {name}], dim=1)" if front else f"torch.cat([{name}, {zeros}], dim=1)"
    return Diagnosis(
        f"key_padding_mask {list(kpm.shape)} has one column per token ({T}), but the keys have {S} positions: "
        f"`cat(dim={record.args.get('dim', seq_dim)})`{op_at(record)} put {j} position{'s' * (j > 1)} {side} the "
        f"tokens (a CLS or extra token) after the mask was built",
        expected=[kpm.shape[0], S], got=list(kpm.shape), cause="mask-shape",
        hint=f"give the mask {j} column{'s' * (j > 1)} of keep (False) {side} the tokens: {code}"
             + (f" before {where}" if where else ""),
        fix=FixStep("cast-input", where, code, {"arg": arg, "to": f"keep:{'front' if front else 'back'}:{j}"}),
        alternatives=[f"padding the mask on the other side, or cutting the sequence back to {T}, would run but mask "
                      "or drop the wrong positions"],
        rule="key_padding_mask (N, S): one column per key, True = ignore",
    )


def _joining_cat(ctx, t: torch.Tensor, seq_dim: int) -> Optional[Tuple[object, int, int]]:
    """``(cat record, positions before, positions after the longest part)`` of the ``cat`` along the
    sequence that made ``t`` (looking back through shape-keeping ops and modules)."""
    op_index, call_index = ctx.made_by(t)
    shape = list(t.shape)
    for _ in range(_STEPS):
        record = ctx.op(op_index)
        if record is not None:
            if record.op in ("cat", "concat", "concatenate"):
                dim = record.args.get("dim", record.args.get("1", 0))
                if not isinstance(dim, int) or dim % len(shape) != seq_dim:
                    return None
                sizes = [i.shape[seq_dim] for i in record.inputs]
                longest = max(range(len(sizes)), key=lambda i: sizes[i])
                return record, sum(sizes[:longest]), sum(sizes[longest + 1:])
            same = [i for i in record.inputs if i.shape == shape]
            if not same:
                return None
            op_index, call_index = same[0].from_op, same[0].from_call
            continue
        call = ctx.call(call_index)
        if call is None or not call.tensor_inputs or call.tensor_inputs[0].shape != shape:
            return None
        op_index, call_index = None, call.tensor_inputs[0].source
    return None


#: Ops that spread one learned token over the batch.
_SPREADS = ("expand", "expand_as", "repeat", "broadcast_to", "tile")


def _learned_tokens(ctx, part, batch_dim: int) -> bool:
    """The operand ``part`` of the cat is a tensor with batch size 1 spread over the batch (a learned
    CLS/register token), seen through shape-keeping ops."""
    op_index = part.from_op
    for _ in range(_STEPS):
        record = ctx.op(op_index)
        if record is None or not record.inputs:
            return False
        if record.op in _SPREADS:
            source = record.inputs[0].shape
            return len(source) > batch_dim and source[batch_dim] == 1
        same = [i for i in record.inputs if i.shape == record.outputs[0]]
        if not same:
            return False
        op_index = same[0].from_op
    return False


def _passed_by_user(ctx, kpm: torch.Tensor):
    """``(path, key, name)`` of the outermost call given a padding mask of ``kpm``'s shape: the user's
    own call (nn.TransformerEncoder turns a bool mask into a float one before its layers see it)."""
    for path, args, kwargs in ctx.outer:
        for name, value in kwargs.items():
            if "key_padding_mask" in name and isinstance(value, torch.Tensor) and value.shape == kpm.shape:
                return path, name, name
    return ctx.passed_at(kpm, "key_padding_mask", 3, unnamed="mask")
