"""Failures of Hugging Face models whose cause is in the model's *inputs*, read against its config.

* **Too long a sequence.** A model with learned positions takes at most
  ``config.max_position_embeddings`` (GPT-2: ``n_positions``) tokens; a longer ``input_ids`` fails
  deep in the embeddings ("The expanded size of the tensor (40) must match the existing size (32)",
  or an index error). The fix is truncation, at the model input — never a bigger table.
* **Class labels stored as floats.** ``…ForSequenceClassification`` with ``num_labels > 1`` picks
  its loss from the labels' dtype when ``config.problem_type`` is unset: integer labels →
  cross-entropy, float labels → multi-label BCE, which then fails on an ``(N,)`` target for
  ``(N, C)`` logits. The labels are class indices: ``labels.long()``. Hugging Face also *stores*
  the type it picked on the config, so a model that failed once keeps
  ``problem_type='multi_label_classification'`` until it is reset.

Both rules look only at the outermost call's inputs and the root module's ``config``; without a
config they say nothing.
"""

from __future__ import annotations

from typing import Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import loss_operands, op_at
from layerlab.probe.report import Diagnosis, FixStep

_BCE = ("F.binary_cross_entropy_with_logits", "F.binary_cross_entropy")


def _root(ctx):
    return getattr(ctx.recorder, "root", None)


def _outer_input(ctx, name: str, position: Optional[int]):
    """``(key, tensor)`` of the outermost call's argument ``name`` (or at ``position``)."""
    if not ctx.outer:
        return None, None
    path, args, kwargs = ctx.outer[0]
    if path:
        return None, None
    if name in kwargs:
        return name, kwargs[name]
    if position is not None and position < len(args):
        return position, args[position]
    return None, None


