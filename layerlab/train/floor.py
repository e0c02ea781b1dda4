"""The exact floor of a loss given its target: the lowest value any prediction can reach.

A loss whose target is soft has a minimum above 0, and "fell 10×" then asks for the impossible:
sigmoid + ``BCELoss`` against targets in (0, 1) can go no lower than the targets' own entropy, and
"short of 10×, run more steps" would send the user after nothing. Where the minimum is exact it is
computed with the user's own loss, at the prediction that attains it — the target itself:

* ``BCELoss`` / ``F.binary_cross_entropy``: ``loss(t, t)`` = the entropy of the targets;
* ``BCEWithLogitsLoss`` / ``F.binary_cross_entropy_with_logits`` (no ``pos_weight``): ``loss(logit(t), t)``
  (label-smoothed targets 0.05/0.95: the floor is their entropy, 0.199 nats);
* ``cross_entropy`` (``F.cross_entropy``, ``nn.CrossEntropyLoss`` with any ``weight``, ``label_smoothing``,
  ``ignore_index``), class indices or class probabilities: ``loss(log p*, t)`` at the exact minimiser
  ``p*`` (:mod:`~.ce_floor`): the smoothed target's entropy without weights (``label_smoothing=0.1`` over
  10 classes: 0.5003 nats; hard class indices without smoothing: 0, no adjustment), ``log 0`` taken
  as -1e4 (its share of the softmax is exactly 0 in float32/64); the class count ``C`` is read from
  the prediction's shape, so class indices need it (``shape``);
* element-wise losses (mse, L1, smooth L1, Huber): 0 — no adjustment.

When every sample of the batch has the same input (:mod:`~.constant_output`), the prediction is the
same for every sample and the floor is that of the best *constant* prediction: the target's mean over
the batch for mse (the floor is then the variance of the target rows) and for the soft cross-entropies
(``mean(t)`` is their minimiser too; a cross-entropy's is its summed coefficients, :mod:`~.ce_floor`).
L1/Huber's best constant is not the mean: no floor is claimed there.

:func:`layerlab.train.fit.judge` then measures the fall *above* the floor:
``(initial − floor) / (final − floor)``. ``None`` means no exact floor is known (a loss of the user's
own, a weighted loss): the plain fall is judged, as before.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from layerlab.train import ce_floor

__all__ = ["exact_floor", "constant_floor"]

#: stands for log 0 / logit 0: exp(-1e4) is exactly 0 in float32 and float64, so the loss is exact
_FAR = 1e4


def _kind(objective: Any) -> Optional[str]:
    """``bce``, ``bce_logits``, ``ce``, ``elementwise`` or ``None`` (no exact floor known)."""
    fn = getattr(objective, "fn", None)  # by identity: a function of the user's own named mse is not torch's
    if fn in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss) or isinstance(
            fn, (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)):
        return "elementwise"
    if fn is F.binary_cross_entropy or (isinstance(fn, nn.BCELoss) and fn.weight is None):
        return "bce"
    if fn is F.binary_cross_entropy_with_logits or (isinstance(fn, nn.BCEWithLogitsLoss) and fn.weight is None
                                                    and fn.pos_weight is None):
        return "bce_logits"
    if ce_floor.settings(fn) is not None:
        return "ce"
    return None


def _as_logits(kind: str, p: torch.Tensor) -> torch.Tensor:
    """The prediction whose loss against the target is the floor, given the best probabilities ``p``."""
    if kind == "bce_logits":
        return torch.logit(p).clamp(-_FAR, _FAR)
    if kind == "ce":
        return torch.log(p).clamp(min=-_FAR)
    return p


def _value(objective: Any, kind: str, best: torch.Tensor) -> Optional[float]:
    fn: Callable = objective.fn
    target = objective.target
    logits = _as_logits(kind, best)
    if kind == "ce":  # the dtype torch wants beside the target (probabilities) or the class weights
        weight = ce_floor.settings(fn)["weight"]
        dtype = target.dtype if target.is_floating_point() else weight.dtype if weight is not None else torch.float64
        logits = logits.to(dtype=dtype, device=target.device)
    with torch.no_grad():
        value = float(fn(logits, target))
    return value if math.isfinite(value) and value >= 0 else None


def _soft(objective: Any, kind: str) -> bool:
    """A float target the loss reads as probabilities: in [0, 1] (and summing to 1 over dim 1 for ce)."""
    t = getattr(objective, "target", None)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return False
    if bool((t < 0).any()) or bool((t > 1).any()):
        return False
    if kind == "ce":
        sums = t.sum(1 if t.dim() >= 2 else 0)
        return bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3))
    return True


def exact_floor(objective: Any, shape: Optional[Sequence[int]] = None) -> Optional[Tuple[float, str]]:
    """``(floor, why)`` when the target alone puts the loss's minimum above 0, else ``None``.
    ``shape``: the prediction's (a cross-entropy's class count is its class dim)."""
    kind = _kind(objective)
    if kind == "ce":
        return _ce(objective, shape, constant=False)
    if kind in (None, "elementwise") or not _soft(objective, kind):
        return None
    target = objective.target.detach()
    floor = _value(objective, kind, target)
    if floor is None or floor <= 1e-12:
        return None  # hard 0/1 targets: the floor is 0, nothing to adjust
    return floor, f"the target's own loss, {floor:.4g} (its entropy: the targets are soft), is the floor"


def constant_floor(objective: Any, shape: Optional[Sequence[int]] = None) -> Optional[Tuple[float, str]]:
    """``(floor, why)`` for a prediction that is the same for every sample: the loss at the target's mean."""
    kind = _kind(objective)
    if kind == "ce":
        return _ce(objective, shape, constant=True)
    target = getattr(objective, "target", None)
    fn = getattr(objective, "fn", None)
    if kind is None or fn is None or not isinstance(target, torch.Tensor) or target.dim() == 0 \
            or target.shape[0] < 2:
        return None
    if kind == "elementwise":
        if not (fn is F.mse_loss or isinstance(fn, nn.MSELoss)):
            return None  # L1/Huber: the best constant is not the mean
        rows = target.detach()
        floor = _value(objective, kind, rows.mean(0, keepdim=True).expand_as(rows))
        what = "the variance of the target rows"
    elif not _soft(objective, kind):
        return None
    else:
        rows = target.detach()
        floor = _value(objective, kind, rows.mean(0, keepdim=True).expand_as(rows))
        what = "the loss of the target's mean"
    if floor is None:
        return None
    return floor, (f"every sample has the same input, so the best prediction is the target's mean: "
                   f"{what}, {floor:.4g}, is the floor")


