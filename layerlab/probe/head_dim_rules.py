"""A per-position table built for the model width, applied to tensors split into heads.

Rotary cos/sin (or a sinusoidal table) made for ``d_model`` = H·d and multiplied with q of shape
(B, H, T, d) clashes on the last dim: 64 against 16 = 64 / 4 heads. The table must be built for
``head_dim`` (rotary acts per head). Slicing it to ``[..., :d]`` runs and silently uses the wrong
frequencies, so the rule gives no mechanical fix: the table is built where the model is. The 4-D
operand must be a head split, seen through the op trace: a ``view``/``reshape`` to (…, H, d) (then
axis moves) of a tensor H·d wide. A conv's (B, C, H, W) map scaled by a Linear C·W wide has the
same arithmetic and no heads: there the Linear's size is the bug.
"""

from __future__ import annotations

from typing import Optional

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_tensors, op_text
from layerlab.probe.op_walk import back_to
from layerlab.probe.report import Diagnosis


def _split_into_heads(ctx, t, h: int, d: int) -> bool:
    """``t`` is a ``view``/``reshape`` to (…, h, d) of a tensor h·d wide, through axis moves."""
    made, _ = back_to(ctx, t, {"view", "reshape"}, moves=True)
    if made is None or not made.inputs or not made.outputs or made.outputs[0] is None:
        return False
    return made.outputs[0][-2:] == [h, d] and made.inputs[0].shape[-1] == h * d


@register_rule("broadcast/table-for-model-width", stage="op", on=ops.BROADCAST, order=290)
def table_for_width(ctx) -> Optional[Diagnosis]:
    """A per-position table (rotary cos/sin) built for the model width, applied to tensors split into heads."""
    failed = ctx.failed_op
    tensors = [t for t in op_tensors(failed) if t.dim() > 0]
    if len(tensors) != 2:
        return None
    for heads, table in ((tensors[0], tensors[1]), (tensors[1], tensors[0])):
        if heads.dim() != 4 or heads.shape[1] < 2:
            continue
        h, d = heads.shape[1], heads.shape[-1]
        if table.shape[-1] != h * d or table.shape[-1] == d or not _split_into_heads(ctx, heads, h, d):
            continue
        record = failed.record
        return Diagnosis(
            f"`{op_text(record)}`{op_at(record)} meets {list(heads.shape)} = (B, H, T, d) with a table "
            f"{list(table.shape)} whose last dim {h * d} = {h} heads × {d}: it was built for the model width, "
            f"and the tensors are split into {h} heads of {d}; {ctx.origin('table', table).text}",
            expected=d, got=table.shape[-1], cause="head-dim",
            hint=f"build the table for the head dim: {d} (d_model // n_heads) — rotary cos/sin act per head; "
                 f"an additive table of width {h * d} belongs before the head split, on (B, T, {h * d})",
            alternatives=[f"not table[..., :{d}]: it runs with the wrong frequencies (rotate_half pairs dim i with "
                          f"i + {d // 2})"],
            rule=f"per-head ops see d = d_model / heads = {d} on the last dim",
        )
    return None
