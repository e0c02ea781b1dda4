"""A class-index target that is the model's own input: each position is trained to predict the token it reads.

The classic next-token slip: ``loss(logits, input_ids)`` instead of ``loss(logits[:, :-1], input_ids[:, 1:])``.
Position t then sees its own answer (through a residual, or causal attention that includes position t),
so the loss falls to 0 and the check reads "overfits" — which proves only that the model can copy.
What is seen is certain (the target equals an integer input, element for element); why is not: a token
autoencoder wants exactly this. So it is a warning. A Hugging Face model given ``labels=input_ids``
shifts inside and computes its own loss: no target is given here, and nothing is said.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from layerlab.errors import Problem

__all__ = ["finding"]


def finding(objective: Any, args: List[Any]) -> Optional[Problem]:
    """``target-is-input`` when the class-index target equals an integer input (``args``: the bound inputs)."""
    target = getattr(objective, "target", None)
    if getattr(objective, "fn", None) is None or not isinstance(target, torch.Tensor) or target.dim() == 0 or \
            target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        return None
    for arg in args:
        x = arg.value
        if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.shape == target.shape and \
                x.device == target.device and torch.equal(x, target):
            return Problem("target-is-input", f"the target is the input {arg.name} itself, element for element: "
                           "each position is trained to predict the token it reads, which any path from a token "
                           "to its own output (a residual, causal attention that includes the position) makes "
                           "trivial — a falling loss proves only that the model can copy", where="(loss)",
                           severity="warning",
                           hint="for next-token prediction compare logits[:, :-1] with ids[:, 1:] (a Hugging Face "
                                "model given labels=input_ids shifts them itself); for a token autoencoder this "
                                "is intended", data={"input": arg.name})
    return None
