"""Dropout so high (p > 0.5) that the model cannot overfit one batch in train mode — tested, not assumed.

Each step of a train-mode run drops a fresh random share ``p`` of a dropout module's inputs and
scales the rest by 1/(1 − p). At p = 0.9 nine units in ten are gone at every step, the prediction
of one batch changes from step to step, and the loss of that batch stops falling well short of
the 10× that "can overfit one batch" asks for — more steps do not help. Measured on a 16→64→4 MLP
with ``nn.Dropout(0.9)``, Adam lr 1e-2, MSE on a random target: 3.5× after 50 steps, 3.6× after
200, 3.5× after 1000 (the minimum of the last five steps), while p = 0.1 gives 39× in 50 and
p = 0.5 gives 6.9× in 50 and 13× in 200. A common origin: TensorFlow 1's ``keep_prob=0.9`` ported
as torch's ``p=0.9``, which is the probability to *drop*.

Rule, for a model with an active ``nn.Dropout``-family module of ``p`` > :data:`HIGH_P` whose loss
did not overfit: replay the run (:mod:`~layerlab.train.replay`) with every dropout module off and
everything else the same. If the replay overfits, the dropout is what holds the loss up: a
``dropout-high`` warning names the module(s) and p, with both measured factors. If it does not,
dropout is not the (only) reason, and the verdict only says so. Ordinary dropout (p ≤ 0.5, Hugging
Face's 0.1) is never replayed nor flagged: its note stays "dropout keeps the loss noisy".
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch.nn as nn

from layerlab.errors import Problem
from layerlab.train import fit
from layerlab.train.report import FitVerdict

__all__ = ["HIGH_P", "high", "dropout_off", "findings"]

HIGH_P = 0.5
_DROPOUTS = (nn.modules.dropout._DropoutNd,)


def high(model: nn.Module) -> List[Tuple[str, float]]:
    """``(path, p)`` of the dropout modules active in training with p above :data:`HIGH_P`."""
    return [(path or "(root)", float(m.p)) for path, m in model.named_modules()
            if isinstance(m, _DROPOUTS) and m.training and float(getattr(m, "p", 0)) > HIGH_P]


def dropout_off(model: nn.Module) -> None:
    """Every dropout module to eval mode (the rest of the model keeps its mode)."""
    for m in model.modules():
        if isinstance(m, _DROPOUTS):
            m.eval()


def findings(model: nn.Module, verdict: FitVerdict, again: Optional[Callable[..., Any]]) -> Optional[Problem]:
    """The ``dropout-high`` finding (and the verdict's message corrected), or ``None``."""
    found = high(model)
    if not found or verdict.verdict not in ("falls", "slow", "flat") or again is None:
        return None
    result = again(None, dropout_off)
    if result is None:
        return None
    named = _and([f"{path} (p={p:g})" for path, p in found])
    head = fit.clause(verdict.message)  # "fell 3.55× in 50 steps" without the "more steps" advice
    if result.verdict.verdict != "overfits":
        verdict.message += (f"; replayed with the dropout modules off it does not overfit either "
                            f"({result.verdict.message}), so dropout at {named} alone is not what keeps it short")
        return None
    fell = fit.clause(result.verdict.message, ": ")  # "fell 150× in 50 steps"
    keeps = "is what keeps" if len(found) == 1 else "are what keep"
    verdict.message = (f"{head} in train mode; with the dropout modules off the same run {fell}: "
                       f"the model can fit the batch, dropout {named} {keeps} the loss up (see dropout-high)")
    path, p = max(found, key=lambda f: f[1])
    shares = [f"{q * 100:.0f} %" for _, q in found]
    drop = (f"drops {shares[0]} of its inputs" if len(found) == 1 else f"drop {shares[0]} of their inputs"
            if len(set(shares)) == 1 else f"drop {_and(shares)} of their inputs respectively")
    return Problem(
        "dropout-high",
        f"dropout {named} {drop} at every step: in train mode the loss {head}, short of "
        f"{verdict.expected:g}×; replayed with the dropout modules off (same weights, batch, optimizer, seed) it "
        f"{fell} — the dropout, not the model, keeps this batch's loss up",
        where=path, severity="warning",
        data={"modules": [{"path": q, "p": v} for q, v in found], "factor_train": verdict.factor,
              "factor_dropout_off": result.verdict.factor},
        hint=f"torch's p is the probability to drop, not to keep (TensorFlow 1's keep_prob): if {p:g} was meant "
             f"as the share kept, write p={1 - p:.2g}; otherwise use p ≤ 0.5, or judge the fit with dropout off "
             "(--mode eval)")


def _and(items: List[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
