"""A reduction over dim 0 that consumed the batch, seen where its result meets a per-sample tensor.

``F.cosine_similarity(a, b, dim=0)`` of two (B, D) embeddings gives D numbers, one per feature,
instead of B scores; the loss against B labels then raises. Reshaping the labels would run and
train on nonsense. When an operand of the failing op was made (through elementwise ops) by a
reduction over dim 0 of a tensor whose dim 0 is the other operand's size, the fix is that
reduction's ``dim``: the last axis for a 2-D input, where nothing else is possible. Dim 0 counts as
the batch only when it is the batch of the model's input: an unbatched model (a query (D,) against
prototypes stored as columns (D, K)) reduces dim 0 on purpose, and there the other operand's size
may be the bug.
"""

from __future__ import annotations

from typing import Optional

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site, op_tensors, op_text
from layerlab.probe.layout import model_batch
from layerlab.probe.op_walk import back_to
from layerlab.probe.report import Diagnosis, FixStep

#: Reductions and how many leading tensor arguments they take (a fix keeps those, changes ``dim``).
REDUCTIONS = {"cosine_similarity": 2, "F.cosine_similarity": 2, "mean": 1, "sum": 1, "norm": 1,
              "amax": 1, "amin": 1, "logsumexp": 1, "prod": 1}


def _dim(record) -> Optional[int]:
    value = record.args.get("dim", record.args.get("1" if record.op not in ("cosine_similarity",
                                                                             "F.cosine_similarity") else "2"))
    return value if isinstance(value, int) else None


@register_rule("batch/reduced-over-batch", stage="op", order=250)
def reduced_batch(ctx) -> Optional[Diagnosis]:
    """A reduction over dim 0 consumed the batch; seen where its result meets a per-sample tensor."""
    failed = ctx.failed_op
    if ops.matches(failed.func, ops.JOINS):  # a cat's operands are the join rules' (they ran before)
        return None
    tensors = op_tensors(failed)
    if len(tensors) < 2 or "size" not in str(failed.exc).lower():
        return None
    for i, t in enumerate(tensors[:2]):
        other = tensors[1 - i]
        if t.dim() == 0 or other.dim() == 0:
            continue
        made, _ = back_to(ctx, t, REDUCTIONS)
        if made is None or not made.inputs or _dim(made) is None:
            continue
        source = made.inputs[0].shape
        if len(source) < 2 or _dim(made) % len(source) != 0 or source[0] != other.shape[0] or t.shape[0] == other.shape[0]:
            continue
        if source[0] != model_batch(ctx):
            continue  # dim 0 is not the batch the model was given: reducing it may be meant
        record = failed.record
        message = (f"`{record.op}()`{op_at(record)} pairs {list(t.shape)} with {list(other.shape)}: the first "
                   f"came from `{op_text(made)}`{op_at(made)}, which reduced dim 0 of {source} — the batch of "
                   f"{source[0]} — leaving one value per feature")
        base = dict(expected=[other.shape[0]], got=list(t.shape), cause="reduced-batch",
                    rule="a per-sample score reduces the feature axis, never the batch",
                    alternatives=[f"not a reshape or expand of the {other.shape[0]} targets: it would run on "
                                  "per-feature numbers"])
        if len(source) != 2:
            return Diagnosis(message, hint=f"reduce the feature axis instead: {made.op}(…, dim=…){op_at(made)}", **base)
        keep = REDUCTIONS[made.op]
        return Diagnosis(
            message, hint=f"reduce the features: {made.op}(…, dim=1){op_at(made)} → [{source[0]}]",
            fix=FixStep("replace-op", made.source or "", f"{made.op}(…, dim=1)", op_site(made, dim=1, keep_args=keep)),
            **base)
    return None
