"""Output-size arithmetic of every conv/pool-type op, exactly as torch computes it — without torch.

Two entry points::

    >>> from layerlab.shapes import output_shape, explain
    >>> output_shape("conv2d", (1, 3, 32, 32), out_channels=8, kernel_size=3, stride=2)
    (1, 8, 15, 15)
    >>> ex = explain("max_pool1d", (1, 1, 5), kernel_size=2, ceil_mode=True)
    >>> ex.output_shape, [n.code for n in ex.notes]
    ((1, 1, 3), ['ceil-extra-window'])

``output_shape`` raises :class:`~layerlab.errors.TorchWouldRaise` where torch raises (with torch's
exception class and message); ``explain`` never raises it and returns an
:class:`~layerlab.shapes.result.Explanation` whose ``error`` holds it instead, next to the steps
that ran. Both raise :class:`~layerlab.errors.UsageError` for unknown ops or parameters.

An ``F.`` prefix (``"F.conv2d"``, ``"torch.nn.functional.interpolate"``) asks for the functional's
semantics — no module constructor, the functional's own checks and messages; any other spelling
(``"conv2d"``, ``"Conv2d"``, ``"nn.Conv2d"``) means the module.

The input shape is the full tensor shape as torch sees it (batched ``(N, C, *S)`` or unbatched
``(C, *S)``); parameters use torch's argument names (``kernel_size``, ``stride``, …).

The answer is the installed torch's (its version is read from the package metadata, torch is
never imported); ``torch_version="2.13.0"`` asks about another one — see
:mod:`layerlab.shapes.torch_version` for what differs between versions.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional, Sequence, Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.ops import OPS, REQUIRED, OpSpec, resolve
from layerlab.shapes.result import DimStep, Explanation, ShapeNote
from layerlab.shapes import values
from layerlab.shapes.torch_version import torch_rules

__all__ = ["explain", "output_shape", "resolve", "Explanation", "DimStep", "ShapeNote", "OPS"]


def _fill_params(spec: OpSpec, params: dict) -> dict:
    unknown = [k for k in params if k not in spec.defaults]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, list(spec.defaults), n=1)
        raise UsageError(
            f"{spec.torch_name} has no argument {name!r}",
            where=spec.name,
            expected="one of " + ", ".join(spec.defaults),
            got=name,
            hint=f"did you mean {close[0]!r}?" if close else None,
        )
    filled = dict(spec.defaults)
    filled.update(params)
    missing = [k for k, v in filled.items() if v is REQUIRED]
    if missing:
        raise UsageError(
            f"{spec.torch_name} needs {missing[0]!r}",
            where=spec.name,
            hint=f"pass {missing[0]}=… (--{missing[0].replace('_', '-')} on the command line)",
        )
    return filled


def format_call(spec: OpSpec, params: dict) -> str:
    """``nn.Conv2d(kernel_size=3, stride=2)``: the op with its non-default arguments."""
    shown = [
        f"{k}={v!r}" for k, v in params.items() if spec.defaults[k] is REQUIRED or spec.defaults[k] != v
    ]
    return f"{spec.torch_name.split(' ')[0]}({', '.join(shown)})"


def explain(op: str, input_shape: Sequence[int], *, torch_version: Optional[str] = None,
            **params: Any) -> Explanation:
    """Explain ``op(**params)`` applied to a tensor of ``input_shape``; never raises TorchWouldRaise.

    ``torch_version`` (e.g. ``"2.13.0"``): predict that torch's behaviour instead of the installed one's.
    """
    rules = torch_rules(torch_version)
    shape: Tuple[int, ...] = values.input_shape(input_shape)
    if any(x < 0 for x in shape):
        raise UsageError(
            f"an input shape cannot have negative sizes, got {shape}",
            where="input", expected="sizes ≥ 0", got=shape,
        )
    spec = resolve(op, n_spatial=max(len(shape) - 2, 1))
    filled = _fill_params(spec, params)
    ex = Explanation(op=spec.key, call=format_call(spec, filled), params=filled, input_shape=shape,
                     torch_rules=rules)
    try:
        spec.explain_fn(ex, spec, shape, values.normalise(spec, filled))
    except TorchWouldRaise as err:
        ex.output_shape = None
        ex.error = err
    return ex


def output_shape(op: str, input_shape: Sequence[int], *, torch_version: Optional[str] = None,
                 **params: Any) -> Tuple[int, ...]:
    """The shape torch returns for ``op(**params)(torch.empty(input_shape))``, or raise like torch."""
    ex = explain(op, input_shape, torch_version=torch_version, **params)
    if ex.error is not None:
        raise ex.error
    return ex.output_shape  # type: ignore[return-value]  (explain sets it when error is None)
