"""Cross-entropy given one row of logits per time step for a target of one class per sequence.

Legend: N batch, T time steps (tokens), H features, C classes.

A sequence classifier ``fc(rnn(x)[0])`` applies its Linear to every step of the RNN's output
``(N, T, H)`` and gets logits ``(N, T, C)``; the target has one class per sequence, ``(N,)``.
``F.cross_entropy`` reads dim 1 as the classes and says "Expected target size [N, C], got [N]",
which points at the target. The fix is upstream: classify one vector per sequence. For a
unidirectional, batch-first RNN that is its last step, ``out[:, -1]`` (equal to ``h_n[-1]``), and the
fix is given and verified. For a bidirectional RNN the last step holds only the first step of the
backward direction, so the hint says to join both final states and gives no fix; for any other
producer (a transformer: a CLS position or a mean?) it is the model's choice, a hint only. Nor is
``out[:, -1]`` the last step of a padded batch: when the RNN reads an Embedding with a ``padding_idx``
of the model's ids and those ids hold it, the hint says to take each row's last real step, no fix.
Repeating the target over T would run, but train every step to predict the sequence's label:
never offered.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import loss_operands, op_at
from layerlab.probe.hooks import dtype_name
from layerlab.probe.report import Diagnosis, FixStep

_OPS = ("F.cross_entropy", "F.nll_loss")
_RULE = "cross_entropy: logits (N, C) for a target (N,) of class indices; (N, C, T) for a target (N, T)"


@register_rule("loss/per-step-logits", stage="op", on=ops.CLASS_LOSSES, order=500)
def per_step_logits(ctx) -> Optional[Diagnosis]:
    """``F.cross_entropy(logits (N, T, C), target (N,))`` in the user's code: logits per step for one label
    per sequence; ``fc(out[:, -1])`` (or the last real step of a padded batch)."""
    failed = ctx.failed_op
    record = failed.record
    if record.op not in _OPS:
        return None
    logits, target = loss_operands(failed)
    return _diagnose(ctx, logits, target, f"{record.op}{op_at(record)}")


@register_rule("loss/per-step-logits-module", stage="module", on=(nn.CrossEntropyLoss, nn.NLLLoss), order=280)
def per_step_logits_module(ctx) -> Optional[Diagnosis]:
    """``nn.CrossEntropyLoss()(logits (N, T, C), target (N,))``: logits per step for one label per sequence."""
    if not isinstance(ctx.module, (nn.CrossEntropyLoss, nn.NLLLoss)):
        return None
    return _diagnose(ctx, ctx.arg("input", 0), ctx.arg("target", 1),
                     f"{ctx.path or '(root)'} ({type(ctx.module).__name__})")


def _padded(ctx, rnn_call) -> bool:
    """The RNN reads an Embedding (with a padding_idx) of the model's ids, and those ids hold that id."""
    from layerlab.probe.short_sequence_rules import model_input

    source = rnn_call.tensor_inputs[0].source if rnn_call.tensor_inputs else None
    emb_call = ctx.call(source) if source is not None else None
    emb = ctx.recorder.modules[emb_call.index] if emb_call is not None else None
    if not isinstance(emb, nn.Embedding) or emb.padding_idx is None or not emb_call.tensor_inputs:
        return False
    placed = model_input(ctx, emb_call.tensor_inputs[0].slot)
    return placed is not None and bool((placed[3] == emb.padding_idx).any())


def _diagnose(ctx, logits, target, api: str) -> Optional[Diagnosis]:
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor) or logits.dim() != 3:
        return None
    if target.is_floating_point() or list(target.shape) != [logits.shape[0]]:
        return None
    N, T, C = logits.shape
    head = Diagnosis(
        f"{api}: logits {list(logits.shape)}, target {list(target.shape)} {dtype_name(target.dtype)}: one class "
        f"per sequence, but one row of {C} logits per position (T = {T})",
        expected=f"logits [{N}, {C}]", got=list(logits.shape), cause="per-step-logits",
        hint="classify one vector per sequence: pool or pick a position before the classifier "
             "(a CLS position x[:, 0], the mean x.mean(1), or an RNN's last step)",
        alternatives=[f"repeating the target over the {T} positions would run, but train every position to "
                      "predict the sequence's label"],
        rule=_RULE,
    )
    head_call = ctx.producer(logits)
    if head_call is None or not isinstance(ctx.recorder.modules[head_call.index], nn.Linear) \
            or not head_call.tensor_inputs or head_call.tensor_inputs[0].source is None:
        return head
    rnn_call = ctx.call(head_call.tensor_inputs[0].source)
    rnn = ctx.recorder.modules[rnn_call.index] if rnn_call is not None else None
    if not isinstance(rnn, nn.RNNBase) or not rnn.batch_first:
        return head
    seen = head_call.tensor_inputs[0].shape
    if seen is None or len(seen) != 3 or seen[:2] != [N, T]:
        return head
    kind = type(rnn).__name__
    head.message += (f": {head_call.label} (Linear) was applied to every step of {rnn_call.label} ({kind})'s "
                     f"output {seen}")
    if rnn.bidirectional:
        head.hint = (f"classify the final states of both directions: torch.cat([h_n[-2], h_n[-1]], dim=-1) "
                     f"before {head_call.label} (out[:, -1] holds only the first step of the backward direction)")
        return head
    if _padded(ctx, rnn_call):
        head.hint = (f"classify each sequence's last real step: out[torch.arange({N}), lengths - 1] before "
                     f"{head_call.label} (the ids hold padding: out[:, -1] is a padding step for the shorter rows; "
                     "or pack the batch with pack_padded_sequence and use h_n[-1])")
        return head
    head.hint = (f"classify the last step: {head_call.label}(out[:, -1]) → [{N}, {C}] (the same as h_n[-1] "
                 f"for this {kind}); with padded batches, take each sequence's last real step")
    head.fix = FixStep("cast-input", head_call.path, "out[:, -1]", {"arg": 0, "to": "select:1:-1"})
    return head
