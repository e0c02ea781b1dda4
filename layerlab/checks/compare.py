"""An ``assert_close``-style comparison that returns its numbers instead of raising.

``torch.testing.assert_close`` explains a failure with the mismatched elements (count and %), the
greatest absolute difference and where, and the greatest relative difference and where, next to
the tolerances it allowed. :func:`compare` measures exactly those and returns them as a
:class:`Comparison`, so a parity report can print them for every output and every gradient.

Tolerances default to ``assert_close``'s per dtype (:data:`TOLERANCES`): an element passes when
``|actual − expected| ≤ atol + rtol·|expected|``; NaN never equals anything (``equal_nan=False``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

#: ``torch.testing.assert_close`` defaults: dtype → (rtol, atol)
TOLERANCES: Dict[torch.dtype, Tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def tolerances(dtype: torch.dtype) -> Tuple[float, float]:
    """``(rtol, atol)`` that ``assert_close`` uses for ``dtype`` (exact for integers and bools)."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass
class Comparison:
    """One tensor compared with its expected value.

    Attributes:
        what: what was compared (``output[0]``, ``grad weight_ih_l0``).
        ok: every element within tolerance (and the shapes equal).
        shape: the actual shape; ``expected_shape`` the expected one.
        dtype: the dtype compared in.
        rtol, atol: the tolerances used.
        total, mismatched, mismatched_pct: how many elements differ beyond tolerance.
        max_abs_diff, max_abs_index: the greatest |actual − expected| and where.
        max_rel_diff, max_rel_index: the greatest |actual − expected| / |expected| and where.
        actual_at_max, expected_at_max: the two values at ``max_abs_index``.
        note: why the numbers are missing or special (shape mismatch, NaN, no gradient).
    """

    what: str
    ok: bool
    shape: List[int]
    expected_shape: List[int]
    dtype: str
    rtol: float
    atol: float
    total: int = 0
    mismatched: int = 0
    mismatched_pct: float = 0.0
    max_abs_diff: float = 0.0
    max_abs_index: Optional[List[int]] = None
    max_rel_diff: float = 0.0
    max_rel_index: Optional[List[int]] = None
    actual_at_max: Optional[float] = None
    expected_at_max: Optional[float] = None
    note: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line: ``7/24 elements (29.2%) differ; greatest abs diff 0.41 at [1, 3] (allowed 1e-07 + 1e-07·|expected|)``."""
        if self.note and self.total == 0:
            return self.note
        head = f"{self.mismatched}/{self.total} elements ({self.mismatched_pct:.1f}%) differ"
        if self.ok:
            head = f"all {self.total} elements within tolerance"
        return (f"{head}; greatest abs diff {self.max_abs_diff:.3g} at {_idx(self.max_abs_index)}, "
                f"greatest rel diff {self.max_rel_diff:.3g} at {_idx(self.max_rel_index)} "
                f"(allowed {self.atol:g} + {self.rtol:g}·|expected|)")


def _idx(index: Optional[List[int]]) -> str:
    return "—" if index is None else "[" + ", ".join(map(str, index)) + "]"


def _unravel(flat: int, shape: torch.Size) -> List[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return list(reversed(out))


def compare(actual: Optional[Tensor], expected: Optional[Tensor], what: str, *,
            rtol: Optional[float] = None, atol: Optional[float] = None,
            dtype: Optional[torch.dtype] = None) -> Comparison:
    """Compare ``actual`` with ``expected`` the way ``assert_close`` does; never raises.

    ``None`` stands for "no gradient" and compares as zeros of the other's shape (and says so).
    The default tolerances are those of the less precise of the two dtypes (or ``dtype``).
    """
    note = None
    if actual is None and expected is None:
        return Comparison(what, True, [], [], "none", 0.0, 0.0, note="neither has a value")
    if actual is None:
        note = "ours has no gradient (None); the reference has one"
        actual = torch.zeros_like(expected)
    elif expected is None:
        note = "the reference has no gradient (None); ours has one"
        expected = torch.zeros_like(actual)
    actual, expected = actual.detach(), expected.detach()
    if dtype is None:
        dtype = actual.dtype if _precision(actual.dtype) <= _precision(expected.dtype) else expected.dtype
    d_rtol, d_atol = tolerances(dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    base = Comparison(what, False, list(actual.shape), list(expected.shape), str(dtype).replace("torch.", ""),
                      rtol, atol, note=note)
    if actual.shape != expected.shape:
        base.note = f"shape {tuple(actual.shape)} ≠ expected {tuple(expected.shape)}"
        return base
    n = actual.numel()
    base.total = n
    if n == 0:
        base.ok = True
        return base
    a, e = actual.to(torch.float64), expected.to(torch.float64)
    diff = (a - e).abs()
    both_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    diff = torch.where(both_inf, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    allowed = atol + rtol * e.abs()
    allowed = torch.where(torch.isnan(allowed), torch.zeros_like(allowed), allowed)
    bad = diff > allowed
    rel = diff / e.abs()
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    rel = torch.where(torch.isnan(rel), torch.full_like(rel, float("inf")), rel)
    i_abs = int(torch.argmax(diff.reshape(-1)))
    i_rel = int(torch.argmax(rel.reshape(-1)))
    base.mismatched = int(bad.sum())
    base.mismatched_pct = round(100.0 * base.mismatched / n, 3)
    base.max_abs_diff = float(diff.reshape(-1)[i_abs])
    base.max_abs_index = _unravel(i_abs, actual.shape)
    base.max_rel_diff = float(rel.reshape(-1)[i_rel])
    base.max_rel_index = _unravel(i_rel, actual.shape)
    base.actual_at_max = float(a.reshape(-1)[i_abs])
    base.expected_at_max = float(e.reshape(-1)[i_abs])
    base.ok = base.mismatched == 0
    if not base.ok and (torch.isnan(a).any() or torch.isnan(e).any()):
        nan_a, nan_e = int(torch.isnan(a).sum()), int(torch.isnan(e).sum())
        extra = f"NaN: {nan_a} in ours, {nan_e} in the expected"
        base.note = f"{base.note}; {extra}" if base.note else extra
    return base


def _precision(dtype: torch.dtype) -> int:
    order = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.float64: 3}
    return order.get(dtype, 4)
