"""Is the forward repeatable? The question behind every comparison, asked when one fails.

Almost every check compares two forwards: the layer with its reference, with itself on one sample,
on a non-contiguous copy, compiled, or nudged by ``eps`` for a numerical gradient. If two calls on
the *same* input already differ (``torch.randn`` in the forward, dropout not gated on
``self.training``, state kept between calls), every such comparison fails, and each check would
blame its own suspect ("the backward is wrong", "the samples mix", "raw memory read as
contiguous") for what is one bug. So when a comparing check fails, the forward is run twice more
(float64, the mode the checks ran in, the RNG left to advance between the calls as it does in
use) and, if the two differ, the failures are re-explained:

* the ``determinism`` check (``--deep``) carries the verdict when it ran and failed; otherwise the
  first failing comparison stays a failure with the randomness as its summary;
* the other failures become warnings that point to it: their numbers follow from the randomness
  and say nothing about what they test.

A layer that draws random numbers in train mode by design (dropout, a ``stochastic`` tag) is
probed in eval mode, where the comparisons run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from layerlab.checks.case import Case, call, cast_args, float_leaves, is_stochastic, module_copy
from layerlab.checks.report import CheckResult, Status

#: checks whose verdict does not rest on comparing two forwards
_NOT_COMPARING = ("runs", "param_grads", "determinism", "recurrent_state")


@dataclass
class Variation:
    """Two identical calls differ: where, by how much, and in which mode."""

    output: str
    max_abs_diff: float
    mode: str


def forward_variation(case: Case) -> Optional[Variation]:
    """How two float64 forwards on the same input differ (``None``: they agree to 1e-12 relative)."""
    train = case.module.training and not is_stochastic(case.module, case.tags)
    module = module_copy(case.module, torch.float64, None if train else False)  # None: each submodule's own flag
    args = cast_args(case.args, torch.float64)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        first = float_leaves(call(module, args))
        second = float_leaves(call(module, args))
    for (path, a), (_, b) in zip(first, second):
        if a.shape != b.shape:
            return Variation(path, float("inf"), "train" if train else "eval")
        if not a.numel():
            continue
        diff = float((a - b).abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
        if diff > 1e-12 * (1.0 + float(a.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())):
            return Variation(path, diff, "train" if train else "eval")
    return None


def reexplain(case: Case, results: List[CheckResult]) -> List[CheckResult]:
    """``results`` with the failures of comparing checks re-explained when the forward is not repeatable."""
    failing = [r for r in results if r.status == Status.FAIL and r.name not in _NOT_COMPARING
               and not r.details.get("exception")]
    if not failing:
        return results
    try:
        variation = forward_variation(case)
    except Exception:  # the probe is a second opinion: when it cannot run, the verdicts stand as they are
        return results
    if variation is None:
        return results
    seen = (f"two identical {variation.mode}-mode calls on the same input differ "
            f"({variation.output} by {variation.max_abs_diff:.3g})")
    cause = ("randomness in the forward: torch.rand*/randn*/bernoulli not gated on self.training, or state kept "
             "between calls" if variation.mode == "eval" else
             "randomness in the train-mode forward that layerlab does not recognise as dropout: gate it on "
             "self.training, or tag the layer stochastic (comparisons then run in eval mode)")
    determinism = next((r for r in results if r.name == "determinism" and r.status == Status.FAIL), None)
    carrier = determinism.name if determinism else failing[0].name
    for r in failing:
        r.details["not_repeatable"] = {"output": variation.output, "max_abs_diff": variation.max_abs_diff,
                                       "mode": variation.mode}
        if r.name == carrier:
            r.summary = f"the forward is not repeatable: {seen}, so this comparison fails whatever else is true"
            r.hint = f"{cause}; the other failing comparisons follow from it"
            r.where = variation.output
            continue
        r.status = Status.WARN
        r.summary = f"not a verdict: the forward is not repeatable (see {carrier}); {r.summary}"
        r.hint = f"re-run once the forward is repeatable: {seen}"
    return results
