"""A loss summed over the batch (``reduction='sum'``, ``(out - y).pow(2).sum()``): the step scales with N.

A mean loss's gradient does not depend on how many values it averages; a summed loss's gradient is
N× larger (N the elements summed: ``F.mse_loss(out, y, reduction='sum')`` over a (256, 32) output
sums 8,192). Plain SGD steps by ``lr × gradient``, so its effective learning rate is N× the one
given: an lr that suits a mean loss blows the weights up, and train-check's generic advice ("lower
the lr") hides the reason. Adam-type optimizers divide the gradient by its own running scale, so
their steps barely depend on the loss's scale (only through ``eps`` and coupled weight decay): for
them the sum is no cause and is not flagged.

What is seen is certain, not guessed: the autograd node at the root of the first step's loss — a
torch loss whose saved ``reduction`` is sum (``MseLossBackward0``, ``NllLossBackward0`` of
``cross_entropy``, …, torch's enum: 0 none, 1 mean, 2 sum) or a full ``.sum()`` (``SumBackward0``),
with the element count from the tensor the node saved. A loss divided by N afterwards (the hand fix)
has a ``DivBackward0`` root and is not read as summed.

When SGD's run failed (NaN/Inf, ``unstable``, a loss that rises or stays flat) the claim is tested,
not asserted: the run is replayed (:mod:`~layerlab.train.replay`) with the loss divided by N — what
``reduction='mean'`` computes — and the finding says what that replay did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch

from layerlab.errors import Problem

__all__ = ["Summed", "detect", "scales_with_loss", "findings"]

_SUM = 2  # torch's at::Reduction::Sum, as autograd nodes save it
_NAMES = {"MseLossBackward0": "mse_loss", "L1LossBackward0": "l1_loss", "HuberLossBackward0": "huber_loss",
          "SmoothL1LossBackward0": "smooth_l1_loss", "NllLossBackward0": "nll_loss",
          "NllLoss2DBackward0": "nll_loss", "BinaryCrossEntropyBackward0": "binary_cross_entropy",
          "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits",
          "SoftMarginLossBackward0": "soft_margin_loss", "MultiMarginLossBackward0": "multi_margin_loss",
          "MultilabelMarginLossBackward0": "multilabel_margin_loss", "KlDivBackward0": "kl_div"}


@dataclass
class Summed:
    """The loss is a sum of ``count`` elements; ``how`` says what summed them (for the message)."""

    count: int
    how: str


#: a constant factor (``0.9 * loss``, ``loss / 2``) keeps a sum a sum: looked through
_SCALED = ("MulBackward1", "DivBackward1")
#: a weighted sum of losses (``cross_entropy(label_smoothing=ε)`` is (1 − ε)·nll + ε/C·Σ −log p): summed
#: when every term is
_ADDED = ("AddBackward0", "SubBackward0")


def detect(value: torch.Tensor) -> Optional[Summed]:
    """Read the first step's loss: a sum over more than one element, or ``None``."""
    return _node(getattr(value, "grad_fn", None), 0)


def _node(node: Any, depth: int) -> Optional[Summed]:
    if node is None or depth > 6:
        return None
    name = type(node).__name__
    if name in _SCALED:
        return _node(node.next_functions[0][0], depth + 1) if node.next_functions else None
    if name in _ADDED:
        terms = [_node(n, depth + 1) for n, _ in node.next_functions if n is not None]
        if not terms or any(t is None for t in terms):
            return None
        main = max(terms, key=lambda t: t.count)
        smoothed = len(terms) > 1 and any(t.how.startswith("cross_entropy") for t in terms)
        return Summed(main.count, "cross_entropy with label_smoothing and reduction='sum'" if smoothed else main.how)
    return _leaf(node, name)


def _leaf(node: Any, name: str) -> Optional[Summed]:
    count = None
    if name == "SumBackward0":  # a full .sum(); SumBackward1 (sum over dims) is not a scalar loss's root
        sizes = getattr(node, "_saved_self_sym_sizes", None)
        count = math.prod(int(s) for s in sizes) if sizes is not None else None
        how = f"a .sum() over a {list(int(s) for s in sizes)} tensor" if sizes is not None else ""
    elif getattr(node, "_saved_reduction", None) == _SUM:
        saved = getattr(node, "_saved_target", None) if name.startswith("NllLoss") else None
        saved = saved if isinstance(saved, torch.Tensor) else getattr(node, "_saved_self", None)
        count = saved.numel() if isinstance(saved, torch.Tensor) else None
        nll = name.startswith("NllLoss") and any(
            n is not None and type(n).__name__ == "LogSoftmaxBackward0" for n, _ in node.next_functions)
        how = f"{'cross_entropy' if nll else _NAMES.get(name, name)} with reduction='sum'"
    if count is None or count < 2:
        return None
    return Summed(count, how)


def scales_with_loss(opt: Any) -> bool:
    """SGD's step is lr × gradient: it grows with the loss's scale (Adam-type steps do not)."""
    return isinstance(opt, (torch.optim.SGD, torch.optim.ASGD))


def findings(summed: Optional[Summed], opt: Any, rate: Optional[float], failed: bool, flags: List[Problem],
             again: Optional[Callable[[Callable], Any]]) -> Optional[Problem]:
    """The ``summed-loss`` finding when SGD's run failed: an error when the replay with the loss divided by
    N trains (the sum is the cause), a warning when it does not or could not run.

    ``again(scale_loss)`` replays the run with the loss changed by ``scale_loss(value)``; ``flags``'
    generic "lower the lr" hints are pointed at the finding.
    """
    if summed is None or not failed or not scales_with_loss(opt):
        return None
    n = summed.count
    lr_text = f"SGD at lr {rate:g} steps as lr {rate * n:.3g} would on the mean loss" if rate else \
        "SGD's effective lr is that many times the one given"
    message = (f"the loss is summed over {n:,} elements ({summed.how}): its gradient is {n:,}× the mean "
               f"loss's, so {lr_text}")
    fix = f"use reduction='mean' (or divide the loss by {n:,})" + (
        f", or lower --lr to {rate / n:.3g} (lr / {n:,})" if rate else "")
    result = again(lambda value: value / n) if again is not None else None
    if result is None:
        severity, tested = "warning", " (untested: a replay with the loss divided by N could not run)"
    elif result.verdict.verdict in ("overfits", "falls", "slow"):
        severity, tested = "error", (f". Replayed with the loss divided by {n:,} (what reduction='mean' computes), "
                                     f"the same run trains: {result.verdict.message}")
    else:  # the mean loss fails too: the sum is not what stops it, so it is not named as the cause
        return Problem("summed-loss", f"{message}; but replayed with the loss divided by {n:,} it does not train "
                       f"either ({result.verdict.verdict}: {result.verdict.message}): the sum is not what stops it",
                       where="(loss)", severity="warning", hint=fix,
                       data={"count": n, "how": summed.how, "replay": {"verdict": result.verdict.verdict,
                                                                       "losses": result.losses}})
    for f in flags:
        if f.code in ("unstable", "nonfinite", "loss-rises", "loss-flat") and f.hint:
            f.hint += f" — the loss is a sum over {n:,} elements: see summed-loss"
    return Problem("summed-loss", message + tested, where="(loss)", severity=severity, hint=fix,
                   data={"count": n, "how": summed.how,
                         "replay": None if result is None else {"verdict": result.verdict.verdict,
                                                                "losses": result.losses}})
