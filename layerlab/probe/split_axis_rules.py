"""A tensor split in two along the batch where its features were meant: ``h.chunk(2, dim=0)``.

Legend: N batch, k chunks, F features per chunk.

A VAE's encoder ends in ``Linear(…, 2·F)`` and ``mu, logvar = h.chunk(2, dim=0)`` halves the batch
instead of the features: ``mu`` is ``(N/k, 2·F)``, the decoder's ``Linear(F, …)`` fails. The Linear
rule sees that the batch left dim 0 ("batch-axis") but not where. This rule follows the Linear's
input back through shape-keeping ops (``mu + eps · std``) to a ``chunk`` along dim 0 of a tensor
``(N, k·F)`` — the batch first, and ``k`` pieces of the Linear's ``F`` along the last dim — and
gives the chunk along the last dim. ``in_features = 2·F`` would run too, with half the samples
(and each "sample" holding two): never offered.

A chunk along dim 0 is also how two views stacked in one batch are split on purpose (contrastive
learning), and a head built for half the features then fails the same way. So the rule asks for
what only a feature split does: two pieces of the chunk meet again, elementwise, on the way to the
Linear (``mu + eps · exp(logvar / 2)``: two halves of one sample's features). A piece that reaches
the Linear alone gets the Linear rule's diagnosis.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import op_at, op_site, op_text
from layerlab.probe.report import Diagnosis, FixStep

_STEPS = 8


@register_rule("batch/chunked-batch", stage="refine", order=30)
def chunked_batch(ctx) -> Optional[Diagnosis]:
    """Refine a "batch-axis" diagnosis whose input was cut from a ``chunk`` along dim 0."""
    found = ctx.found
    x = ctx.args[0] if ctx.args else None
    if found.cause != "batch-axis" or not isinstance(ctx.module, nn.Linear) or not isinstance(x, torch.Tensor):
        return None
    F = ctx.module.in_features
    N = x.numel() // F  # the batch the Linear rule found: the elements make exactly N rows of in_features
    record = _chunk_behind(ctx, x)
    if record is None or not record.inputs:
        return None
    source = record.inputs[0].shape
    k = record.args.get("1", record.args.get("chunks"))
    dim = record.args.get("dim", record.args.get("2", 0))
    if not isinstance(k, int) or not isinstance(dim, int) or dim % len(source) != 0 or len(source) != 2:
        return None
    if source[0] != N or source[1] % k or source[1] // k != F:
        return None
    if _pieces_met(ctx, x, record) < 2:
        return None  # one piece alone: the batch may be two stacked views, split on purpose
    code = f"chunk({k}, dim=-1)"
    found.message = (f"{found.message.split(';')[0]}; `{op_text(record)}`{op_at(record)} cut its input {source} "
                     f"into {k} along dim 0, the batch ({N}), where the {k}·{F} features on the last dim are "
                     f"what is to be split")
    found.hint = f"split the features, not the batch: {code}{op_at(record)} → {k} × [{N}, {F}]"
    found.fix = FixStep("replace-op", record.source or "", code, op_site(record, dim=-1, keep_args=2))
    found.alternatives = [f"in_features={source[1]} would run, with {source[0] // k} rows for a batch of {N}"]
    found.cause = "split-axis"
    return found


def _pieces_met(ctx, x, chunk) -> int:
    """How many operands of the ops that made ``x`` (within a few steps back) are pieces of ``chunk``."""
    start = ctx.made_by(x)[0]
    seen, todo, pieces = set(), [start], 0
    while todo and len(seen) < 2 * _STEPS:
        index = todo.pop()
        record = ctx.op(index) if index is not None and index not in seen else None
        if record is None:
            continue
        seen.add(index)
        if record.index == chunk.index:
            continue
        for operand in record.inputs:
            if operand.from_op == chunk.index:
                pieces += 1
            elif operand.from_op is not None:
                todo.append(operand.from_op)
    return pieces


def _chunk_behind(ctx, x):
    """The ``chunk`` op that ``x`` was made from, through ops that keep its shape."""
    op_index = ctx.made_by(x)[0]
    shape = list(x.shape)
    for _ in range(_STEPS):
        record = ctx.op(op_index)
        if record is None:
            return None
        if record.op == "chunk":
            return record
        same = [i for i in record.inputs if i.shape == shape and i.from_op is not None]
        if not same:
            return None
        op_index = same[0].from_op
    return None
