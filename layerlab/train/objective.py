"""The loss of a train-check run, built from the first step's output: which output it reads, the loss
function and the target, from the explicit arguments first and the spec's ``train:`` section second
(the rules themselves are :mod:`~layerlab.train.loss`'s; this module only picks among them).
"""

from __future__ import annotations

from typing import Any

import torch

from layerlab.errors import LayerlabError, SpecError, UsageError
from layerlab.spec.limits import clean_text
from layerlab.train import loss as L
from layerlab.train.section import TrainSection

__all__ = ["build_objective", "loss_value"]


def build_objective(out: Any, section: TrainSection, loss: Any, target: Any, output: Any, built: Any, args, at
               ) -> L.Objective:
    """The loss, the output it reads and the target, from the first step's output."""
    choice = output if output is not None else section.output
    path, own_loss = L.pick_output(out, choice, at("output") if output is None else "output")
    chosen = loss if loss is not None else section.loss
    if chosen is None:
        chosen = "model" if own_loss else "mse"
    name, fn = L.loss_function(chosen, at("loss") if loss is None else "loss")
    pred = L.select(out, path)
    if fn is None:  # the model's output is the loss
        if pred.dim() != 0:
            raise SpecError(f"loss: model reads the loss the model returns, but {path} has shape {list(pred.shape)}",
                            where=at("loss"), hint="give the model its labels (a Hugging Face model returns "
                            "output.loss then), or name a loss: mse, cross_entropy")
        own = "the model's own loss" if path == "output['loss']" else \
            f"the scalar the model returns at {path}, read as its own loss"
        return L.Objective(name, path, None, None, own, choice is not None)
    if target is not None:
        if not isinstance(target, torch.Tensor):
            raise UsageError("target is a tensor", where="target", got=type(target).__name__)
        value, source = target.detach(), "given"
    elif section.target is not None:
        value, source = spec_target(section.target, pred, built, args), "the spec's train: target"
    else:
        value = L.make_target(name, pred, built.seed, fn)
        source = L.target_source(L.target_kind(name, fn), built.seed)
    L.check_target(name, pred, value, at("target") if target is None else "target")
    # a loss that rejects the pair is reported at the spec's target when it wrote one, else at its loss
    blame = "target" if target is not None else at("target") if section.target is not None else \
        at("loss") if loss is None else "loss"
    return L.Objective(name, path, fn, value, source, choice is not None, where=blame)


def spec_target(spec: Any, pred: torch.Tensor, built: Any, args) -> torch.Tensor:
    if spec.same_as is not None:
        names = {a.name: a.value for a in args}
        if spec.same_as not in names:
            raise SpecError(f"train: target is same_as {spec.same_as!r}, which is not an input", where=spec.where,
                            expected=list(names), got=spec.same_as)
        return names[spec.same_as].detach()
    from layerlab.spec.inputs import make_inputs

    dtype = str(pred.dtype).replace("torch.", "") if pred.is_floating_point() else "float32"
    value = make_inputs([spec], seed=L.target_seed(built.seed), dtype=dtype, device=str(pred.device))["target"]
    if isinstance(value, torch.Tensor):
        return value.detach()
    try:  # a literal written in the spec (target: 0.5, target: [[1, 0]]): numbers only
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise SpecError("train: target is a tensor, written like an input", where=spec.where,
                        expected="{shape: [8], low: 0, high: 10}, a number, or same_as: an input",
                        got=value) from None


def loss_value(objective: L.Objective, out: Any) -> torch.Tensor:
    """The loss of one step, as a floating scalar tensor with its graph; a clear error otherwise."""
    try:
        value = objective(out)
    except LayerlabError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise SpecError(f"the loss {objective.loss_name} rejected the prediction {objective.output_path}: "
                        f"{type(exc).__name__}: {clean_text(first, 300)}", where=objective.where,
                        hint=_rejected_hint(first)) from None
    if isinstance(value, (float, int)) and not isinstance(value, bool):
        raise SpecError(f"the loss ({objective.loss_name}) returned a Python {type(value).__name__}, not a tensor: "
                        "it carries no graph, so nothing can be trained from it", where=objective.where,
                        got=type(value).__name__, hint="return the loss tensor itself: .item() or float() is for "
                        "logging, after backward")
    if not isinstance(value, torch.Tensor) or value.dim() != 0 or not value.is_floating_point():
        got = f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise SpecError(f"the loss ({objective.loss_name}) must be a floating scalar", where=objective.where, got=got,
                        hint="reduce it (mean) or pick the loss output with output: loss")
    return value


def _rejected_hint(message: str) -> str:
    if "between 0 and 1" in message:  # BCELoss / binary_cross_entropy fed raw scores
        return ("BCELoss takes probabilities: on raw scores (logits) use nn.BCEWithLogitsLoss "
                "(F.binary_cross_entropy_with_logits), or put a sigmoid before BCELoss")
    return "pick the output with output:, or give a target that fits the loss"
