"""Gradients that vanish through a stack of saturating activations (sigmoid, tanh).

``not-learning`` (:mod:`~.updates`) says the earliest layers' steps are too small and suggests a
larger lr. When the update/weight ratio instead grows steadily with depth — by 1000× or more from
the first layer to the last — across three or more ``nn.Sigmoid``/``nn.Tanh`` modules, the small
steps are the gradient shrinking on its way back (each sigmoid passes at most a quarter of it), and
a larger lr would move the last layers far too much long before the first ones learn. Then the
finding says so and gives that fix instead. Measured on 8 Linear+Sigmoid layers of width 32 (one
batch of 16, 50 steps): SGD 0.1 and Adam 1e-2 both stay flat, LayerNorm before each sigmoid does not
help; GELU with Adam overfits (1000×), ReLU with Adam falls 5.6×.
"""

from __future__ import annotations

from typing import List

import torch

from layerlab.errors import Problem
from layerlab.train.report import GroupTrace

__all__ = ["amend"]

SPAN = 1e3


def amend(flags: List[Problem], groups: List[GroupTrace], model: torch.nn.Module) -> None:
    slow = next((f for f in flags if f.code == "not-learning"), None)
    squashing = [p for p, m in model.named_modules() if isinstance(m, (torch.nn.Sigmoid, torch.nn.Tanh))]
    if slow is None or len(squashing) < 3:
        return
    ratios = [(g.label, g.median_ratio) for g in groups if g.median_ratio is not None and g.median_ratio > 0]
    if len(ratios) < 3:
        return
    rising = sum(b[1] >= a[1] for a, b in zip(ratios, ratios[1:]))
    if ratios[-1][1] < SPAN * ratios[0][1] or rising < 0.75 * (len(ratios) - 1):
        return
    slow.message += (f"; the ratio grows {ratios[-1][1] / ratios[0][1]:.2g}× from {ratios[0][0]} to {ratios[-1][0]} "
                     f"through {len(squashing)} sigmoid/tanh modules: the gradient vanishes on its way back")
    slow.where = ratios[0][0]
    slow.hint = ("replace the sigmoid/tanh between the layers with ReLU/GELU and train with Adam rather than plain "
                 "SGD, or use fewer layers; a larger lr would move the last layers far too much before the first "
                 "ones learn")
    slow.data["vanishing"] = {"first": ratios[0][1], "last": ratios[-1][1], "activations": squashing}
    same = next((f for f in flags if f.code == "constant-output" and f.severity == "error"), None)
    if same is not None:  # the stack that shrinks the gradient shrinks the samples' differences forward too:
        flags.remove(same)  # one cause, said once ("the model ignores its input" would send the user elsewhere)
        slow.message += ("; forward, the same stack squashes the differences between samples until the prediction "
                         "is the same for every sample (constant-output)")
