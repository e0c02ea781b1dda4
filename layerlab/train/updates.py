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

Norms are taken with ``torch._foreach_norm`` (one kernel per list, not one per parameter), and only a
norm that may have under- or overflowed is taken again, scaled (:func:`layerlab.probe.safe_norm.host_norms`).
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Tuple

import torch

from layerlab.errors import Problem
from layerlab.probe.safe_norm import host_norms
from layerlab.train.report import GroupTrace

__all__ = ["NOT_LEARNING", "UNSTABLE", "FIRST_STEP_UNSTABLE", "Tracker", "unstable", "ratio_findings"]

NOT_LEARNING = 1e-5
UNSTABLE = 0.3
FIRST_STEP_UNSTABLE = 3.0


def unstable(group: GroupTrace) -> bool:
    """Median ratio above UNSTABLE, or a first update above FIRST_STEP_UNSTABLE (see the module docstring)."""
    first = group.update_ratio[0] if group.update_ratio else None
    return (group.median_ratio is not None and group.median_ratio > UNSTABLE) or \
        (first is not None and first > FIRST_STEP_UNSTABLE)


def stored_values(t: torch.Tensor) -> torch.Tensor:
    """A sparse gradient's stored values (nn.Embedding(sparse=True): no norm kernel takes it), with the
    same norm and the same zeros; a dense tensor as it is."""
    return t.coalesce().values() if t.is_sparse else t


def _norms(tensors: List[torch.Tensor]) -> List[float]:
    """Norms without underflow or overflow (a gradient of 1e-24 is not 0; see :mod:`layerlab.probe.safe_norm`)."""
    return host_norms([stored_values(t) for t in tensors])


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

    @property
    def ids(self) -> Dict[int, str]:
        """Each parameter's name by ``id()`` (an optimizer holds the tensors, not their names)."""
        return {id(p): n for n, p in zip(self.names, self.params)}

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

    def mark(self, found: List[Problem]) -> None:
        """A group still ``ok`` that holds a parameter a finding names takes that finding's code as status."""
        for problem in found:
            names = set(problem.data.get("params", []))
            for g in self.groups:
                if names & set(g.params) and g.status == "ok":
                    g.status = problem.code

    def members(self, group: GroupTrace) -> List[int]:
        return self._members[self.groups.index(group)]


