"""Mixed precision — ``layerlab precision-check``: a model's forward + backward in half precision, module by module
against float32 — the first module that loses precision, why, and the fix.

Not to be confused with :mod:`layerlab.checks.precision`, which finds float32 islands inside
gradcheck's float64 runs. Entry points: :func:`~layerlab.mixed.check.precision_check`
(Python, ``layerlab.precision_check``) and :func:`~layerlab.mixed.check.check_target` (the CLI's).
The package is not called ``precision_check`` so that importing it can never shadow that
function on ``layerlab``.
"""

from layerlab.mixed.check import check_target, precision_check

__all__ = ["precision_check", "check_target"]
