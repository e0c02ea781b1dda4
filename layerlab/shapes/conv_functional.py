"""``F.conv{1,2,3}d`` and ``F.conv_transpose{1,2,3}d``: the functional's semantics, not the module's.

The shape formulas are the module's (:mod:`conv`, :mod:`conv_transpose`); what differs is who
checks what (shape_rules.md §0 "Module vs functional", §1.4, §1.5, §2.6):

* there is no constructor, so none of its ``ValueError`` s: ``groups``, divisibility, the padding
  string and ``'same'`` + stride are checked by ATen, as ``RuntimeError`` s, *after* the input
  rank — in this order: rank → padding string (``Invalid padding string: 'full'``) →
  ``non-positive groups is not supported`` → for ``'same'``: stride/dilation lengths, then
  ``padding='same' is not supported for strided convolutions`` → :func:`conv_core.convolution`;
* the weight is the caller's: ``(out_channels, in_channels // groups, *kernel_size)`` for a conv,
  ``(in_channels, out_channels // groups, *kernel_size)`` for a transposed one. A weight that
  does not divide by ``groups`` is ATen's ``expected weight to be divisible by G`` error; an
  input whose C does not match it is ATen's channel error;
* ``F.conv_transpose*`` takes no string padding at all — the argument parser's ``TypeError`` comes
  before any other check — and has no ``output_size`` and no ``padding_mode``.
"""

from __future__ import annotations

from typing import Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes import conv_core as core
from layerlab.shapes.conv import ConvAdvisor, _notes_after, _steps_and_notes_before, resolve_channels
from layerlab.shapes.conv_transpose import ConvTransposeAdvisor, _backend_note, _range_notes, _steps
from layerlab.shapes.result import Explanation, ShapeNote


class FunctionalConvAdvisor(ConvAdvisor):
    """The module's plain words, minus what only applies to the module (its construction)."""

    def _same_strided(self, data):
        out = super()._same_strided(data)
        out.pop("hint", None)
        return out


def _weight(nd: int, transposed: bool, in_ch: int, out_ch: int, groups: int, kernel_size) -> tuple:
    k = core.ntuple(kernel_size, nd, "kernel_size")
    if any(isinstance(v, str) for v in k):
        raise UsageError("kernel_size must be an int or a tuple of ints", where="kernel_size", got=kernel_size)
    w = (in_ch, out_ch // groups) + k if transposed else (out_ch, in_ch // groups) + k
    if any(v < 0 for v in w):
        raise UsageError(f"the weight would have shape {list(w)}: a tensor cannot have negative sizes",
                         where="kernel_size", got=list(w))
    return w


def _module(nd: int, transposed: bool, in_ch: int, out_ch: int, w: tuple, params: dict, padding) -> core.Module:
    """The arguments as a :class:`conv_core.Module` record, so the module's step/note code can show them."""
    t = {n: core.ntuple(params.get(n, 0), nd, n) for n in ("stride", "dilation", "output_padding")}
    return core.Module(nd, transposed, in_ch, out_ch, tuple(w[2:]), t["stride"], padding, t["dilation"],
                       t["output_padding"], params["groups"], "zeros", [], w)


def _groups(groups: int, advise) -> None:
    if groups <= 0:
        raise core.fail("groups-positive", "RuntimeError", "non-positive groups is not supported", "§1.2", advise,
                        groups=groups)


def explain_conv(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """``F.conv{nd}d(x, weight, stride=…, padding=…, dilation=…, groups=…)``."""
    nd = spec.nd
    in_ch, out_ch = resolve_channels(shape, nd, params)
    advise = FunctionalConvAdvisor(nd, shape, in_ch, out_ch, params)
    advise.cls = f"F.conv{nd}d"
    padding = params["padding"]
    pad = padding if isinstance(padding, str) else core.ntuple(padding, nd, "padding")
    xb, batched = core.batchify(shape, nd, f"conv{nd}d", advise)
    if isinstance(pad, str) and pad not in ("same", "valid"):
        raise core.fail("padding-string", "RuntimeError", f"Invalid padding string: {pad!r}", "§1.4", advise,
                        padding=pad)
    groups = params["groups"]
    _groups(groups, advise)
    w = _weight(nd, False, in_ch, out_ch, groups, params["kernel_size"])
    m = _module(nd, False, in_ch, out_ch, w, params, pad)
    if pad != "same" or all(v == 1 for v in m.stride):  # the steps of a valid 'same' only
        _steps_and_notes_before(ex, m, shape)
    if pad == "same":
        xb, pad_l = core.conv_same(xb, w, m.stride, m.dilation, groups, advise)
        res = core.convolution(xb, w, m.stride, pad_l, m.dilation, False, (0,), groups, advise)
    else:
        res = core.convolution(xb, w, m.stride, (0,) if pad == "valid" else pad, m.dilation, False, (0,) * nd,
                               groups, advise)
    ex.output_shape = core.unbatch(res.shape, batched)
    _notes_after(ex, m, shape, res)


def explain_conv_transpose(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """``F.conv_transpose{nd}d(x, weight, stride=…, padding=…, output_padding=…, groups=…, dilation=…)``."""
    nd = spec.nd
    in_ch, out_ch = resolve_channels(shape, nd, params)
    advise = ConvTransposeAdvisor(nd, shape, in_ch, out_ch, params, cls="ConvTranspose")
    advise.cls = f"F.conv_transpose{nd}d"
    if isinstance(params["padding"], str):
        raise TorchWouldRaise(
            f"F.conv_transpose{nd}d has no padding={params['padding']!r}: its padding is ints only",
            torch_exception="TypeError",
            torch_message=f"conv_transpose{nd}d(): argument 'padding' must be tuple of ints, not str",
            rule="§2.6", where="padding", got=params["padding"],
            suggestions=["an int padding: p = d·(k−1)/2 keeps the size at stride 1"])
    pad = core.ntuple(params["padding"], nd, "padding")
    xb, batched = core.batchify(shape, nd, f"conv_transpose{nd}d", advise)
    groups = params["groups"]
    _groups(groups, advise)
    w = _weight(nd, True, in_ch, out_ch, groups, params["kernel_size"])
    m = _module(nd, True, in_ch, out_ch, w, params, pad)
    op = list(m.output_padding)
    _range_notes(ex, m, shape)
    _steps(ex, m, shape, op)
    try:
        res = core.convolution(xb, w, m.stride, pad, m.dilation, True, op, groups, advise)
    except TorchWouldRaise as err:
        _backend_note(ex, err, xb, m, op)
        raise
    ex.output_shape = core.unbatch(res.shape, batched)
    if out_ch % groups:
        ex.notes.append(ShapeNote(
            "info", f"out_channels={out_ch} is not a multiple of groups={groups}: the weight "
                    f"{list(w)} gives {w[1] * groups} output channels", dim="C", severity="warning"))
