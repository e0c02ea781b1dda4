"""Train-mode parity for layers that draw random numbers: compare averages, not draws.

A layer with dropout draws different masks than its reference, so forward parity runs both in eval
mode (:func:`layerlab.checks.case.parity_mode`), where a dropout missing its ``1/(1−p)`` scale is
the identity and looks perfect. What the train-mode forward must still get right is its
*expectation*: inverted dropout keeps ``E[out] = x``. So both are run K times in train mode on one
input (float64, no grad) and the per-element means compared with a z-test:

    z = |mean_ours − mean_ref| / √((var_ours + var_ref) / K)

A correct layer gives |z| of a few units at most (normal tails: max over 10⁴ elements ≈ 4.5); a
mismatch is reported where |z| > 8 on at least 5 % of the elements, so a false alarm needs an
≥ 8σ event many times over. A small rate (p = 0.1: means off by 10 %) is too faint per element, so
the draws are also *pooled*: each draw projected on the reference's eval-mode output ``w`` (fixed
before any draw, so the projection is unbiased), and the two mean projections compared by the same
z-test; the variance comes from the projected draws themselves, so correlated outputs (dropout
before a Linear) cannot inflate it. K adapts to the forward's cost (at most about a second) and below 32
draws nothing is claimed. The pattern found is named: a mean ratio ours/reference of ``1 − p`` for
the layer's dropout rate ``p`` is dropout without the ``1/(1−p)`` scale.

Legend: K draws · p dropout rate · z standardised mean difference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import Tensor, nn

from layerlab.checks.case import Case, call, cast_args, float_leaves, module_copy, reference_copy

#: at least this many draws, or no claim is made
MIN_DRAWS = 32
MAX_DRAWS = 400
BUDGET_S = 1.0
Z_LIMIT = 8.0
SHARE_LIMIT = 0.05


@dataclass
class MeanMismatch:
    """The train-mode means differ: on which output, how often, and the ratio of the means."""

    output: str
    draws: int
    share: float        # share of the elements with |z| > Z_LIMIT
    max_z: float
    ratio: float        # least-squares ratio mean_ours / mean_ref
    dropout_rate: Optional[float]  # the layer's rate p when ratio ≈ 1 − p
    pooled_z: float = 0.0  # z of the mean projections on the reference's eval output

    def describe(self) -> str:
        return (f"train-mode outputs differ from the reference's on average over {self.draws} draws: {self.output}: "
                f"{self.share:.0%} of the elements off by more than {Z_LIMIT:g} standard errors (max z "
                f"{self.max_z:.3g}; pooled over the elements z = {self.pooled_z:.3g}); mean ratio ours/reference = "
                f"{self.ratio:.4g}")

    def hint(self) -> str:
        if self.dropout_rate is not None:
            return (f"the ratio is 1 − p with p = {self.dropout_rate:g}: dropout without the 1/(1−p) scale; "
                    f"inverted dropout keeps E[out] = x: out = x * mask / (1 - p)")
        return ("the random train-mode forward has a different expectation than the reference's: check the "
                "scaling of the dropout-like part (1/(1−p)) and what is drawn")


def _rates(module: nn.Module) -> List[float]:
    """Dropout rates found on the layer: torch's dropout modules and float attributes named *drop* or ``p``."""
    rates = []
    for m in module.modules():
        for name, v in vars(m).items():
            if isinstance(v, float) and 0 < v < 1 and ("drop" in name or name == "p"):
                rates.append(v)
    return rates


def _draw(module: nn.Module, args, k: int) -> Optional[Tensor]:
    leaves = []
    with torch.no_grad():
        for _ in range(k):
            out = float_leaves(call(module, args))
            if not out:
                return None
            leaves.append(out[0][1].reshape(-1))
    return torch.stack(leaves)


def train_mean_mismatch(case: Case) -> Optional[MeanMismatch]:
    """Compare the train-mode means of the layer and its reference (``None``: they agree, or too few draws)."""
    ours = module_copy(case.module, torch.float64, True)
    ref = reference_copy(case.reference, torch.float64, True)
    args = cast_args(case.args, torch.float64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        t0 = time.perf_counter()
        with torch.no_grad():
            first = float_leaves(call(ours, args))
            call(ref, args)
        one = time.perf_counter() - t0
        if not first or first[0][1].numel() == 0:
            return None
        k = int(min(MAX_DRAWS, BUDGET_S / max(one, 1e-6)))
        if k < MIN_DRAWS:
            return None
        a, b = _draw(ours, args, k), _draw(ref, args, k)
        with torch.no_grad():
            w = float_leaves(call(reference_copy(case.reference, torch.float64, False), args))
    if a is None or b is None or a.shape != b.shape:
        return None
    ma, mb = a.mean(0), b.mean(0)
    se = ((a.var(0) + b.var(0)) / k).sqrt()
    scale = float(mb.abs().max()) or 1.0
    diff = (ma - mb).abs()
    z = torch.where(se > 0, diff / se.clamp_min(1e-300), torch.where(diff > 1e-9 * scale, float("inf"), 0.0))
    off = (z > Z_LIMIT) & (diff > 1e-9 * scale)
    share = float(off.double().mean())
    pooled = _pooled_z(a, b, w[0][1].reshape(-1) if w and w[0][1].numel() == a.shape[1] else None)
    if share < SHARE_LIMIT and abs(pooled) <= Z_LIMIT:
        return None
    ratio = float((ma * mb).sum() / (mb * mb).sum().clamp_min(1e-300))
    slack = max(0.05 * ratio, 4 * _ratio_se(a, b, ratio))  # a large p leaves few kept draws: a noisy ratio
    rate = min((p for p in _rates(case.module) if abs(ratio - (1 - p)) < max(0.05 * (1 - p), slack)),
               key=lambda p: abs(ratio - (1 - p)), default=None)
    max_z = float(z[off].max()) if bool(off.any()) else float(z.nan_to_num(posinf=0.0).max())
    return MeanMismatch(first[0][0], k, share, max_z, ratio, rate, pooled)


def _ratio_se(a: Tensor, b: Tensor, ratio: float) -> float:
    """Standard error of the ratio of the means, from the draws' totals (delta method)."""
    sa, sb = a.sum(1), b.sum(1)
    k = a.shape[0]
    ma, mb = float(sa.mean()), float(sb.mean())
    if ma == 0 or mb == 0:
        return float("inf")
    return abs(ratio) * (float(sa.var()) / (k * ma * ma) + float(sb.var()) / (k * mb * mb)) ** 0.5


def _pooled_z(a: Tensor, b: Tensor, w: Optional[Tensor]) -> float:
    """z of ``mean(a @ w) − mean(b @ w)`` over the K draws (0: no direction to project on)."""
    if w is None or not bool(torch.isfinite(w).all()) or float(w.abs().max()) == 0:
        return 0.0
    pa, pb = a @ w, b @ w
    k = a.shape[0]
    diff = float(pa.mean() - pb.mean())
    se = float(((pa.var() + pb.var()) / k).sqrt())
    scale = float(pb.abs().mean()) or 1.0
    if se > 0:
        return diff / se
    return 0.0 if abs(diff) <= 1e-9 * scale else float("inf")
