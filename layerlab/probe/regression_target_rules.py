"""A regression loss whose target keeps a trailing size-1 feature axis.

Legend: N batch, H horizon (outputs per sample).

``F.mse_loss(pred, y)`` with ``pred (N, H)`` from ``nn.Linear(…, H)`` and ``y (N, H, 1)`` from a
dataset that keeps one feature axis broadcasts, aligned from the right, to ``(N, N, H)``-like shapes —
and raises when N ≠ H (it silently averages the wrong pairs when they are equal). The target holds
the prediction's numbers with one more size-1 axis: ``y.squeeze(-1)`` (or the prediction's, the other
way round) is the fix, verified on a copy. ``pred.unsqueeze(1)`` would also run, comparing every
pair of steps, and is not offered; any other shape clash is left alone.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import loss_operands, op_at, op_site
from layerlab.probe.report import Diagnosis, FixStep

OPS = ("F.mse_loss", "F.l1_loss", "F.smooth_l1_loss", "F.huber_loss")


@register_rule("loss/regression-target-trailing-axis", stage="op",
               on=(F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss),
               order=320)
def trailing_axis(ctx) -> Optional[Diagnosis]:
    """A regression target with a trailing size-1 feature axis: ``y.squeeze(-1)``."""
    failed = ctx.failed_op
    record = failed.record
    if record.op not in OPS:
        return None
    pred, target = loss_operands(failed)
    if not isinstance(pred, torch.Tensor) or not isinstance(target, torch.Tensor):
        return None
    for which, extra, other, name in ((1, target, pred, "target"), (0, pred, target, "input")):
        if extra.dim() == other.dim() + 1 and extra.shape[-1] == 1 and extra.shape[:-1] == other.shape:
            code = f"{name}.squeeze(-1)"
            return Diagnosis(
                f"{record.op}{op_at(record)}: input {list(pred.shape)} and target {list(target.shape)} hold the same "
                f"numbers but the {name} has one more size-1 axis at the end: aligned from the right, the two "
                f"broadcast against each other instead of pairing element by element",
                expected=list(other.shape), got=list(extra.shape), cause="rank",
                hint=f"{code} → {list(other.shape)}",
                fix=FixStep("replace-op", record.source or "", code, op_site(record, arg=which, to="squeeze:-1")),
                alternatives=["not unsqueezing the other side on another axis: it runs and compares every pair of steps"],
                rule=f"{record.op}: input and target of one shape (broadcasting is almost never meant)",
            )
    return None
