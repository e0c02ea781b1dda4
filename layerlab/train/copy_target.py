"""A class-index target that is the model's own input: each position is trained to predict the token it reads.

The classic next-token slip: ``loss(logits, input_ids)`` instead of ``loss(logits[:, :-1], input_ids[:, 1:])``.
Position t then sees its own answer (through a residual, or causal attention that includes position t),
so the loss falls to 0 and the check reads "overfits" — which proves only that the model can copy.
What is seen is certain (the target equals an integer input, element for element); why is not: a token
autoencoder wants exactly this. So it is a warning. A Hugging Face model given ``labels=input_ids``
shifts inside and computes its own loss: no target is given here, and nothing is said.

A loss function of your own may shift too (``lambda o, t: F.cross_entropy(o[:, :-1].flatten(0, 1),
t[:, 1:].flatten())`` with ``target=input_ids``: right, and the target *is* the input). So before
warning, the loss's gradient with respect to the first step's prediction is read: a cross-entropy
pulls each position's score for its target class up (that class has the most negative gradient
there). If the position compared with target[t] is not t — at most half the positions with a
gradient have their most-pulled class equal to their own target — the loss shifts and nothing is said.
If this cannot be read (shapes without one class dimension, a loss that fails on a copy), the warning
stays.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from layerlab.errors import Problem

__all__ = ["finding"]


def _aligned(fn: Any, pred: Any, target: torch.Tensor) -> Optional[bool]:
    """Does ``fn`` compare position t of ``pred`` with ``target[t]``? None when that cannot be read."""
    if not isinstance(pred, torch.Tensor) or not pred.is_floating_point() or pred.dim() != target.dim() + 1:
        return None
    dims = [d for d in range(pred.dim()) if pred.shape[:d] + pred.shape[d + 1:] == target.shape]
    if not dims:
        return None
    try:
        p = pred.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            grad, = torch.autograd.grad(fn(p, target), p)
    except Exception:  # evidence only: the run's own loss succeeded on the real prediction
        return None
    for d in dims:
        read = grad.abs().amax(dim=d) > 0  # positions the loss reads (not ignore_index, not cut off)
        if not bool(read.any()):
            continue
        same = grad.argmin(dim=d) == target
        if float(same[read].float().mean()) > 0.5:
            return True
    return False


def finding(objective: Any, args: List[Any], pred: Any = None) -> Optional[Problem]:
    """``target-is-input`` when the class-index target equals an integer input (``args``: the bound inputs)
    and the loss compares each position with its own target (``pred``: the first step's prediction)."""
    target = getattr(objective, "target", None)
    if getattr(objective, "fn", None) is None or not isinstance(target, torch.Tensor) or target.dim() == 0 or \
            target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        return None
    for arg in args:
        x = arg.value
        if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.shape == target.shape and \
                x.device == target.device and torch.equal(x, target):
            if pred is not None and _aligned(objective.fn, pred, target) is False:
                return None  # the loss compares position t with another position's target: it shifts
            return Problem("target-is-input", f"the target is the input {arg.name} itself, element for element: "
                           "each position is trained to predict the token it reads, which any path from a token "
                           "to its own output (a residual, causal attention that includes the position) makes "
                           "trivial — a falling loss proves only that the model can copy", where="(loss)",
                           severity="warning",
                           hint="for next-token prediction compare logits[:, :-1] with ids[:, 1:] (a Hugging Face "
                                "model given labels=input_ids shifts them itself); for a token autoencoder this "
                                "is intended", data={"input": arg.name})
    return None
