"""Formula checks: explain-shape's arithmetic, fed a module's own arguments and its real input.

:func:`shape_op` maps a module to ``(op, params)`` for :func:`layerlab.shapes.explain`:

* torch.nn's conv, transposed conv, pool, LP-pool, adaptive pool, Unfold/Fold, Upsample,
  PixelShuffle/Unshuffle and Flatten, with the parameters read from the module's attributes
  (the names are the same as explain-shape's, torch's argument names);
* any module that defines ``layerlab_shape_op(self) -> (op, params)`` — layerlab's own layers do,
  and a user's layer can too.

:func:`check_call` then compares the predicted output shape with the shape that came out.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn

from layerlab.errors import LayerlabError
from layerlab.probe.report import CallRecord, FormulaCheck

# Most specific first: torch.nn base classes → explain-shape op (a family name takes 1d/2d/3d
# from the input's number of spatial dims, or the class's own suffix).
_TORCH_OPS: List[Tuple[type, str]] = [
    (nn.modules.conv._ConvTransposeNd, "conv_transpose"),
    (nn.modules.conv._ConvNd, "conv"),
    (nn.modules.pooling._MaxPoolNd, "max_pool"),
    (nn.modules.pooling._AvgPoolNd, "avg_pool"),
    (nn.modules.pooling._LPPoolNd, "lp_pool"),
    (nn.modules.pooling._AdaptiveAvgPoolNd, "adaptive_avg_pool"),
    (nn.modules.pooling._AdaptiveMaxPoolNd, "adaptive_max_pool"),
    (nn.Unfold, "unfold"),
    (nn.Fold, "fold"),
    (nn.Upsample, "upsample"),
    (nn.PixelShuffle, "pixel_shuffle"),
    (nn.PixelUnshuffle, "pixel_unshuffle"),
    (nn.Flatten, "flatten"),
]


def _class_nd(module: nn.Module) -> Optional[int]:
    name = type(module).__name__
    for nd in (1, 2, 3):
        if name.endswith(f"{nd}d"):
            return nd
    return None


def shape_op(module: nn.Module) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``(op, params)`` explain-shape needs to predict ``module``'s output size, or ``None``."""
    own = getattr(module, "layerlab_shape_op", None)
    if callable(own):
        op, params = own()
        return op, dict(params)
    for cls, family in _TORCH_OPS:
        if isinstance(module, cls):
            break
    else:
        return None
    from layerlab.shapes.ops import FAMILIES, resolve

    op = family
    nd = _class_nd(module)
    if family in FAMILIES and nd is not None:
        op = FAMILIES[family].format(nd=nd)
    spec = resolve(op, n_spatial=nd)
    params = {k: getattr(module, k) for k in spec.defaults if hasattr(module, k)}
    if isinstance(module, nn.modules.conv._ConvNd) and "in_channels" in spec.defaults:
        params.setdefault("in_channels", module.in_channels)
    return op, params


def _forward_extras(record: CallRecord, op: str) -> Dict[str, Any]:
    """Forward arguments that change the size: ``output_size`` of a transposed conv."""
    if not op.startswith("conv_transpose"):
        return {}
    for info in record.inputs:
        if info.name in ("output_size", "args[1]") and info.value is not None:
            return {"output_size": info.value}
    return {}


def check_call(record: CallRecord, module: nn.Module) -> Optional[FormulaCheck]:
    """The formula check of one finished call, or ``None`` when no formula covers the module."""
    found = shape_op(module)
    if found is None or not record.inputs or record.inputs[0].shape is None:
        return None
    op, params = found
    params.update(_forward_extras(record, op))
    in_shape = list(record.inputs[0].shape)
    actual = next((list(o.shape) for o in record.outputs if o.shape is not None), None)
    check = FormulaCheck(
        call=record.index, path=record.path, op=op, formula_call=op, input_shape=in_shape,
        predicted=None, actual=actual,
    )
    from layerlab.shapes import explain

    try:
        ex = explain(op, in_shape, **params)
    except (LayerlabError, ModuleNotFoundError) as exc:
        check.note = f"explain-shape cannot check {op}: {getattr(exc, 'message', exc)}"
        return check
    check.formula_call = ex.call
    check.steps = [f"{s.dim}: {s.substituted} = {s.output}" for s in ex.steps]
    if ex.error is not None:
        check.passed = record.status != "ok"
        check.note = f"the arithmetic says torch raises: {ex.error.message}"
        return check
    check.predicted = list(ex.output_shape)
    if record.status != "ok":
        check.note = "the call raised before returning an output"
        return check
    check.passed = check.predicted == actual
    if not check.passed:
        check.note = f"predicted {check.predicted}, the layer returned {actual}"
    return check


def explain_failure(module: nn.Module, input_shape: List[int]):
    """explain-shape's error for a call that raised, when the arithmetic predicts it (else None)."""
    found = shape_op(module)
    if found is None:
        return None
    from layerlab.shapes import explain

    op, params = found
    try:
        ex = explain(op, input_shape, **params)
    except (LayerlabError, ModuleNotFoundError):
        return None
    return ex.error
