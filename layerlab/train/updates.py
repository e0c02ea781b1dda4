"""Gradient norms and update/weight ratios per parameter group, step by step.

A *group* is the parameters one module registers itself (a Linear's weight and bias together), so
a zero-initialised bias does not make its own ratio undefined: its weight carries the group's norm.
The ratio of one update is ‖w_after − w_before‖ / ‖w_before‖ over the group; the handbook's rule
of thumb puts a healthy value near 1e-3 (a step moves the weights by a thousandth). Judged on the
median over the steps:

* ``< NOT_LEARNING`` (1e-5, an order of magnitude under the 1e-4 mark): the updates are too small to
  change anything in a run of this length — flagged only when the loss did not overfit anyway;
* ``> UNSTABLE`` (0.3, three times the 0.1 mark): each step rewrites a large share of the weights,
  what a learning rate orders of magnitude too high does; or a first update more than
  ``FIRST_STEP_UNSTABLE`` (3) times the initial weights' own norm. The second rule is needed for
  Adam: its steps have a fixed size (≈ lr per element), so a too-high lr first blows the weights up
  and the later ratios, measured against the grown weights, look tame (lr 10: 48 on the first step,
  a median of 0.016). A group whose weights are all 0 at the start (a zero-initialised layer) has no
  ratio until they are not, and is never called unstable.

Norms are taken with ``torch._foreach_norm`` (one kernel per list, not one per parameter).
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Tuple

import torch

from layerlab.train.report import GroupTrace

__all__ = ["NOT_LEARNING", "UNSTABLE", "FIRST_STEP_UNSTABLE", "Tracker", "unstable"]

NOT_LEARNING = 1e-5
UNSTABLE = 0.3
FIRST_STEP_UNSTABLE = 3.0


def unstable(group: GroupTrace) -> bool:
    """Median ratio above UNSTABLE, or a first update above FIRST_STEP_UNSTABLE (see the module docstring)."""
    first = group.update_ratio[0] if group.update_ratio else None
    return (group.median_ratio is not None and group.median_ratio > UNSTABLE) or \
        (first is not None and first > FIRST_STEP_UNSTABLE)


def _norms(tensors: List[torch.Tensor]) -> List[float]:
    if not tensors:
        return []
    return torch.stack([n.float() for n in torch._foreach_norm(tensors)]).cpu().tolist()


class Tracker:
    """Records, per step, each group's gradient norm and update ratio, and each parameter's facts.

    Per parameter (by name) it keeps: ``had_grad`` (a gradient arrived at some step),
    ``nonzero_grad`` (one was not all zeros), ``moved`` (an update changed it).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.names: List[str] = []
        self.params: List[torch.nn.Parameter] = []
        self.groups: List[GroupTrace] = []
        self._members: List[List[int]] = []  # group → indices into self.params
        seen = set()
        for path, module in model.named_modules():
            own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
            if not own:
                continue
            idx = []
            for n, p in own:
                seen.add(id(p))
                idx.append(len(self.params))
                self.names.append(f"{path}.{n}" if path else n)
                self.params.append(p)
            self.groups.append(GroupTrace(module=path, class_name=type(module).__name__,
                                          params=[self.names[i] for i in idx],
                                          numel=sum(self.params[i].numel() for i in idx)))
            self._members.append(idx)
        self.had_grad = [False] * len(self.params)
        self.nonzero_grad = [False] * len(self.params)
        self.moved = [False] * len(self.params)
        self.total_grad_norms: List[Optional[float]] = []
        self._before: Optional[List[torch.Tensor]] = None

    # -- one step ------------------------------------------------------------------------------------
    def after_backward(self) -> Tuple[bool, List[str]]:
        """Record the gradients of this step: ``(all finite, names of non-finite ones)``."""
        with torch.no_grad():
            present = [i for i, p in enumerate(self.params) if p.grad is not None]
            norms = _norms([self.params[i].grad for i in present])
        by_param: Dict[int, float] = dict(zip(present, norms))
        for i, n in by_param.items():
            self.had_grad[i] = True
            if n != 0.0:
                self.nonzero_grad[i] = True
        for g, idx in zip(self.groups, self._members):
            got = [by_param[i] for i in idx if i in by_param]
            g.grad_norm.append(math.sqrt(sum(v * v for v in got)) if got else None)
        bad = [self.names[i] for i, n in by_param.items() if not math.isfinite(n)]
        self.total_grad_norms.append(math.sqrt(sum(v * v for v in norms)) if norms else None)
        return not bad, bad

    def before_update(self) -> None:
        with torch.no_grad():
            self._before = [p.detach().clone() for p in self.params]

    def after_update(self) -> List[str]:
        """Record this step's updates; the names of parameters that are no longer finite."""
        with torch.no_grad():
            deltas = torch._foreach_sub([p.detach() for p in self.params], self._before)
            delta_norms = _norms(deltas)
            weight_norms = _norms(self._before)
            after_norms = _norms([p.detach() for p in self.params])
        for i, d in enumerate(delta_norms):
            if d != 0.0:
                self.moved[i] = True
        for g, idx in zip(self.groups, self._members):
            d = math.sqrt(sum(delta_norms[i] ** 2 for i in idx))
            w = math.sqrt(sum(weight_norms[i] ** 2 for i in idx))
            g.update_ratio.append(d / w if w > 0 and math.isfinite(d) else None)
        self._before = None
        return [self.names[i] for i, n in enumerate(after_norms) if not math.isfinite(n)]

    # -- after the run -------------------------------------------------------------------------------
    def finish(self) -> None:
        """Each group's median ratio and whether it changed."""
        for g, idx in zip(self.groups, self._members):
            values = [r for r in g.update_ratio if r is not None and math.isfinite(r)]
            g.median_ratio = statistics.median(values) if values else None
            g.changed = any(self.moved[i] for i in idx)

    def members(self, group: GroupTrace) -> List[int]:
        return self._members[self.groups.index(group)]
