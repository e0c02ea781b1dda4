"""How two numbers from two reports are compared: the tolerance, and the size of a change.

Reports store non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (see
:mod:`layerlab.serialize`); they are read back as floats here. Two NaNs are equal (the same
finding in both runs); NaN against a number is a change of infinite size.

Defaults: ``rtol = 1e-4``, ``atol = 1e-6``. Re-running the same float32 model with another thread
count or torch build moves statistics and norms by about 1e-7 relative (reduction order); a change
to a layer's code or weights moves them by far more than 1e-4. Use ``--rtol 0 --atol 0`` to see
every bit that changed.
"""

from __future__ import annotations

import math
from typing import Any, Optional

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def as_number(value: Any) -> Optional[float]:
    """A report's number as a float (``"nan"``/``"inf"`` strings too); ``None`` for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    return None


def differ(a: float, b: float, rtol: float, atol: float) -> bool:
    """``|a − b| > atol + rtol · max(|a|, |b|)`` (symmetric, so diff(A, B) and diff(B, A) agree);
    NaN equals only NaN, an infinity only the same infinity."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a != b
    return abs(a - b) > atol + rtol * max(abs(a), abs(b))


def score(a: float, b: float, atol: float, scale: float = 0.0) -> float:
    """The size of a change, for ranking: ``ln(1 + |a − b| / (max(min(|a|, |b|), scale) + atol))``.

    ``scale`` is the magnitude a change should be judged against when the value itself can be near
    0 by nature (a mean next to its std). ∞ when one side is not finite.
    """
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    floor = max(min(abs(a), abs(b)), scale) + max(atol, 1e-300)
    return math.log1p(abs(a - b) / floor)
