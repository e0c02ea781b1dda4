"""Class-index targets of ``F.cross_entropy`` / ``nn.CrossEntropyLoss`` (and ``nll_loss``) stored as floats.

A cross-entropy target is either class indices, shaped like the input without its class dim
(``(N,)`` for logits ``(N, C)``) and of an integer dtype, or class probabilities, shaped exactly like
the input and floating. A float target of the index shape (``torch.tensor([0., 2., 1.])``) is
neither: torch raises "expected target dtype to be Long". When its values are whole numbers in
``[0, C)`` (or the ``ignore_index``) it is class indices stored as float, and ``target.long()`` is the
fix; otherwise the rule says what it sees and offers none. A target shaped like the input is a
probability target and is never flagged here.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.hooks import dtype_name
from layerlab.probe.report import Diagnosis, FixStep

_RULE = ("cross_entropy: target = class indices, input's shape without the class dim (dim 1), integer; "
         "or class probabilities, the input's shape, floating")


def _float_indices(logits, target, ignore_index: int, api: str, fix_at) -> Optional[Diagnosis]:
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor):
        return None
    if not target.is_floating_point() or target.shape == logits.shape or logits.dim() < 1:
        return None  # integer ids, or a probability target: not this rule's business
    index_shape = [*logits.shape[:1], *logits.shape[2:]] if logits.dim() > 1 else []
    C = logits.shape[1] if logits.dim() > 1 else logits.shape[0]
    if list(target.shape) != index_shape:
        return None
    values = target.detach()
    whole = bool(torch.all(values == torch.round(values)))
    valid = (values == ignore_index) | ((values >= 0) & (values < C))
    shown = f"target {list(target.shape)} of dtype {dtype_name(target.dtype)}"
    if not (whole and bool(valid.all())):
        return Diagnosis(
            f"{api}: {shown} has the shape of class indices (the input {list(logits.shape)} without its class "
            f"dim) but holds values that are not class indices 0..{C - 1}; probabilities per class would be "
            f"shaped {list(logits.shape)}",
            expected="int64 class indices, or float probabilities shaped like the input",
            got=shown, cause="target-dtype",
            hint="pass integer class indices (int64) in [0, C), or a (N, C) probability target", rule=_RULE,
        )
    return Diagnosis(
        f"{api}: {shown} holds class indices (whole numbers in 0..{C - 1}) stored as float; class indices "
        f"must be integers (a float target is read as probabilities, which need the input's shape "
        f"{list(logits.shape)})",
        expected="int64", got=dtype_name(target.dtype), cause="target-dtype",
        hint=f"pass the class indices as integers: target.long(){fix_at[1]}", fix=fix_at[0],
        alternatives=["a float target shaped like the input if the labels are soft (probabilities per class)"],
        rule=_RULE,
    )


@register_rule("loss/float-class-target", stage="op", on=ops.CLASS_LOSSES, order=480)
def cross_entropy_op(ctx) -> Optional[Diagnosis]:
    """``F.cross_entropy``/``F.nll_loss`` in the user's code given class indices stored as float:
    ``target.long()`` (values that are not class indices: a description, no fix)."""
    failed = ctx.failed_op
    record = failed.record
    logits = failed.args[0] if failed.args else failed.kwargs.get("input")
    key = 1 if len(failed.args) > 1 else "target"
    target = failed.args[1] if key == 1 else failed.kwargs.get("target")
    ignore = failed.kwargs.get("ignore_index", -100)
    fix = FixStep("replace-op", record.source or "", "target.long()", op_site(record, arg=key, to="long"))
    return _float_indices(logits, target, ignore, f"{record.op}{op_at(record)}", (fix, op_at(record)))


@register_rule("loss/float-class-target-module", stage="module", on=(nn.CrossEntropyLoss, nn.NLLLoss), order=260)
def cross_entropy_module(ctx) -> Optional[Diagnosis]:
    """``nn.CrossEntropyLoss``/``nn.NLLLoss`` given class indices stored as float: ``target.long()``."""
    m = ctx.module
    logits, target = ctx.arg("input", 0), ctx.arg("target", 1)
    fix = FixStep("cast-input", ctx.path, "target.long()", {"arg": ctx.key("target", 1), "to": "long"})
    return _float_indices(logits, target, getattr(m, "ignore_index", -100),
                          f"{ctx.path or '(root)'} ({type(m).__name__})", (fix, f" before {ctx.path or 'the loss'}"))

