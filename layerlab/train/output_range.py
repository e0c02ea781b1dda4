"""A regression prediction that cannot reach its target: squashed into a range the target leaves, or
broadcast against a target of another shape.

* **range**: the op that made the prediction (read in the autograd graph, through ops that only
  move values, as :mod:`~.squashed` does) bounds it — a ReLU/Softplus/exp/abs keeps it ≥ 0, a
  sigmoid in (0, 1), a tanh in (-1, 1) — while target values lie outside that range (a ReLU on a
  regression output whose target is N(0, 1)). For an element-wise loss (mse, L1, smooth L1/Huber)
  the best the model can do on those values is the range's edge, so the loss has a floor: computed
  exactly, ``loss(clamp(target, range), target)``. When that floor is at least a tenth of the first
  step's loss, the loss can never fall 10×: ``output-range``, an error, with the module named. Only
  for a target the user gave (argument or spec): the default random target is this check's choice;
* **broadcast**: a floating target whose shape differs from the prediction's and broadcasts with it
  to more elements than either has (``[N, 1]`` against ``[N]`` is ``[N, N]``): every prediction is
  compared with every target, the loss's minimum is the target's mean, and torch only warns.
  ``target-broadcast``, an error. Class-index targets (integer) and equal shapes are never flagged; a
  loss of the user's own only when torch itself warns about the sizes inside it (it may squeeze first).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F

from layerlab.errors import Problem
from layerlab.train.squashed import maker

__all__ = ["findings", "default_target_floor"]

#: autograd node → (name, low, high) of the range the op's output lies in
_BOUNDED = {"ReluBackward0": ("ReLU", 0.0, math.inf), "SoftplusBackward0": ("Softplus", 0.0, math.inf),
            "ExpBackward0": ("exp", 0.0, math.inf), "AbsBackward0": ("abs", 0.0, math.inf),
            "SigmoidBackward0": ("sigmoid", 0.0, 1.0), "TanhBackward0": ("tanh", -1.0, 1.0),
            "Relu6Backward0": ("ReLU6", 0.0, 6.0), "HardtanhBackward0": ("ReLU6/Hardtanh", 0.0, 6.0)}
#: the element-wise losses whose floor is the loss of the clamped target
_ELEMENTWISE = {"mse": F.mse_loss}


def _loss_of(objective: Any):
    fn = getattr(objective, "fn", None)
    if getattr(objective, "loss_name", "") in _ELEMENTWISE:
        return _ELEMENTWISE[objective.loss_name]
    for kind, functional in ((torch.nn.MSELoss, F.mse_loss), (torch.nn.L1Loss, F.l1_loss),
                             (torch.nn.SmoothL1Loss, F.smooth_l1_loss), (torch.nn.HuberLoss, F.huber_loss)):
        if isinstance(fn, kind) and getattr(fn, "reduction", "mean") == "mean":
            return functional
    if fn in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss):
        return fn
    return None


def _bound(pred: torch.Tensor) -> Tuple[Optional[Tuple[str, float, float]], Any]:
    bound, node = maker(pred, _BOUNDED)
    if bound is not None and type(node).__name__ == "HardtanhBackward0":
        # one node for ReLU6 (0, 6), Hardtanh (-1, 1) and hardtanh(x, -2, 2): its range is what it saved
        try:
            low, high = float(node._saved_min_val), float(node._saved_max_val)
        except Exception:  # not saved in this torch: no range is claimed
            return None, node
        name = "ReLU6" if (low, high) == (0.0, 6.0) else f"Hardtanh({low:g}, {high:g})"
        bound = (name, low, high)
    return bound, node


def findings(objective: Any, pred: Any, first_loss: Optional[float], made_by: List[Tuple[Any, str]]
             ) -> List[Problem]:
    """``target-broadcast`` and ``output-range`` (a target the user gave) errors, seen on the first step."""
    target = getattr(objective, "target", None)
    if not _floating(pred, target):
        return []
    wide = _broadcast(pred, target, objective)
    if wide is not None:
        return [wide]
    if not _users_target(objective):
        return []  # this check's own random target: its range is layerlab's choice, not the user's bug
    seen = _floor(objective, pred, first_loss, made_by)
    if seen is None:
        return []
    text, label, name, floor, share = seen
    return [Problem("output-range", text + " whatever the steps or the lr", where=label or objective.output_path,
                    severity="error", hint=f"drop the final {name} on a regression output (or map the target into "
                    "the output's range)", data={"floor": floor, "outside": share})]


def default_target_floor(objective: Any, pred: Any, first_loss: Optional[float], made_by: List[Tuple[Any, str]]
                         ) -> Optional[str]:
    """For this check's own random target: why the loss cannot fall 10× (said in the fit verdict, not as a
    finding: the target is not the user's), or ``None``."""
    if not _floating(pred, getattr(objective, "target", None)) or _users_target(objective):
        return None
    seen = _floor(objective, pred, first_loss, made_by)
    return None if seen is None else seen[0].replace("target values", "values of this check's random target") + \
        ": give a target in the output's range (target=, or train: target) to check the fit"


