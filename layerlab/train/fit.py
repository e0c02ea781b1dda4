"""Did the loss fall on one fixed batch? The verdict and the reason a model may not fit exactly.

The loss of the last few steps (their minimum, so one noisy step from dropout does not decide)
against the first step's:

* ``overfits``: ≥ :data:`EXPECTED` (10×) smaller — the model can memorise one batch;
* ``falls``: at least :data:`MIN_FALL` (10 %) smaller but short of 10×. Not a failure: a model
  with fewer trainable parameters than target values cannot fit a random target exactly (a Conv2d
  with 448 weights mapping to 8192 random numbers has a least-squares floor well above 0), and
  a deep or recurrent model may need more steps; the message says which applies;
* ``slow``: short of 10 % but at least :data:`MIN_SLOW` (0.1 %) smaller, and falling at most steps
  (:data:`STEADY` of the step-to-step changes are decreases). Not a failure: the model learns, only
  slowly — a small ``--lr`` (Adam at 1e-4), plain SGD at its default 0.1 on a 2-layer LSTM (0.35 %
  in 50 steps) or on weights initialised small (a Hugging Face std 0.02 init: the product of small
  weights gives small gradients) — and 50 steps are too few to tell whether it could overfit. Said
  as a warning with the way to find out (more steps, a larger lr); updates too small to learn
  anything are :mod:`~layerlab.train.updates`' ``not-learning``, judged on the weights, not here.
  The noise of dropout alone does not make a curve fall at most steps;
* ``flat`` (within ±10 %, not ``slow``) or ``rises`` (> 10 % larger): a failure — whatever the
  capacity, a few dozen steps on one batch lower a loss that is wired up right;
* ``nonfinite``: the run stopped at a NaN/Inf (see :mod:`layerlab.train.diverge`).

A loss already 0 (or ≤ 1e-12) at the first step has nothing to fall from: ``overfits``.

A loss whose minimum given its target is known exactly and above 0 (soft targets, see :mod:`~.floor`)
is judged on its fall *above* that floor, ``(initial − floor) / (final − floor)``: a soft-target BCE
that reached its targets' entropy has fitted the batch, however small ``initial / final`` is.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

from layerlab.train.report import FitVerdict

__all__ = ["EXPECTED", "MIN_FALL", "MIN_SLOW", "STEADY", "judge", "clause"]

EXPECTED = 10.0
MIN_FALL = 0.10
MIN_SLOW = 0.001
STEADY = 2 / 3
_TAIL = 5


def _steady(losses: List[float]) -> bool:
    """Most step-to-step changes are decreases (a slow but real fall, not noise around a level)."""
    changes = [b - a for a, b in zip(losses, losses[1:]) if math.isfinite(a) and math.isfinite(b)]
    return bool(changes) and sum(c < 0 for c in changes) >= STEADY * len(changes)


def judge(losses: List[float], steps: int, trainable: int, target_values: Optional[int],
          stopped: bool, floor: Optional[Tuple[float, str]] = None) -> FitVerdict:
    """``floor``: ``(value, why)``, the exact minimum of the loss given its target (:mod:`~.floor`);
    the fall is then measured above it."""
    initial = losses[0] if losses else math.nan
    tail = [v for v in losses[-_TAIL:] if math.isfinite(v)]
    final = min(tail) if tail else math.nan
    if stopped or not math.isfinite(initial) or not tail:
        return FitVerdict("nonfinite", initial, final, math.nan, EXPECTED, trainable, target_values,
                          f"the run stopped at step {len(losses) - 1}: the loss or a gradient was not finite")
    if abs(initial) <= 1e-12:
        return FitVerdict("overfits", initial, final, math.inf, EXPECTED, trainable, target_values,
                          "the loss is already 0 at the first step: nothing to fall from")
    n = len(losses)
    if initial < 0 or final < 0:  # a loss that can go negative (nll of unnormalised scores) has no "×"
        factor = math.nan
        fell, rose = final <= initial - MIN_FALL * abs(initial), final > initial + MIN_FALL * abs(initial)
        verdict = "falls" if fell else "rises" if rose else "flat"
        return FitVerdict(verdict, initial, final, factor, EXPECTED, trainable, target_values,
                          f"{initial:.4g} → {final:.4g} in {n} steps (a loss below 0 has no floor to fall to)")
    if floor is not None and 0 < floor[0] < initial:
        above = _above_floor(initial, final, floor, n)
        if above is not None:
            return FitVerdict(above[0], initial, final, above[1], EXPECTED, trainable, target_values, above[2])
    factor = initial / final if final > 0 else math.inf
    if factor >= EXPECTED:
        return FitVerdict("overfits", initial, final, factor, EXPECTED, trainable, target_values,
                          f"fell {_x(factor)} in {n} steps: it can overfit one batch")
    if final <= initial * (1 - MIN_FALL):
        if target_values is not None and trainable < target_values:
            why = (f"it cannot fit a random target exactly: {trainable:,} trainable values for "
                   f"{target_values:,} target values, so the loss has a floor above 0")
        else:
            # a prediction layerlab has not tested: say how to find out, not that it will work
            why = (f"short of {EXPECTED:g}×; whether more steps get there is not tested here: run "
                   f"--steps {steps * 4} (or a larger --lr) to find out")
        return FitVerdict("falls", initial, final, factor, EXPECTED, trainable, target_values,
                          f"fell {_x(factor)} in {n} steps; {why}")
    if final <= initial * (1 - MIN_SLOW) and _steady(losses):
        if target_values is not None and trainable < target_values:
            why = (f"with {trainable:,} trainable values for {target_values:,} random target values it may be "
                   "near its floor")
        else:
            why = f"too slowly to tell in {n} steps whether it can overfit one batch"
        return FitVerdict("slow", initial, final, factor, EXPECTED, trainable, target_values,
                          f"fell only {(1 - final / initial) * 100:.2g} % in {n} steps, but steadily: it learns; {why}")
    if final <= initial * (1 + MIN_FALL):
        return FitVerdict("flat", initial, final, factor, EXPECTED, trainable, target_values,
                          f"did not fall in {n} steps ({initial:.4g} → {final:.4g}): the model is not learning "
                          "this batch")
    return FitVerdict("rises", initial, final, factor, EXPECTED, trainable, target_values,
                      f"rose in {n} steps ({initial:.4g} → {final:.4g}): the steps go the wrong way or are too large")


def _above_floor(initial: float, final: float, floor: Tuple[float, str], n: int
                 ) -> Optional[Tuple[str, float, str]]:
    """``(verdict, factor, message)`` of a fall measured above an exact floor, or ``None`` when the
    loss did not fall far enough for the floor to change the verdict (the plain rules then apply)."""
    value, why = floor
    gap = final - value
    factor = (initial - value) / gap if gap > 0 else math.inf  # at (or a rounding below) the floor: all the way
    if factor >= EXPECTED:
        return "overfits", factor, (f"fell {_x(factor)} above its floor in {n} steps ({initial:.4g} → {final:.4g}; "
                                    f"{why}): it fits this batch down to that floor")
    if final <= initial * (1 - MIN_FALL):
        return "falls", factor, (f"fell {_x(factor)} above its floor in {n} steps ({initial:.4g} → {final:.4g}; "
                                 f"{why}); short of {EXPECTED:g}× above it; whether more steps get there is not "
                                 f"tested here: run more --steps (or a larger --lr) to find out")
    return None


def _x(factor: float) -> str:
    return f"{factor:.3g}×" if math.isfinite(factor) else "to 0"


def clause(message: str, sep: str = "; ") -> str:
    """The part of a verdict's ``message`` before its first ``sep`` outside parentheses: a fall above a
    floor carries ``(initial → final; why the floor)``, whose own ``; `` and ``: `` belong to it."""
    depth = 0
    for i, ch in enumerate(message):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and message.startswith(sep, i):
            return message[:i]
    return message
