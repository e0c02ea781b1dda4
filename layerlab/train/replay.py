"""The same training run again from the same initial weights, with one thing changed: the evidence
behind a finding that names a cause.

"Dropout p=0.9 keeps the loss up" or "the summed loss makes the step too large" is a claim about
what *would* happen without that cause. Rather than assert it from a rule of thumb, train-check
replays the run — same initial weights (a snapshot taken before the first step), same batch, same
optimizer settings, same seed, same number of steps — on a fresh copy with that one thing changed
(the dropout modules off, the loss divided by the count it sums over) and judges the new curve with
the same :func:`layerlab.train.fit.judge`, above the same floor (:mod:`~layerlab.train.floor`: soft
targets, label smoothing), scaled as the loss is (a loss divided by N has its floor divided by N): judged
without it, a replay that reached the floor would read "short of 10×" and a working fix "did not help".
The finding then reports what the replay measured.

A replay costs one more run of the check's steps, so it is only made when a finding needs it, and
the snapshot is only taken when one may: a model with high dropout, an optimizer whose step scales
with the loss (SGD). A replay that raises says nothing (``None``): the finding then claims less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from layerlab.target.copying import copy_model
from layerlab.train import fit
from layerlab.train.report import FitVerdict

__all__ = ["snapshot", "Replay", "replay", "with_floor"]


def snapshot(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The model's weights and buffers before the first step (clones: the run changes the originals)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass
class Replay:
    """What the changed run did: its losses and the verdict :func:`fit.judge` gives them."""

    losses: List[float]
    verdict: FitVerdict

    @property
    def stopped(self) -> bool:
        return self.verdict.verdict == "nonfinite"


def replay(trained: nn.Module, initial: Dict[str, torch.Tensor], positional: list, keyword: Dict[str, Any],
           loss: Callable[[Any], torch.Tensor], make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
           steps: int, seed: int, target_values: Optional[int],
           change: Optional[Callable[[nn.Module], None]] = None,
           floor: Optional[Tuple[float, str]] = None) -> Optional[Replay]:
    """Run ``steps`` steps of ``loss`` on a copy of ``trained`` reset to ``initial``, after ``change(copy)``.

    Args:
        trained (nn.Module): the model the check trained (only its structure and modes are used).
        initial (dict): :func:`snapshot` of it before the first step.
        loss (callable): ``loss(output) -> scalar`` (the check's objective, possibly changed).
        make_optimizer (callable): builds the check's optimizer, with its settings, on the copy.
        change (callable, optional): what to change on the copy before the run (dropout off).
        floor (tuple, optional): ``(value, why)``, the exact minimum of ``loss`` (:func:`fit.judge`'s ``floor``).

    Returns:
        Replay or None: ``None`` when the replay raised (it then shows nothing).
    """
    try:
        twin = copy_model(trained)
        twin.load_state_dict(initial)
        if change is not None:
            change(twin)
        opt = make_optimizer(twin)
        trainable = sum(p.numel() for p in twin.parameters() if p.requires_grad)
        losses: List[float] = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                value = loss(twin(*positional, **keyword))
                losses.append(float(value.detach()))
                if not math.isfinite(losses[-1]):
                    break
                value.backward()
                opt.step()
    except Exception:  # noqa: BLE001 - a replay that cannot run is no evidence either way
        return None
    stopped = not math.isfinite(losses[-1]) if losses else True
    return Replay(losses, fit.judge(losses, steps, trainable, target_values, stopped=stopped, floor=floor))


def with_floor(again: Optional[Callable[..., Any]], floor: Optional[Tuple[float, str]]) -> Optional[Callable[..., Any]]:
    """``again(scale=None, change=None)`` judged above the main run's ``floor``; a loss replayed as
    ``scale(loss)`` has its floor at ``scale(floor)`` (every scale a replay uses is positive and linear)."""
    if again is None or floor is None:
        return again

    def judged(scale=None, change=None):
        if scale is None:
            return again(scale, change, floor=floor)
        value = float(scale(torch.tensor(floor[0], dtype=torch.float64)))
        return again(scale, change, floor=(value, f"{floor[1]}; scaled as the loss is, {value:.4g}"))
    return judged
