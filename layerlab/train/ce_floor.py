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

Your own function that calls ``F.cross_entropy(..., label_smoothing=ε)`` is recognised in its first loss
graph (:func:`read_graph`), and its floor is then found the same way, with your function.

When every sample gives the same prediction (:func:`~layerlab.train.floor.constant_floor`), the best
constant is ``Σ_i a_i`` normalised: the same argument on the summed coefficients.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["settings", "coefficients", "best", "Read", "read_graph", "adopt"]


class Read:
    """The user's own loss function, with the cross-entropy settings its first loss graph showed
    (:func:`read_graph`): called exactly as the function itself."""

    def __init__(self, fn: Any, found: dict) -> None:
        self.fn, self.found = fn, found
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, prediction: Any, target: Any) -> Any:
        return self.fn(prediction, target)


def read_graph(value: Any, shape: Sequence[int]) -> Optional[dict]:
    """The settings of ``F.cross_entropy(..., label_smoothing=ε)`` called inside your own loss function, read
    in its first loss's graph: torch computes it as ``(1 − ε)·nll(log_softmax) + (ε / C)·smooth`` — an add of
    two constant factors, one on a ``nll_loss`` of a ``log_softmax``. ``None`` unless exactly that, with
    ``ε / C`` consistent with the prediction's class count (``shape``)."""
    node = getattr(value, "grad_fn", None)
    if node is None or type(node).__name__ != "AddBackward0" or len(shape) == 0:
        return None
    terms = [n for n, _ in node.next_functions]
    if len(terms) != 2 or any(t is None or type(t).__name__ != "MulBackward1" or not t.next_functions
                              or not isinstance(getattr(t, "_saved_other", None), (int, float)) for t in terms):
        return None
    nll = [i for i, t in enumerate(terms) if type(t.next_functions[0][0]).__name__.startswith("NllLoss")]
    if len(nll) != 1:
        return None
    loss = terms[nll[0]].next_functions[0][0]
    eps, share = 1.0 - float(terms[nll[0]]._saved_other), float(terms[1 - nll[0]]._saved_other)
    classes = int(shape[1 if len(shape) >= 2 else 0])
    if not 0 < eps < 1 or not math.isclose(share * classes, eps, rel_tol=1e-5) or not loss.next_functions or \
            type(loss.next_functions[0][0]).__name__ != "LogSoftmaxBackward0":
        return None
    ignore = int(loss._saved_ignore_index)  # saved as an unsigned 64-bit integer
    weight = loss._saved_weight
    return {"weight": weight if isinstance(weight, torch.Tensor) else None, "label_smoothing": eps,
            "ignore_index": ignore - 2 ** 64 if ignore >= 2 ** 63 else ignore}


def adopt(objective: Any, value: Any, shape: Sequence[int]) -> None:
    """Wrap the objective's own loss function in :class:`Read` when its first loss graph is a smoothed
    cross-entropy that :func:`settings` does not know by identity (so its floor can be found)."""
    fn = getattr(objective, "fn", None)
    if fn is None or settings(fn) is not None:
        return
    found = read_graph(value, shape)
    if found is not None:
        objective.fn = Read(fn, found)


def settings(fn: Any) -> Optional[dict]:
    """``weight``, ``label_smoothing``, ``ignore_index`` of torch's cross-entropy ``fn``; ``None`` for another loss.
    ``F.cross_entropy`` called as ``fn(prediction, target)`` uses its defaults."""
    if isinstance(fn, Read):
        return fn.found
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
