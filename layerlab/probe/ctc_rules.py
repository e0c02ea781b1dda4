"""``F.ctc_loss`` given batch-first log-probs.

Legend: T time steps, N batch, C classes (blank included).

``F.ctc_loss`` reads ``log_probs`` as ``(T, N, C)``, but a ``batch_first`` RNN and a Linear give
``(N, T, C)``. Torch then compares ``input_lengths`` (N entries) with dim 1 (T) and says
"input_lengths must be of size batch_size". When dim 0 has exactly the lengths' count and dim 1 does
not, ``log_probs.transpose(0, 1)`` is the fix (verified on a copy) — but only when the targets and
``target_lengths`` count that batch too, and no input length exceeds dim 1 (the real T). Log-probs
already time-first (an RNN without ``batch_first``) with input_lengths summed over the wrong axis of a
``(T, N)`` mask have T entries as well; there the targets count dim 1, and transposing would read time
as the batch: that case is described with no fix. Cutting or padding the lengths
would make it run on the wrong axis and is not offered; a count that matches neither axis gets a
description and no fix.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import op_at, op_site
from layerlab.probe.report import Diagnosis, FixStep

_RULE = "F.ctc_loss: log_probs (T, N, C), targets (N, S), input_lengths (N), target_lengths (N)"


def _count(lengths) -> Optional[int]:
    if isinstance(lengths, torch.Tensor):
        return lengths.numel() if lengths.dim() <= 1 else None
    return len(lengths) if isinstance(lengths, (list, tuple)) else None


def _others_count_dim1(values, batch, t) -> bool:
    """Whether the targets or target_lengths say the batch is dim 1's ``batch`` (not ``t``), or an
    input length is longer than dim 1 could be as the time axis."""
    targets, target_lengths, lengths = values["targets"], values["target_lengths"], values["input_lengths"]
    if _count(target_lengths) not in (None, t):
        return True
    if isinstance(targets, torch.Tensor) and targets.dim() == 2 and targets.shape[0] != t:
        return True
    longest = max(lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths), default=0)
    return longest > batch


@register_rule("loss/ctc-batch-first", stage="op", on=(F.ctc_loss, torch.ctc_loss), order=310)
def ctc_batch_first(ctx) -> Optional[Diagnosis]:
    """``F.ctc_loss`` given batch-first (N, T, C) log-probs where it reads (T, N, C): ``log_probs.transpose(0,
    1)``."""
    failed = ctx.failed_op
    record = failed.record
    if record.op not in ("F.ctc_loss", "ctc_loss") or "must be of size batch_size" not in str(failed.exc):
        return None
    names = ("log_probs", "targets", "input_lengths", "target_lengths")
    values = {n: failed.args[i] if i < len(failed.args) else failed.kwargs.get(n) for i, n in enumerate(names)}
    lp, n = values["log_probs"], _count(values["input_lengths"])
    if not isinstance(lp, torch.Tensor) or lp.dim() != 3 or n is None:
        return None
    t, batch = lp.shape[0], lp.shape[1]
    api = f"{record.op}{op_at(record)}"
    if t == n and batch != n and not _others_count_dim1(values, batch, t):
        shape = [batch, t, lp.shape[2]]
        return Diagnosis(
            f"{api} reads log_probs {list(lp.shape)} as (T, N, C) = T {t}, N {batch}, but input_lengths has {n} "
            f"entries: the log-probs are batch-first (N, T, C) = N {t}, T {batch}, as a batch_first RNN gives them",
            expected=f"(T, N={n}, C)", got=list(lp.shape), cause="layout",
            hint=f"log_probs.transpose(0, 1) → {shape}",
            fix=FixStep("replace-op", record.source or "", "log_probs.transpose(0, 1)",
                        op_site(record, arg=0, to="movedim:0:1")),
            alternatives=["not cutting input_lengths to the time axis: it would run with time read as the batch"],
            rule=_RULE,
        )
    if t == n and batch != n:
        return Diagnosis(
            f"{api}: input_lengths has {n} entries, as many as log_probs {list(lp.shape)} has on dim 0, but the "
            f"targets and target_lengths count {batch} samples, as dim 1 does: the log-probs read as (T, N, C) "
            f"= T {t}, N {batch} already, and input_lengths has one entry per time step, not per sample",
            expected=f"{batch} lengths", got=n, cause="size",
            hint=f"give one input length per sample ({batch}); a (T, N) mask sums over dim 0: mask.sum(0)",
            alternatives=["not log_probs.transpose(0, 1): the targets count dim 1, so it would read time as the batch"],
            rule=_RULE,
        )
    return Diagnosis(
        f"{api}: log_probs {list(lp.shape)} has batch N = {batch} on dim 1 (T on dim 0), but input_lengths has "
        f"{n} entries; neither axis explains it",
        expected=f"{batch} lengths", got=n, cause="size",
        hint="give one input length and one target length per sample of the batch", rule=_RULE,
    )