def _floating(pred: Any, target: Any) -> bool:
    return isinstance(pred, torch.Tensor) and isinstance(target, torch.Tensor) and pred.is_floating_point() and \
        target.is_floating_point()


def _users_target(objective: Any) -> bool:
    return getattr(objective, "target_source", "") in ("given", "the spec's train: target")


def _floor(objective, pred, first_loss, made_by) -> Optional[Tuple[str, Optional[str], str, float, float]]:
    """(what is seen, the module, the op, the floor, the share of target values outside) when the op that made
    the prediction bounds it away from the target enough that the loss cannot fall 10×."""
    target = objective.target
    fn = _loss_of(objective)
    bound, node = _bound(pred)
    if fn is None or bound is None or tuple(pred.shape) != tuple(target.shape) \
            or first_loss is None or not math.isfinite(first_loss) or first_loss <= 0:
        return None
    name, low, high = bound
    t = target.detach().to(pred.dtype)
    outside = (t < low) | (t > high)
    if not bool(outside.any()):
        return None
    floor = float(fn(t.clamp(low, high), t))
    if floor < first_loss / 10:
        return None
    module = next((path for made, path in made_by if made is node), None)
    label = None if module is None else module or "(root)"
    span = f"≥ {low:g}" if high == math.inf else f"in ({low:g}, {high:g})"
    share = float(outside.float().mean())
    text = (f"the prediction ({objective.output_path}) comes out of a {name}" + (f" at {label}" if label else "") +
            f", so it is {span}, but {share * 100:.0f} % of the target values lie outside that: the loss cannot go "
            f"below {floor:.4g} (it started at {first_loss:.4g}), so it cannot fall 10×")
    return text, label, name, floor, share


def _broadcast(pred: torch.Tensor, target: torch.Tensor, objective: Any) -> Optional[Problem]:
    if tuple(pred.shape) == tuple(target.shape):
        return None
    try:
        shape = torch.broadcast_shapes(pred.shape, target.shape)
    except RuntimeError:
        return None
    if math.prod(shape) <= max(pred.numel(), target.numel()):
        return None
    if _loss_of(objective) is None and not _torch_warns(objective, pred, target):
        return None  # a loss of the user's own may squeeze or reshape before it compares: only torch's word counts
    fix = (f"target.view({', '.join(map(str, pred.shape))})" if target.numel() == pred.numel() else
           "a target of the prediction's shape")
    return Problem("target-broadcast", f"the prediction {list(pred.shape)} and the target {list(target.shape)} "
                   f"broadcast to {list(shape)}: the loss compares every prediction with every target, so its "
                   "minimum is not 0 and the model cannot fit the batch (torch only warns)",
                   where=getattr(objective, "where", None) or "target", severity="error",
                   hint=f"give the loss matching shapes: {fix}, or squeeze the prediction's size-1 dim")


def _torch_warns(objective: Any, pred: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether the user's loss, on a detached copy of the prediction, makes torch warn that the target
    size differs from the input size (``F.mse_loss``/``l1_loss`` called inside it broadcast)."""
    import warnings

    fn = getattr(objective, "fn", None)
    if fn is None:
        return False
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always")
        try:
            fn(pred.detach(), target)
        except Exception:  # noqa: BLE001 — only the warning is looked at
            return False
    return any("target size" in str(w.message) for w in seen)
