"""The gradient check of a stochastic layer in train mode, where its dropout is on.

Comparisons of a stochastic layer run in eval mode (:func:`~layerlab.checks.case.parity_mode`):
no reference repeats its random draws. But a custom ``autograd.Function`` that the layer calls only
when training (a hand-written dropout) is then never called, so a backward that drops dropout's
``1/(1−p)`` scale passes. Finite differences can see that bug if every forward draws the *same*
mask: the global RNG is re-seeded with one seed before each forward, as one would with
``torch.autograd.gradcheck`` (``torch.manual_seed(s)`` inside the function it differentiates).

That works only when the layer's randomness follows the global seed. So two forwards re-seeded
with the same seed are compared first, on the same float64 copy and inputs; if they are not
bitwise equal (a ``torch.Generator`` of the layer's own, state kept between calls), train mode is
"not judged" and the report says why. Otherwise :func:`layerlab.checks.numgrad.gradcheck` runs
again, in the layer's own modes with ``reseed``, and its verdict is the train-mode verdict.

The eval-mode verdict comes first: a failure there is reported as it is, and the train-mode run
(it costs as much as the eval one) happens only after an eval-mode pass. The user's global RNG is
left as it was (:func:`torch.random.fork_rng`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from layerlab.checks.case import Case, call, cast_args, float_leaves, module_copy, parity_mode, seed_for
from layerlab.checks.exact_dtype import exact_dtype
from layerlab.checks.report import CheckResult, Status

#: the per-check salt of the seed the train-mode forwards are re-seeded with
SALT = 19

#: why train mode matters, said with every train-mode verdict
HOW = ("train mode (dropout on; the global RNG re-seeded before every forward, so each one draws the same "
       "random mask)")


def reseeded(f: Callable, seed: Optional[int]) -> Callable:
    """``f`` with ``torch.manual_seed(seed)`` before every call (``seed`` ``None``: ``f`` itself).
    Keeps ``f.paths`` (the output paths :func:`~layerlab.checks.directional.functional` records)."""
    if seed is None:
        return f

    def g(*tensors):
        torch.manual_seed(seed)
        out = f(*tensors)
        g.paths = f.paths  # type: ignore[attr-defined]
        return out

    return g


def seed_drift(case: Case, seed: int) -> Optional[str]:
    """``None`` when two float64 train-mode forwards, each after ``torch.manual_seed(seed)``, are
    bitwise equal; otherwise where they differ (the randomness does not follow the global seed)."""
    dtype = exact_dtype(case).dtype  # float64, or float32 where a kernel refuses float64
    module = module_copy(case.module, dtype)
    args = cast_args(case.args, dtype)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        outs = []
        for _ in range(2):
            torch.manual_seed(seed)
            outs.append(float_leaves(call(module, args)))
    for (path, a), (_, b) in zip(*outs):
        # NaN ≠ NaN: compare where NaNs sit, then the rest (gradcheck reports NaN outputs itself)
        if a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()) or not torch.equal(a.nan_to_num(0.0),
                                                                                          b.nan_to_num(0.0)):
            diff = float((a - b).abs().nan_to_num(0.0).max()) if a.shape == b.shape else float("inf")
            return f"{path} differs by {diff:.3g}"
    if len(outs[0]) != len(outs[1]):
        return "the number of outputs differs"
    return None


def gradcheck(case: Case, opts: Optional[Any] = None) -> CheckResult:
    """The gradient check (:func:`layerlab.checks.numgrad.gradcheck`), and for a layer that is in
    train mode but checked in eval mode because it is stochastic, the same check in train mode."""
    from layerlab.checks import numgrad  # numgrad imports reseeded from here

    result = numgrad.gradcheck(case, opts)
    if parity_mode(case) is not False or result.status != Status.PASS:
        return result  # checked in its own mode already, or the eval-mode finding comes first
    seed = seed_for(case.seed, SALT)
    try:
        drift = seed_drift(case, seed)
        if drift is None:
            with torch.random.fork_rng(devices=[]):
                train = numgrad.gradcheck(case, opts, reseed=seed)
    except Exception as exc:  # said, not hidden: the eval-mode verdict stands, train mode was not judged
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _not_judged(result, f"the train-mode forward raised {type(exc).__name__}: {text}", seed)
    if drift is not None:
        return _not_judged(result, "the layer's randomness does not follow the global seed (two train-mode "
                           f"forwards after torch.manual_seed({seed}) differ: {drift})", seed)
    result.details["train_mode"] = {"status": train.status.value, "summary": train.summary, "seed": seed,
                                    "details": train.details}
    if train.status == Status.PASS:
        result.summary += f" in eval mode, and in {HOW}"
        return result
    if train.status == Status.SKIP:
        return _not_judged(result, train.summary, seed)
    train.summary = f"in {HOW}: {train.summary} (eval mode, where the dropout is off, passes)"
    train.hint = ((train.hint + "; ") if train.hint else "") + (
        "the train-mode path alone is wrong: a custom autograd.Function called only when training (e.g. a "
        "dropout whose backward drops the 1/(1−p) scale)")
    train.details["eval_mode"] = {"status": result.status.value, "summary": result.summary}
    train.details["train_mode"] = {"seed": seed, "reseeded": True}
    return train


def _not_judged(result: CheckResult, why: str, seed: int) -> CheckResult:
    result.summary += f" (in eval mode); train mode not judged: {why}"
    result.details["train_mode"] = {"status": "not judged", "reason": why, "seed": seed}
    return result
