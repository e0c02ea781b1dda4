"""Walk back from a tensor through the op trace to the op that made it what it is.

Rules that blame an op *upstream* of the one that raised (the ``cat`` that grew a cache on the
wrong axis, the ``cosine_similarity`` that reduced the batch, the ``reshape`` that split channels
by the wrong factor) need the record of that op, seen through the harmless ops in between: a
softmax, a division by a scalar, a ``transpose`` that only moves axes. :func:`back_to` follows one
operand at a time and returns the record with the axis moves passed on the way, so that a rule can
replay them on the shape it proposes.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch

from layerlab.probe.context import ORIGIN_STEPS
from layerlab.probe.layout import AXIS_MOVES
from layerlab.probe.report import OpRecord


def _same_shape_input(record: OpRecord):
    """The input an elementwise op passed its shape on from (``attn / s``, ``scale * sim``)."""
    out = record.outputs[0] if record.outputs else None
    same = [i for i in record.inputs if i.shape == out]
    return same[0] if len(same) >= 1 and len(record.inputs) - len(same) <= 1 else None


def back_to(ctx, t: torch.Tensor, ops: Iterable[str], moves: bool = False,
            steps: int = ORIGIN_STEPS) -> Tuple[Optional[OpRecord], List[OpRecord]]:
    """``(record, passed)``: the nearest op named in ``ops`` that made ``t``, through shape-keeping
    ops (and axis moves when ``moves``); ``passed`` are the axis moves met, nearest first. ``(None, [])``
    when a module, a model input or another op comes first."""
    ops = set(ops)
    op_index = ctx.made_by(t)[0]
    passed: List[OpRecord] = []
    for _ in range(steps):
        record = ctx.op(op_index)
        if record is None:
            return None, []
        if record.op in ops:
            return record, passed
        if moves and record.op in AXIS_MOVES and len(record.inputs) == 1:
            passed.append(record)
            op_index = record.inputs[0].from_op
            continue
        source = _same_shape_input(record)
        if source is None:
            return None, []
        op_index = source.from_op
    return None, []


def int_args(record: OpRecord) -> List[int]:
    """The positional int arguments of a record (``transpose(-2, -1)`` → ``[-2, -1]``)."""
    out = []
    for k, v in sorted(((k, v) for k, v in record.args.items() if k.isdigit()), key=lambda kv: int(kv[0])):
        if isinstance(v, (list, tuple)):
            out += [int(x) for x in v]
        elif isinstance(v, int):
            out.append(v)
    return out


def replay(shape: List[int], moves: List[OpRecord]) -> Optional[torch.Tensor]:
    """A meta tensor of ``shape`` moved as ``moves`` (recorded nearest first) moved the real one."""
    t = torch.empty(shape, device="meta")
    for record in reversed(moves):
        dims = int_args(record)
        try:
            t = t.permute(*dims) if record.op == "permute" else getattr(t, record.op)(*dims)
        except Exception:  # noqa: BLE001 - a move that cannot be replayed: no proposal
            return None
    return t
