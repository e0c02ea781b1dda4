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

A layer that draws random numbers in train mode by design (dropout, a ``stochastic`` tag, a
dropout reference) is probed in eval mode, where the comparisons run. One that none of these names
(a hand-written dropout whose rate is ``self.p``, noise added under ``if self.training``) is probed
in both modes: random in train mode but repeatable in eval mode is randomness gated on
``self.training``, i.e. a stochastic layer, not a bug. Its failed comparisons are then run again
treating it as stochastic (in eval mode, and forward parity by expectation,
:mod:`layerlab.checks.expectation`), and those verdicts stand, saying why they were re-run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from layerlab.checks.case import Case, call, cast_args, float_leaves, is_stochastic, module_copy
from layerlab.checks.exact_dtype import exact_dtype
from layerlab.checks.report import CheckResult, Status

#: checks whose verdict does not rest on comparing two forwards
_NOT_COMPARING = ("runs", "param_grads", "determinism", "recurrent_state")


@dataclass
class Variation:
    """Two identical calls differ: where, by how much, and in which mode (``eval_repeatable``: in
    train mode, whether two eval-mode calls agree; ``None`` when eval mode was not probed)."""

    output: str
    max_abs_diff: float
    mode: str
    eval_repeatable: Optional[bool] = None


def _variation(case: Case, train: Optional[bool]) -> Optional[Variation]:
    """How two float64 forwards in ``train`` (``None``: each submodule's own flag) differ."""
    exact = exact_dtype(case)  # float64, or float32 where a kernel refuses float64
    module = module_copy(case.module, exact.dtype, train)
    args = cast_args(case.args, exact.dtype)
    mode = "train" if (case.module.training if train is None else train) else "eval"
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        first = float_leaves(call(module, args))
        second = float_leaves(call(module, args))
    for (path, a), (_, b) in zip(first, second):
        if a.shape != b.shape:
            return Variation(path, float("inf"), mode)
        if not a.numel():
            continue
        diff = float((a - b).abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
        scale = 1.0 + float(a.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
        if (exact.exceeds(diff, scale) if exact.fallback else diff > 1e-12 * scale):
            return Variation(path, diff, mode)
    return None


def forward_variation(case: Case) -> Optional[Variation]:
    """How two float64 forwards on the same input differ (``None``: they agree to 1e-12 relative).

    A train-mode variation is followed by an eval-mode probe: when eval mode varies too, that
    variation is returned (the randomness is not gated on the mode); otherwise the train-mode one,
    marked ``eval_repeatable``."""
    train = case.module.training and not is_stochastic(case.module, case.tags, case.reference)
    found = _variation(case, None if train else False)  # None: each submodule's own flag
    if found is None or not train:
        return found
    in_eval = _variation(case, False)
    if in_eval is not None:
        return in_eval
    found.eval_repeatable = True
    return found


def stochastic_by_design(variation: Optional[Variation]) -> bool:
    """Random in train mode, repeatable in eval mode: randomness gated on ``self.training``."""
    return variation is not None and variation.mode == "train" and bool(variation.eval_repeatable)


def reexplain(case: Case, results: List[CheckResult],
              rerun: Optional[Callable[[Case, str], CheckResult]] = None) -> List[CheckResult]:
    """``results`` with the failures of comparing checks re-explained when the forward is not repeatable.

    ``rerun(case, name)`` runs one check again: given, a layer that is random in train mode but
    repeatable in eval mode has its failed comparisons re-run as a stochastic layer."""
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
    if stochastic_by_design(variation):
        seen += ", while two eval-mode calls agree"
        if rerun is not None:
            return _rerun_as_stochastic(case, results, failing, variation, seen, rerun)
        cause = ("the randomness is gated on self.training (eval mode is repeatable), but layerlab did not "
                 "recognise the layer as stochastic: tag it stochastic (comparisons then run in eval mode, "
                 "train mode by expectation)")
    elif variation.mode == "eval":
        cause = ("randomness in the forward: torch.rand*/randn*/bernoulli not gated on self.training, or state "
                 "kept between calls")
    else:  # not reached by forward_variation today; said plainly rather than guessed
        cause = "randomness in the train-mode forward that layerlab could not place"
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


def _rerun_as_stochastic(case: Case, results: List[CheckResult], failing: List[CheckResult], variation: Variation,
                         seen: str, rerun: Callable[[Case, str], CheckResult]) -> List[CheckResult]:
    """The failed comparisons run again on ``case`` tagged ``stochastic``; their verdicts replace the
    train-mode ones (eval mode is repeatable, so what fails now is not randomness) and say why."""
    tagged = dataclasses.replace(case, tags=frozenset(case.tags) | {"stochastic"})
    why = f"treated as stochastic: {seen}"
    again = {}
    for r in failing:
        redone = rerun(tagged, r.name)
        redone.summary = f"{redone.summary} ({why})"
        redone.details["stochastic_by_probe"] = {"output": variation.output, "max_abs_diff": variation.max_abs_diff}
        redone.seconds += r.seconds
        again[r.name] = redone
    return [again.get(r.name, r) if r in failing else r for r in results]
