"""What the optimizer does between backward and the update, seen from outside the optimizer.

The loop calls ``optimizer.zero_grad()``, the forward, ``backward()`` and ``optimizer.step()``. Two
things a user's own optimizer (or a loop folded into one: a subclass whose ``step`` clips first, one
whose ``zero_grad`` does nothing) can do wrong there, and neither shows in the gradients or the loss:

* ``grads-accumulate``: ``zero_grad()`` left gradients in place, so each backward *adds* to those of
  every earlier step — step t moves by the sum of t gradients (the classic forgotten
  ``optimizer.zero_grad()``). Seen directly: a gradient that is still there, non-zero, right after
  ``zero_grad()`` returned. With plain SGD such a run can still drive one batch's loss to 0 (the sum
  acts as a momentum), so a loss that falls proves nothing here: it is an error either way.
* ``step-shrunk``: plain SGD's first step is exactly ``lr · (g + weight_decay · w)`` (momentum's buffer
  starts as that gradient itself), with ``g`` the gradient backward left. A first update a thousand
  times smaller means something between backward and the update shrinks the gradient:
  ``clip_grad_norm_`` with a tiny ``max_norm``, a ``GradScaler`` scale not undone, a custom ``step``.
  Raising the lr (the generic advice for an update too small to learn) is then not the fix. Only
  SGD's first step has that closed form (Adam normalises the gradient away), so only it is measured.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch

from layerlab.errors import Problem
from layerlab.probe.safe_norm import host_norm
from layerlab.train.updates import stored_values

__all__ = ["LoopWatch", "leftover_grads", "FirstStep", "accumulate_finding", "point_hints", "SHRUNK"]

#: a first SGD update this many times smaller than lr · gradient is not rounding: the gradient was shrunk
SHRUNK = 1e-3


def leftover_grads(opt: torch.optim.Optimizer, names: Dict[int, str]) -> List[str]:
    """Names of the optimizer's parameters whose gradient is still non-zero right after ``zero_grad()``."""
    with torch.no_grad():
        return [names.get(id(p), "?") for group in opt.param_groups for p in group["params"]
                if p.grad is not None and bool(stored_values(p.grad).ne(0).any())]


def accumulate_finding(step: Optional[int], left: List[str]) -> Optional[Problem]:
    if step is None:
        return None
    shown = ", ".join(left[:4]) + (" …" if len(left) > 4 else "")
    return Problem("grads-accumulate", f"optimizer.zero_grad() left the gradients of {len(left)} parameter(s) in "
                   f"place (seen before step {step}'s backward: {shown}): each backward adds to the gradients of "
                   "every earlier step, so step t moves by the sum of t gradients — gradient accumulation with no "
                   "reset", where="optimizer", severity="error",
                   hint="call optimizer.zero_grad() once per step, before backward; to accumulate on purpose, "
                        "step and zero every k micro-batches",
                   data={"step": step, "params": left})


class FirstStep:
    """Plain SGD's first update against the ``lr · (g + weight_decay · w)`` it must be."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt
        self.applies = isinstance(opt, torch.optim.SGD) and all(
            not g.get("nesterov") and not g.get("maximize") for g in opt.param_groups)
        self.expected: Optional[float] = None
        self.actual: Optional[float] = None
        self._before: List[torch.Tensor] = []
        self._params: List[torch.Tensor] = []

    def before(self) -> None:
        if not self.applies:
            return
        total = 0.0
        with torch.no_grad():
            for group in self.opt.param_groups:
                lr, wd = group.get("lr"), group.get("weight_decay") or 0.0
                if not isinstance(lr, (int, float)) or not isinstance(wd, (int, float)):
                    self.applies = False
                    return
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.is_sparse and wd:  # torch's SGD refuses this pair itself
                        self.applies = False
                        return
                    total += (lr * host_norm(stored_values(p.grad + wd * p if wd else p.grad))) ** 2
                    self._params.append(p)
                    self._before.append(p.detach().clone())
        self.expected = math.sqrt(total)

    def after(self) -> None:
        if not self.applies or not self._params:
            return
        with torch.no_grad():
            self.actual = math.sqrt(sum(host_norm(p.detach() - b) ** 2
                                        for p, b in zip(self._params, self._before)))
        self._before, self._params = [], []

    def finding(self, fit: str) -> Optional[Problem]:
        """``step-shrunk`` when the first update was far below lr · gradient (an error unless it overfits)."""
        if self.expected is None or self.actual is None or not math.isfinite(self.expected) or self.expected == 0:
            return None
        ratio = self.actual / self.expected
        if ratio >= SHRUNK:
            return None
        times = f"{1 / ratio:.3g}× less" if ratio > 0 else "not at all, instead of"
        return Problem("step-shrunk", f"SGD's first step moved the weights by {self.actual:.3g}, {times} "
                       f"than lr × gradient ({self.expected:.3g}): something between backward and the update "
                       "shrinks the gradient — clip_grad_norm_ with a tiny max_norm, a GradScaler's scale not "
                       "undone, a custom step — so a larger lr is not the fix", where="optimizer",
                       severity="warning" if fit == "overfits" else "error",
                       hint="check max_norm of gradient clipping (1.0 is usual) and what your step does to "
                            "p.grad; the gradients backward produced are in --json",
                       data={"expected": self.expected, "actual": self.actual})


def point_hints(flags: List[Problem]) -> None:
    """With the step shrunk, "raise the lr" (not-learning, a flat loss) is the wrong advice: point at the cause."""
    if any(f.code == "step-shrunk" and f.severity == "error" for f in flags):
        for f in flags:
            if f.code in ("not-learning", "loss-flat", "loss-slow"):
                f.hint = "see step-shrunk: the gradient is shrunk before the update, so a larger lr is not the fix"


class LoopWatch:
    """Both checks, hooked into the loop: ``zeroed(step)`` after ``zero_grad()``, ``stepping(step)`` and
    ``stepped(step)`` around ``step()``; ``findings(fit)`` after the run."""

    def __init__(self, opt: torch.optim.Optimizer, names: Dict[int, str]) -> None:
        self.opt, self.names = opt, names
        self.first = FirstStep(opt)
        self.accumulated: tuple = (None, [])  # (step, names): gradients zero_grad() left in place

    def zeroed(self, step: int) -> None:
        if step and self.accumulated[0] is None:
            left = leftover_grads(self.opt, self.names)
            self.accumulated = (step, left) if left else self.accumulated

    def stepping(self, step: int) -> None:
        if step == 0:
            self.first.before()

    def stepped(self, step: int) -> None:
        if step == 0:
            self.first.after()

    def findings(self, fit: str) -> List[Problem]:
        return [f for f in (accumulate_finding(*self.accumulated), self.first.finding(fit)) if f is not None]
