"""A regression target on a scale the prediction is nowhere near: the loss stays flat at ≈ mean(target²).

A target left in its raw units (house prices in dollars, ≈ 2e5) against a freshly initialised
network whose outputs are of order 0.1: the loss is ≈ mean(target²) ≈ 4e10, and each optimizer step
moves the prediction by a tiny fraction of what is needed (Adam moves each weight by ≈ lr per step,
so the output by roughly lr × fan-in). The loss "does not fall" (4.2659e10 → 4.2659e10, 50 steps of
Adam at lr 1e-3), every update/weight ratio looks healthy, and nothing else in the report explains
it. The usual fix is to standardise the target, ``(y − mean) / std``, and undo that on the
predictions — not more steps, not a larger lr (SGD at a larger lr on such a loss diverges instead).

Seen after the run, on the trained copy, by one more forward without gradients: the prediction's
root mean square against the target's. Flagged (``target-scale``) only when all of these hold:

* the loss did not fit (flat, or fell short of the expected factor) and nothing went non-finite;
* the target is a floating tensor the user gave (the default random target is this check's choice)
  with the prediction's number of elements (element-wise losses; class indices are never read);
* the target's RMS is at least ``MIN_TARGET`` (10) and ``RATIO`` (100×) the prediction's even after
  the run: a target of 0/1 labels or probabilities is never flagged, and neither is one the model
  has already grown to meet.

Whether the loss's gap comes from the target's mean (an offset) or its spread is said, because the
fix differs: subtract the mean (or initialise the last bias to it), or divide by the std too.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from layerlab.errors import Problem
from layerlab.train import loss as L

__all__ = ["findings", "demote", "MIN_TARGET", "RATIO"]

#: errors that stop parameters learning whatever the target's scale: with one of them, standardising
#: the target is not what makes the model fit (a dead ReLU leaves only the last bias to move)
_BLOCKING = ("dead-relu", "zero-grad", "no-grad", "not-in-optimizer", "wrong-output", "unregistered",
             "recreated-in-forward", "constant-output", "step-shrunk", "grads-accumulate")

MIN_TARGET = 10.0  #: a target RMS below this is on the usual unit scale: never flagged
RATIO = 100.0  #: target RMS ≥ this × prediction RMS after the run


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().double().pow(2).mean().sqrt())


def findings(model: torch.nn.Module, positional: list, keyword: Dict[str, Any], objective: Any, verdict: Any,
             nonfinite: Any, flags: List[Problem]) -> List[Problem]:
    """``[target-scale]`` (an error) when a given float target is ≥ 100× the prediction's scale and the
    loss did not fit (and nothing went non-finite: ``nonfinite`` is None); also points the generic
    ``loss-flat``/``loss-slow`` hint at it. Else ``[]``."""
    found = _finding(model, positional, keyword, objective, verdict, flags) if nonfinite is None else None
    return [found] if found is not None else []


def demote(flags: List[Problem]) -> None:
    """A ``target-scale`` beside an error that stops learning by itself becomes a warning (in place).

    The target's scale is still seen (and worth fixing), but it is not why the loss stays put when no
    gradient reaches the layers: "standardise the target" alone would be a confident wrong fix."""
    blocking = sorted({f"{f.code} {f.where}" for f in flags if f.severity == "error" and f.code in _BLOCKING})
    if not blocking:
        return
    for f in flags:
        if f.code == "target-scale" and f.severity == "error":
            f.severity = "warning"
            f.message += (f"; but {', '.join(blocking)} (see below) stop(s) the model learning whatever the "
                          "target's scale, so standardising it alone will not make it fit")
        elif f.code in ("loss-flat", "loss-slow") and f.hint and f.hint.startswith("see target-scale"):
            f.hint = "fix the errors below first; then see target-scale"


def _finding(model: torch.nn.Module, positional: list, keyword: Dict[str, Any], objective: Any, verdict: Any,
             flags: List[Problem]) -> Optional[Problem]:
    if verdict.verdict not in ("flat", "falls", "slow") or objective is None or objective.fn is None:
        return None
    target = objective.target
    if target is None or not target.is_floating_point() or str(objective.target_source).startswith("random"):
        return None
    t_rms = _rms(target)
    if not t_rms >= MIN_TARGET:
        return None
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            pred = L.select(model(*positional, **keyword), objective.output_path)
    except Exception:  # the run's own forward succeeded; this one is only evidence, never a new failure
        return None
    if not isinstance(pred, torch.Tensor) or not pred.is_floating_point() or pred.numel() != target.numel():
        return None
    p_rms = _rms(pred)
    if not t_rms >= RATIO * max(p_rms, 1e-12):
        return None
    mean, std = float(target.double().mean()), float(target.double().std()) if target.numel() > 1 else 0.0
    offset = abs(mean) > 3 * std
    what = (f"mostly an offset (mean {mean:.3g}, std {std:.3g}): subtract the mean (or set the last layer's bias "
            "to it)" if offset else f"its spread (mean {mean:.3g}, std {std:.3g})")
    message = (f"the target's values are of order {t_rms:.3g} (root mean square), the prediction's {p_rms:.3g} at the "
               f"end of the run: {t_rms / max(p_rms, 1e-12):.3g}× apart. The loss is ≈ mean(target²) and each step "
               f"moves the prediction by a tiny fraction of the gap, so it looks flat even with sane update/weight "
               f"ratios; the gap is {what}")
    for f in flags:  # the generic advice ("check the lr") is not the fix here
        if f.code in ("loss-flat", "loss-slow") and f.where == "(loss)":
            f.hint = "see target-scale: normalise the target, not more steps or a larger lr"
    return Problem("target-scale", message, where="(target)", severity="error",
                   hint="standardise the target, y_n = (y − mean) / std, train on y_n and map predictions back "
                        "(pred × std + mean); or scale the output layer to the target's units",
                   data={"target_rms": t_rms, "prediction_rms": p_rms, "target_mean": mean, "target_std": std})
