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
    (nn.modules.padding._ReflectionPadNd, "reflection_pad"),
    (nn.modules.padding._ReplicationPadNd, "replication_pad"),
    (nn.modules.padding._CircularPadNd, "circular_pad"),
    (nn.modules.padding._ConstantPadNd, "constant_pad"),  # ZeroPad too (value 0)
    (nn.FractionalMaxPool2d, "fractional_max_pool"),
    (nn.FractionalMaxPool3d, "fractional_max_pool"),
]


def _class_nd(module: nn.Module) -> Optional[int]:
    name = type(module).__name__
    for nd in (1, 2, 3):
        if name.endswith(f"{nd}d"):
            return nd
    return None


def _family(cls: type) -> Optional[str]:
    """The explain-shape family of a torch.nn class (``None``: no formula), looked up once per class."""
    try:
        return _FAMILY_OF[cls]
    except KeyError:
        pass
    found = next((family for base, family in _TORCH_OPS if issubclass(cls, base)), None)
    if len(_FAMILY_OF) >= 1024:  # classes made on the fly (torch.fx) are not kept forever
        _FAMILY_OF.clear()
    _FAMILY_OF[cls] = found
    return found


_FAMILY_OF: Dict[type, Optional[str]] = {}


def shape_op(module: nn.Module) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``(op, params)`` explain-shape needs to predict ``module``'s output size, or ``None``."""
    # a method of the class or a function set on the instance; not getattr(module, …), which for
    # every module without it goes through nn.Module.__getattr__ and builds an AttributeError
    own = getattr(type(module), "layerlab_shape_op", None)
    if own is not None:
        own = getattr(module, "layerlab_shape_op")
    else:
        own = vars(module).get("layerlab_shape_op")
    if callable(own):
        op, params = own()
        return op, dict(params)
    family = _family(type(module))
    if family is None:
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
    try:
        ex = _explain(op, in_shape, params)
    except (LayerlabError, ModuleNotFoundError) as exc:
        check.note = f"explain-shape cannot check {op}: {getattr(exc, 'message', exc)}"
        return check
    check.formula_call = ex.call
    check.steps = [f"{s.dim}: {s.substituted} = {s.output}" for s in ex.steps]
    if record.status != "ok":  # nothing came out to compare with: not checked, never "passed"
        check.note = ("not checked: the call raised; the arithmetic predicts that: " + ex.error.message
                      if ex.error is not None else "not checked: the call raised before returning an output")
        return check
    if ex.error is not None:
        check.passed = False
        check.note = f"the arithmetic says torch raises, but the call returned: {ex.error.message}"
        return check
    check.predicted = list(ex.output_shape)
    check.passed = check.predicted == actual
    if not check.passed:
        check.note = f"predicted {check.predicted}, the layer returned {actual}"
    return check


def _explain(op: str, in_shape: List[int], params: Dict[str, Any]):
    """``explain(op, in_shape, **params)``, remembered: the arithmetic is a pure function of its
    arguments, and the same layers see the same shapes again (repeated blocks, repeated runs).
    Only arguments that are numbers, strings, ``None`` or tuples/lists of ints are remembered,
    with their types (``True`` and ``1`` print differently in the formula); errors are not kept.
    """
    from layerlab.shapes import explain

    key = _cache_key(op, in_shape, params)
    if key is None:
        return explain(op, in_shape, **params)
    found = _EXPLAINED.get(key)
    if found is None:
        found = explain(op, in_shape, **params)
        if len(_EXPLAINED) >= 4096:
            _EXPLAINED.clear()
        _EXPLAINED[key] = found
    return found


_EXPLAINED: Dict[tuple, Any] = {}
_SCALARS = (int, float, bool, str, type(None))


def _cache_key(op: str, in_shape: List[int], params: Dict[str, Any]) -> Optional[tuple]:
    items = []
    for name, value in params.items():
        kind = type(value)
        if kind is tuple or kind is list:
            if not all(type(v) is int for v in value):
                return None
            value = tuple(value)
        elif kind not in _SCALARS:
            return None
        items.append((name, kind, value))
    if not all(type(n) is int for n in in_shape):
        return None
    return op, tuple(in_shape), tuple(items)


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