def _ce(objective: Any, shape: Optional[Sequence[int]], constant: bool) -> Optional[Tuple[float, str]]:
    """A cross-entropy's floor at its exact minimiser (:mod:`~.ce_floor`)."""
    target = getattr(objective, "target", None)
    if not isinstance(target, torch.Tensor) or target.numel() == 0:
        return None
    if shape is None and target.is_floating_point():
        shape = tuple(target.shape)  # class probabilities have the prediction's shape
    if shape is None or (constant and (len(shape) < 2 or shape[0] < 2)):
        return None
    if target.is_floating_point() and not _soft(objective, "ce"):
        return None
    a = ce_floor.coefficients(objective.fn, target, shape)
    best = ce_floor.best(a, shape, constant=constant) if a is not None else None
    floor = _value(objective, "ce", best) if best is not None else None
    if floor is None or floor <= 1e-12:
        return None  # hard class indices, no smoothing: the floor is 0, nothing to adjust
    given = ce_floor.settings(objective.fn)
    parts = [f"label_smoothing={given['label_smoothing']:g} over {shape[1 if len(shape) >= 2 else 0]} classes"
             if given["label_smoothing"] else "", "class weights" if given["weight"] is not None else "",
             "soft targets" if target.is_floating_point() else ""]
    made = ", ".join(p for p in parts if p)
    if constant:
        return floor, (f"every sample has the same input, so the best prediction is one distribution for all: "
                       f"its loss, {floor:.4g} ({made}), is the floor")
    return floor, (f"the loss of the best possible prediction (softmax = the {'smoothed ' if given['label_smoothing'] else ''}"
                   f"target{', weighted' if given['weight'] is not None else ''}), {floor:.4g} ({made}), is the floor")
