"""A learned table shorter than the input: ``x + self.pos[:, :T]`` with ``T`` past ``max_len``.

The slice ``[:, :T]`` silently stops at the table's end, so the sum fails on broadcasting (20 vs 16)
— a message about shapes, not about the cause. When one operand is a slice of a model parameter, and
the parameter itself is shorter than the other operand on the clashing dim, the report says so: the
sequence is longer than the table; build the table for the longest input, or cut the input.
"""

from __future__ import annotations

from typing import Optional


def table_too_short(ctx, a, b, dim: int) -> Optional[str]:
    """A hint when ``a`` or ``b`` is a slice of a parameter shorter than the other operand on ``dim``."""
    for table, other in ((b, a), (a, b)):
        record = ctx.producer_op(table)
        if record is None or record.op != "__getitem__" or len(record.inputs) != 1:
            continue
        source = record.inputs[0]
        name = getattr(source, "parameter", None)
        if not name or len(source.shape) < -dim or other.dim() < -dim:
            continue
        have, need = source.shape[dim], other.shape[dim]
        if have >= need:
            continue
        return (f"the parameter `{name}` {source.shape} holds {have} positions on dim {dim}, "
                f"the input has {need}: the input is longer than the table — build it for at least {need} "
                f"(max_len ≥ {need}), or cut the input to {have}")
    return None