def ratio_findings(groups: List[GroupTrace], fit: str, stopped: bool,
                   default_lr: Optional[float] = None) -> List[Problem]:
    """``unstable`` (median ratio > UNSTABLE) and ``not-learning`` (< NOT_LEARNING, unless it overfits anyway).

    A first update far larger than the initial weights with healthy later ratios is what a too-high
    Adam lr does (the weights blow up, later ratios look tame) — and also what any Adam step of a
    sane size does to weights initialised very small (GPT-2 with ``initializer_range=0.002``: the
    first step is lr per element, 5× the weights). The loss tells them apart: the first never
    overfits the batch, the second does; then it is ``large-first-step``, a warning.

    Adam's first steps move each weight by ≈ lr, so the ratio is ≈ lr / rms(w): 0.5 for this
    check's default 1e-2 on a Hugging Face std-0.02 init, a median above UNSTABLE in a run of a few
    steps. When the lr is the check's default (``default_lr``, not the user's) and the loss fell
    (``fit``: overfits, falls, slow), too-large steps are said as a warning about that default;
    with the user's lr, or a loss that did not fall, they fail the check."""
    overfits = fit == "overfits"
    too_big = [g for g in groups if g.status == "ok" and unstable(g)]
    first_only = [g for g in too_big if g.median_ratio is not None and g.median_ratio <= UNSTABLE]
    measured = [g for g in groups if g.update_ratio and g.update_ratio[0] is not None]
    # a first step that rewrites most of the model's layers several times over is the lr's doing (Adam at
    # lr 1.0 on a default init: ×7, then "tame" ratios against weights grown 40×, while a classifier still
    # drives its loss to 0 with huge logits) — excused only for this check's own default lr when the loss
    # overfits; a few groups initialised tiny on purpose (ConvNeXt's layer scale at 1e-6: ×1000 at any
    # Adam lr, 1e-3 included) take any step as a large first step, whatever the lr and the loss did
    most = 2 * len(first_only) >= len(measured)
    large_first = first_only if (overfits and default_lr is not None) or not most else []
    too_big = [g for g in too_big if g not in large_first]
    slow = [g for g in groups if g.status == "ok" and g.median_ratio is not None
            and g.median_ratio < NOT_LEARNING and not overfits and not stopped]
    out = []
    for g in large_first:
        g.status = "large-first-step"
    if large_first:
        worst = max(large_first, key=lambda g: g.update_ratio[0] or 0)
        out.append(Problem("large-first-step", f"{len(large_first)} parameter group(s) moved by more than "
                           f"{FIRST_STEP_UNSTABLE:g}× their initial weights on the first step (up to "
                           f"{worst.update_ratio[0]:.3g}× at {worst.label}), then by a healthy median "
                           f"{worst.median_ratio:.3g} per step, " + ("and the loss still overfits" if overfits else
                           f"in {len(large_first)} of {len(measured)} groups") + ": weights initialised much smaller "
                           "than the lr's step size (a layer scale, a near-zero init), not an lr too high for the "
                           "model", where=worst.label, severity="warning",
                           hint="fine for this check; a training run on weights this small usually wants a "
                                "smaller lr or a warm-up",
                           data={"modules": [g.label for g in large_first],
                                 "first_ratios": [g.update_ratio[0] for g in large_first]}))
    for g in too_big:
        g.status = "unstable"
    for g in slow:
        g.status = "not-learning"
    if too_big and default_lr is not None and fit in ("overfits", "falls", "slow"):
        worst = max(too_big, key=lambda g: g.update_ratio[0] or g.median_ratio or 0)
        first, median = (f"{v:.3g}" if v is not None else "—" for v in (worst.update_ratio[0], worst.median_ratio))
        for g in too_big:
            g.status = "large-steps"
        out.append(Problem("large-steps", f"{len(too_big)} parameter group(s) change by a large share of their "
                           f"weights per step with this check's default lr {default_lr:g} (update/weight ratio "
                           f"{first} on the first step, median {median}, at {worst.label}; healthy ≈ 1e-3 … 1e-2), "
                           "and the loss still falls: weights initialised small for this lr, not a failure of "
                           "this check",
                           where=worst.label, severity="warning",
                           hint=f"for a training run, an lr 10–100× below {default_lr:g}; give --lr to check yours",
                           data={"modules": [g.label for g in too_big],
                                 "ratios": [g.median_ratio for g in too_big]}))
        too_big = []
    if too_big:
        worst = max(too_big, key=lambda g: g.update_ratio[0] or g.median_ratio or 0)
        first, median = (f"{v:.3g}" if v is not None else "—" for v in (worst.update_ratio[0], worst.median_ratio))
        blown = worst.median_ratio is not None and worst.median_ratio <= UNSTABLE
        out.append(Problem("unstable", f"{len(too_big)} parameter group(s) change too much per step (update/weight "
                           f"ratio {first} on the first step, median {median}, at "
                           f"{worst.label}; healthy ≈ 1e-3 … 1e-2): the learning rate is far too high" +
                           (" — the first step rewrote the weights several times over, and the later ratios look "
                            "tame only against the weights it grew" if blown else "") +
                           ("; the loss still fell, which a step this size proves nothing about" if fit == "overfits"
                            else ""),
                           where=worst.label,
                           severity="error", hint="lower --lr by 10–100×; a healthy ratio is about 1e-3 … 1e-2",
                           data={"modules": [g.label for g in too_big],
                                 "ratios": [g.median_ratio for g in too_big]}))
    if slow:
        worst = min(slow, key=lambda g: g.median_ratio)
        out.append(Problem("not-learning", f"{len(slow)} parameter group(s) change by less than {NOT_LEARNING:g} of "
                           f"their weights per step (median update/weight ratio down to {worst.median_ratio:.3g}, "
                           f"at {worst.label}): too small to learn in {len(worst.update_ratio)} steps",
                           where=worst.label, severity="error", hint="raise --lr; check the gradients reach it",
                           data={"modules": [g.label for g in slow], "ratios": [g.median_ratio for g in slow]}))
    return out
