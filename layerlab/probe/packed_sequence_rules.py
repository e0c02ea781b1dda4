"""``pack_padded_sequence`` with unsorted lengths (``enforce_sorted=True``, the default) or lengths
on an accelerator.

The fix is ``enforce_sorted=False``: torch sorts the batch, and the LSTM's outputs and ``h_n`` come
back in the batch's own order. Sorting ``lengths`` alone also runs — each row then packed with
another row's length. The call is a Python wrapper around the op the trace sees, so the fix is
stated, not verified.
"""

from __future__ import annotations

from typing import Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at
from layerlab.probe.report import Diagnosis

_OPS = {"_pack_padded_sequence", "pack_padded_sequence"}


@register_rule("rnn/pack-padded-lengths", stage="op", on=ops.PACK, order=220)
def packed(ctx) -> Optional[Diagnosis]:
    """``pack_padded_sequence`` with unsorted lengths or lengths on an accelerator: ``enforce_sorted=False``."""
    failed = ctx.failed_op
    record = failed.record
    if record.op not in _OPS:
        return None
    message = str(failed.exc)
    lengths = failed.args[1] if len(failed.args) > 1 and isinstance(failed.args[1], torch.Tensor) else None
    shown = lengths.tolist() if lengths is not None and lengths.numel() <= 16 else "lengths"
    if "sorted in decreasing order" in message:
        return Diagnosis(
            f"pack_padded_sequence{op_at(record)}: lengths {shown} are not in decreasing order, and "
            "enforce_sorted=True (the default) requires it",
            expected="lengths sorted in decreasing order, or enforce_sorted=False", got=shown, cause="order",
            hint=f"pass enforce_sorted=False{op_at(record)}: torch sorts the batch and returns the outputs and "
                 "h_n in the batch's order",
            alternatives=["not lengths.sort(descending=True) alone: it runs, with each row packed with another "
                          "row's length (sort the batch with the same indices, or let torch do it)"],
            rule="pack_padded_sequence: enforce_sorted=True needs lengths[0] ≥ lengths[1] ≥ …",
        )
    if "CPU" in message and lengths is not None:
        return Diagnosis(
            f"pack_padded_sequence{op_at(record)}: lengths must be a CPU int64 tensor, got one on {lengths.device}",
            expected="lengths on cpu", got=str(lengths.device), cause="device",
            hint=f"pass lengths.cpu(){op_at(record)} (the packing is planned on the CPU)",
            rule="pack_padded_sequence: lengths is a 1-D CPU int64 tensor or a list",
        )
    return None
