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
                        hint=_rejected_hint(first, _safe_select(objective, out), objective.target)) from None
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


def _safe_select(objective: L.Objective, out: Any) -> Any:
    try:
        return L.select(out, objective.output_path)
    except Exception:  # only for the hint: the error itself is already known
        return None


def _rejected_hint(message: str, pred: Any = None, target: Any = None) -> str:
    """What to change, read from torch's message and the two shapes (the class-index cases
    forum users meet first: classes last in a sequence model, a label past the last class)."""
    if "between 0 and 1" in message:  # BCELoss / binary_cross_entropy fed raw scores
        return ("BCELoss takes probabilities: on raw scores (logits) use nn.BCEWithLogitsLoss "
                "(F.binary_cross_entropy_with_logits), or put a sigmoid before BCELoss")
    tensors = isinstance(pred, torch.Tensor) and isinstance(target, torch.Tensor)
    if tensors and "target dtype to be Long" in message and target.is_floating_point():  # labels read as floats
        return (f"class indices are int64: give target.long() (the target is {str(target.dtype)[6:]} of shape "
                f"{list(target.shape)}); a float target must hold class probabilities, in the prediction's shape "
                f"{list(pred.shape)}")
    if tensors and "out of bounds" in message and pred.dim() >= 1 and not target.is_floating_point():
        classes = pred.shape[1] if pred.dim() >= 2 else pred.shape[0]
        return (f"class indices must lie in [0, {classes}): the prediction {list(pred.shape)} has {classes} classes "
                f"(dim {1 if pred.dim() >= 2 else 0}) and the target holds {int(target.max())}: give the target "
                f"high: {classes}, or the model as many outputs as there are classes")
    if tensors and "Expected target size" in message and pred.dim() >= 3 and \
            list(target.shape) == list(pred.shape[:-1]):  # (N, T, C) logits, (N, T) labels
        want = [pred.shape[0], *pred.shape[2:]]
        return (f"cross_entropy reads the classes from dim 1 of the prediction {list(pred.shape)} and wants a "
                f"target {want}; the target {list(target.shape)} fits it with the classes last, as a Linear head "
                "gives them: then give the loss out.movedim(-1, 1), or out.flatten(0, -2) with target.flatten()")
    if tensors and "batch_size" in message and pred.dim() >= 1 and target.dim() >= 1:
        return (f"the prediction's dim 0 is {pred.shape[0]} but the target's is {target.shape[0]}: is the batch "
                "still on dim 0 when forward returns? (an nn.LSTM/GRU/Transformer built without batch_first=True "
                "reads (N, T, …) as (T, N, …)); else give a target that fits the loss, or pick the output with "
                "output:")
    return "pick the output with output:, or give a target that fits the loss"
