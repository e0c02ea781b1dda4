"""The best prediction of a cross-entropy, with its class weights, label smoothing and ignore_index.

torch's cross-entropy of one sample (class dim ``C``; ``ε`` = ``label_smoothing``; ``w`` = ``weight``,
all ones without it; ``p = softmax(logits)``) is, up to a positive normalisation the prediction does
not change (the mean over the samples, or over ``Σ w[y]`` with weights):

* class index ``y``: ``−(1 − ε)·w[y]·log p[y] − (ε / C)·Σ_c w[c]·log p[c]``;
* class probabilities ``t``: ``−Σ_c w[c]·t'[c]·log p[c]`` with ``t' = (1 − ε)·t + ε / C``.

Both are ``−Σ_c a[c]·log p[c]`` with ``a ≥ 0``, whose minimum over the simplex is at ``p = a / Σ a``
(Gibbs' inequality), exactly: without weights that is the smoothed target itself, and the floor is
its entropy ``−(1−ε+ε/C)·log(1−ε+ε/C) − (C−1)·(ε/C)·log(ε/C)`` for a class index. The floor is then
the user's own loss at ``log(a / Σ a)`` (:func:`~layerlab.train.floor._value`), so reduction,
weights and normalisation are torch's, not a copy of them. A position whose class index is
``ignore_index`` counts for nothing (``a = 0``; its own best prediction is arbitrary).

When every sample gives the same prediction (:func:`~layerlab.train.floor.constant_floor`), the best
constant is ``Σ_i a_i`` normalised: the same argument on the summed coefficients.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["settings", "coefficients", "best"]


def settings(fn: Any) -> Optional[dict]:
    """``weight``, ``label_smoothing``, ``ignore_index`` of torch's cross-entropy ``fn``; ``None`` for another loss.
    ``F.cross_entropy`` called as ``fn(prediction, target)`` uses its defaults."""
    if fn is F.cross_entropy:
        return {"weight": None, "label_smoothing": 0.0, "ignore_index": -100}
    if isinstance(fn, nn.CrossEntropyLoss):
        return {"weight": fn.weight, "label_smoothing": float(fn.label_smoothing), "ignore_index": fn.ignore_index}
    return None


def coefficients(fn: Any, target: torch.Tensor, shape: Sequence[int]) -> Optional[torch.Tensor]:
    """``a`` of the module docstring, shaped like the prediction (``shape``: ``(N, C, d…)`` or ``(C,)``);
    ``None`` when the target does not fit the shape or a coefficient would be negative (no minimum)."""
    given = settings(fn)
    if given is None or len(shape) == 0:
        return None
    class_dim = 1 if len(shape) >= 2 else 0
    c = int(shape[class_dim])
    eps, weight = given["label_smoothing"], given["weight"]
    w = torch.ones(c, dtype=torch.float64) if weight is None else weight.detach().double().cpu()
    if c < 1 or w.numel() != c or bool((w < 0).any()):
        return None
    view = [1] * len(shape)
    view[class_dim] = c
    w = w.reshape(view)
    t = target.detach().cpu()
    if t.is_floating_point():  # class probabilities (``ignore_index`` does not apply to them)
        if list(t.shape) != list(shape) or bool((t < 0).any()):
            return None
        return w * ((1 - eps) * t.double() + eps / c)
    expected = list(shape[:class_dim]) + list(shape[class_dim + 1:])
    if list(t.shape) != expected:
        return None
    ignored = t == given["ignore_index"]
    kept = t.masked_fill(ignored, 0).long()
    if bool((kept < 0).any()) or bool((kept >= c).any()):
        return None
    onehot = F.one_hot(kept, c).double().movedim(-1, class_dim)
    mine = (onehot * w).sum(class_dim, keepdim=True)  # w[y] at every position
    a = (1 - eps) * mine * onehot + (eps / c) * w
    return a * (~ignored).unsqueeze(class_dim).double()


def best(a: torch.Tensor, shape: Sequence[int], constant: bool = False) -> Optional[torch.Tensor]:
    """The probabilities that minimise the loss: ``a / Σ_c a`` per position (``constant``: one for every
    sample, from ``Σ_i a_i``); positions with ``a = 0`` everywhere (ignored) get the uniform distribution."""
    class_dim = 1 if len(shape) >= 2 else 0
    if constant:
        a = a.sum(0, keepdim=True).expand_as(a)
    total = a.sum(class_dim, keepdim=True)
    uniform = torch.full_like(a, 1.0 / a.shape[class_dim])
    return torch.where(total > 0, a / total.clamp(min=1e-300), uniform)