@register_rule("hf/sequence-too-long", stage="input", order=30)
def too_long(ctx) -> Optional[Diagnosis]:
    """``input_ids`` longer than ``config.max_position_embeddings``: truncate at the model input, never a
    bigger table."""
    config = getattr(_root(ctx), "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    key, ids = _outer_input(ctx, "input_ids", 0)
    if not isinstance(limit, int) or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    if ids.is_floating_point() or ids.shape[1] <= limit:
        return None
    T, message = ids.shape[1], str(ctx.exc)
    # only when the failure is the positions' (sizes T and limit clash, or a position index is out of range)
    if not ((str(T) in message and str(limit) in message) or "index out of range" in message):
        return None
    name = "max_position_embeddings" if getattr(config, "max_position_embeddings", None) else "n_positions"
    # every per-token input is cut alike: a 40-long attention_mask beside 32 ids would misalign
    kwargs = ctx.outer[0][2]
    keys = [key] + [k for k, v in kwargs.items() if k != key and isinstance(v, torch.Tensor) and v.dim() >= 2
                    and v.shape[0] == ids.shape[0] and v.shape[1] == T]
    named = [k if isinstance(k, str) else "input_ids" for k in keys]
    code = ", ".join(f"{n}[:, :{limit}]" for n in named)
    return Diagnosis(
        f"input_ids has {T} tokens, but the model has learned positions for at most {limit} "
        f"(config.{name} = {limit}): the embeddings fail where the positions run out",
        expected=f"≤ {limit} tokens", got=T, cause="sequence-length",
        hint=f"truncate to {limit} tokens: {code} (tokenizer(…, truncation=True, max_length={limit})), "
             f"or split the text into windows of {limit}",
        fix=FixStep("cast-input", "", code, {"arg": keys if len(keys) > 1 else key, "to": f"narrow:1:{limit}"}),
        alternatives=[f"not a larger {name}: the positions beyond {limit} would be untrained"],
        rule=f"absolute position embeddings: sequence length ≤ config.{name}",
    )


@register_rule("hf/float-class-labels", stage="input", order=10)
def float_class_labels(ctx) -> Optional[Diagnosis]:
    """Class labels stored as floats: Hugging Face picked multi-label BCE for a single-label task;
    ``labels.long()``."""
    failed = ctx.failed_op
    if failed is None or failed.record.op not in _BCE:
        return None
    logits, target = loss_operands(failed)
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor):
        return None
    if logits.dim() != 2 or logits.shape[1] < 2 or target.dim() != 1 or target.shape[0] != logits.shape[0]:
        return None
    C = logits.shape[1]
    if target.is_floating_point() and not bool(((target == target.round()) & (target >= 0) & (target < C)).all()):
        return None  # not class indices
    record, config = failed.record, getattr(_root(ctx), "config", None)
    key, labels = _outer_input(ctx, "labels", None)
    hf = config is not None and getattr(config, "num_labels", None) == C and labels is not None
    base = (f"{record.op}{op_at(record)} wants one 0/1 target per logit, {list(logits.shape)}, but the target "
            f"{list(target.shape)} holds one class index per sample")
    rule = "BCE-with-logits: target shape = logits shape; class indices are for cross-entropy"
    if not hf:
        return Diagnosis(base, expected=list(logits.shape), got=list(target.shape), cause="loss-target",
                         hint=f"for one class per sample use F.cross_entropy(logits, target.long()); for several "
                              f"labels per sample pass an (N, {C}) 0/1 target (F.one_hot(target.long(), {C}).float())",
                         rule=rule)
    if labels.is_floating_point():
        return Diagnosis(
            f"{base}: the labels are float, and with num_labels = {C} and no problem_type Hugging Face then "
            f"treats them as multi-label targets (problem_type='multi_label_classification')",
            expected="int64 class indices", got=f"labels {list(labels.shape)} float", cause="loss-target",
            hint="pass the class labels as integers: labels.long() (and keep them int64 in the dataset)",
            fix=FixStep("cast-input", "", "labels.long()", {"arg": key, "to": "long"}),
            alternatives=[f"or, for multi-label data, labels of shape (N, {C}) holding 0/1"], rule=rule)
    return Diagnosis(
        f"{base}: config.problem_type is '{config.problem_type}' — Hugging Face stores the type it picked on an "
        f"earlier call (with float labels) and keeps it",
        expected="problem_type='single_label_classification'", got=config.problem_type, cause="loss-target",
        hint="reset it: model.config.problem_type = 'single_label_classification' (or None)",
        fix=FixStep("set-attr", "", "config.problem_type='single_label_classification'",
                    {"name": "config.problem_type", "value": "single_label_classification"}),
        rule=rule)


@register_rule("hf/one-hot-labels", stage="input", order=20)
def one_hot_labels(ctx) -> Optional[Diagnosis]:
    """Integer one-hot ``labels`` (N, num_labels): Hugging Face flattens them into N·num_labels class
    indices, and cross-entropy finds more targets than samples. They are class indices in one-hot form."""
    failed = ctx.failed_op
    if failed is None or failed.record.op not in ("F.cross_entropy", "F.nll_loss"):
        return None
    config = getattr(_root(ctx), "config", None)
    C = getattr(config, "num_labels", None)
    key, labels = _outer_input(ctx, "labels", None)
    if not isinstance(C, int) or C < 2 or not isinstance(labels, torch.Tensor) or labels.is_floating_point():
        return None
    if labels.dim() != 2 or labels.shape[1] != C or not bool((((labels == 0) | (labels == 1)).all()
                                                              and (labels.sum(1) == 1).all())):
        return None
    return Diagnosis(
        f"labels {list(labels.shape)} are one-hot integers; with num_labels = {C} Hugging Face reads integer labels "
        f"as class indices, one per sample, and flattens these into {labels.numel()} of them for {labels.shape[0]} "
        "samples", expected=f"labels [{labels.shape[0]}] int64 class indices", got=list(labels.shape),
        cause="loss-target", hint="pass the class indices: labels.argmax(-1)",
        fix=FixStep("cast-input", "", "labels.argmax(-1)", {"arg": key, "to": "argmax:-1"}),
        alternatives=["labels.float() would switch Hugging Face to multi-label BCE: another task"],
        rule="…ForSequenceClassification: integer labels (N,) → cross-entropy; float (N, num_labels) → multi-label BCE")
