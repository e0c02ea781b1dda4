"""The padding modules: ``nn.ReflectionPad``, ``ReplicationPad``, ``CircularPad``, ``ConstantPad``,
``ZeroPad`` (1d / 2d / 3d) — each is ``F.pad(x, self.padding, mode)`` after a little Python.

Per padded dim (``pl``, ``pr`` = the left/right padding; negative values crop)::

    L_out = L + pl + pr

What the module does before F.pad (torch 2.13, ``torch/nn/modules/padding.py``):

* an int ``padding`` becomes ``2·nd`` equal values (``_ntuple(2·nd)``); a tuple is kept **as is**,
  whatever its length — F.pad then decides (``ReflectionPad2d((1, 1))`` pads one dim, which the
  reflect kernels do not implement for a 4-D input: ``NotImplementedError``);
* ``CircularPad{nd}d`` checks the input rank itself first:
  ``ValueError: expected 3D or 4D input (got 2D input)``;
* then F.pad's rules (:mod:`fpad`): an odd number of values, too many values, the rank the
  reflect/replicate/circular kernels implement, ``reflect`` padding < L, ``circular`` padding ≤ L,
  replicate's "too small" (which changed in torch 2.14, see :mod:`torch_version`), and for
  ``constant`` (ConstantPad, ZeroPad): any rank, negative padding crops down to 0 but not below.

The pads are in F.pad's order: ``(left_W, right_W, left_H, right_H, …)``, last dim first.
"""

from __future__ import annotations

from typing import Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.conv_core import ntuple
from layerlab.shapes.fpad import pad_constant, pad_nonconstant
from layerlab.shapes.pool_steps import DIM_NAMES
from layerlab.shapes.result import DimStep, Explanation, ShapeNote

#: op name prefix → F.pad's mode
_MODES = {"reflection": "reflect", "replication": "replicate", "circular": "circular", "zero": "constant",
          "constant": "constant"}


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """``nn.<Kind>Pad{nd}d(padding)(x)``: the padded shape, or torch's error."""
    nd = spec.nd
    kind = spec.name.split("_")[0]
    mode = _MODES[kind]
    pads = ntuple(params["padding"], 2 * nd, "padding")
    if any(isinstance(p, str) for p in pads):
        raise UsageError("padding must be an int or a tuple of ints", where="padding", got=params["padding"])
    m = len(pads) // 2
    names = DIM_NAMES.get(m)
    if kind == "circular" and len(shape) not in (nd + 1, nd + 2):
        raise TorchWouldRaise(
            f"{spec.torch_name} takes a {nd + 1}-D (C, *spatial) or {nd + 2}-D (N, C, *spatial) input, "
            f"not {len(shape)}-D", torch_exception="ValueError",
            torch_message=f"expected {nd + 1}D or {nd + 2}D input (got {len(shape)}D input)", rule="§1.6",
            where="input", got=list(shape), suggestions=[f"an input with {nd + 1} or {nd + 2} dims"])
    if len(pads) % 2 == 0 and m <= len(shape):
        _steps(ex, shape, pads, names)
    if mode == "constant":
        ex.output_shape = pad_constant(shape, pads, names)
    else:
        ex.output_shape = pad_nonconstant(shape, pads, mode, names=names, rules=ex.torch_rules)
    if mode == "reflect":
        ex.notes.append(ShapeNote("info", "reflect padding mirrors without repeating the edge pixel, so each "
                                          "side's padding must be smaller than the size of its dim",
                                  severity="info"))
    if any(p < 0 for p in pads):
        ex.notes.append(ShapeNote("info", "negative padding crops that side", severity="info"))


def _steps(ex: Explanation, shape: Tuple[int, ...], pads: tuple, names) -> None:
    m = len(pads) // 2
    lead = len(shape) - m
    for i in range(m):
        pl, pr = pads[2 * (m - 1 - i)], pads[2 * (m - 1 - i) + 1]
        L = shape[lead + i]
        name = names[i] if names else f"dim {lead + i}"
        ex.steps.append(DimStep(name, L, f"{name} + p_left + p_right", f"{L} + {pl} + {pr}", L + pl + pr,
                                {"p_left": pl, "p_right": pr}))
