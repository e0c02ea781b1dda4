"""The exact floor of a loss given its target: the lowest value any prediction can reach.

A loss whose target is soft has a minimum above 0, and "fell 10×" then asks for the impossible:
sigmoid + ``BCELoss`` against targets in (0, 1) can go no lower than the targets' own entropy, and
"short of 10×, run more steps" would send the user after nothing. Where the minimum is exact it is
computed with the user's own loss, at the prediction that attains it — the target itself:

* ``BCELoss`` / ``F.binary_cross_entropy``: ``loss(t, t)`` = the entropy of the targets;
* ``BCEWithLogitsLoss`` / ``F.binary_cross_entropy_with_logits`` (no ``pos_weight``): ``loss(logit(t), t)``
  (label-smoothed targets 0.05/0.95: the floor is their entropy, 0.199 nats);
* ``cross_entropy`` with class-probability targets (no ``label_smoothing``): ``loss(log t, t)`` = the
  targets' entropy (``log 0`` taken as -1e4: its share of the softmax is exactly 0 in float32/64);
* element-wise losses (mse, L1, smooth L1, Huber) and class-index targets: 0 — no adjustment.

When every sample of the batch has the same input (:mod:`~.constant_output`), the prediction is the
same for every sample and the floor is that of the best *constant* prediction: the target's mean over
the batch for mse (the floor is then the variance of the target rows) and for the soft cross-entropies
(``mean(t)`` is their minimiser too). L1/Huber's best constant is not the mean, and class-index targets
need the class dim: no floor is claimed there.

:func:`layerlab.train.fit.judge` then measures the fall *above* the floor:
``(initial − floor) / (final − floor)``. ``None`` means no exact floor is known (a loss of the user's
own, a weighted loss): the plain fall is judged, as before.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

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
    if fn is F.cross_entropy or (
            isinstance(fn, nn.CrossEntropyLoss) and fn.weight is None and fn.label_smoothing == 0):
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
    with torch.no_grad():
        value = float(fn(_as_logits(kind, best), target))
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


def exact_floor(objective: Any) -> Optional[Tuple[float, str]]:
    """``(floor, why)`` when the target alone puts the loss's minimum above 0, else ``None``."""
    kind = _kind(objective)
    if kind in (None, "elementwise") or not _soft(objective, kind):
        return None
    target = objective.target.detach()
    floor = _value(objective, kind, target)
    if floor is None or floor <= 1e-12:
        return None  # hard 0/1 targets: the floor is 0, nothing to adjust
    return floor, f"the target's own loss, {floor:.4g} (its entropy: the targets are soft), is the floor"


def constant_floor(objective: Any) -> Optional[Tuple[float, str]]:
    """``(floor, why)`` for a prediction that is the same for every sample: the loss at the target's mean."""
    kind = _kind(objective)
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
    elif kind == "ce" and not target.is_floating_point():
        return None  # class indices: the frequencies, but the class dim must be known; not claimed
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
