"""The spec's ``precision:`` section, checked: what precision-check runs when the command line says nothing.

.. code-block:: yaml

    precision:
      autocast: [bfloat16, float16]   # torch.autocast dtypes (default: bfloat16 on CPU, both on CUDA)
      cast: float16                   # also the whole model cast to it (default: none)
      grad_scaler: true               # float16 runs scale the loss as GradScaler does (default: false)
      tolerance_scale: 2.0            # multiply every error bar (default: 1)

Command-line options win over the section. A bad value is a :class:`~layerlab.errors.SpecError`
naming its ``file:line:col`` (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional

from layerlab.errors import SpecError, UsageError
from layerlab.mixed.dtypes import half_names

KEYS = ("autocast", "cast", "grad_scaler", "tolerance_scale")


@dataclass
class PrecisionSection:
    autocast: Optional[List[str]] = None
    cast: Optional[List[str]] = None
    grad_scaler: Optional[bool] = None
    tolerance_scale: Optional[float] = None


def _where(marks: Any, *path: str) -> Optional[str]:
    return marks(*path) if callable(marks) else None


def parse(section: Any, marks: Any = None) -> PrecisionSection:
    """``target.sections.get("precision")`` → :class:`PrecisionSection` (``None``: all defaults)."""
    if section is None:
        return PrecisionSection()
    if not isinstance(section, dict):
        raise SpecError("precision: is a mapping", where=_where(marks, "precision"),
                        expected="{autocast: [...], cast: ..., grad_scaler: ..., tolerance_scale: ...}",
                        got=type(section).__name__)
    unknown = [k for k in section if k not in KEYS]
    if unknown:
        from layerlab.spec.schema import did_you_mean

        raise SpecError(f"precision: has no key {unknown[0]!r}", where=_where(marks, "precision", unknown[0]),
                        expected=", ".join(KEYS), got=unknown[0], hint=did_you_mean(str(unknown[0]), KEYS))
    out = PrecisionSection()
    for key in ("autocast", "cast"):
        if key in section:
            value = section[key]
            values = [] if value is None else value if isinstance(value, list) else [value]
            try:
                setattr(out, key, half_names([str(v) for v in values], f"precision.{key}"))
            except UsageError as exc:
                raise SpecError(exc.message, where=_where(marks, "precision", key), expected=exc.expected,
                                got=exc.got, hint=exc.hint) from None
    if "grad_scaler" in section:
        if not isinstance(section["grad_scaler"], bool):
            raise SpecError("precision.grad_scaler is true or false", where=_where(marks, "precision", "grad_scaler"),
                            expected="true | false", got=section["grad_scaler"])
        out.grad_scaler = section["grad_scaler"]
    if "tolerance_scale" in section:
        scale = section["tolerance_scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise SpecError("precision.tolerance_scale is a number > 0", expected="a finite number > 0", got=scale,
                            where=_where(marks, "precision", "tolerance_scale"),
                            hint="2 doubles every error bar; the bars are multiples of the dtype's eps")
        out.tolerance_scale = float(scale)
    return out
