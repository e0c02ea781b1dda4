"""Loss inputs of the wrong shape or dtype: cross-entropy and binary cross-entropy.

Legend: N batch, C classes, T positions (tokens, pixels).

* **Classes last.** ``F.cross_entropy`` reads the classes on dim 1: logits ``(N, C, T)`` with a target
  ``(N, T)``. A tagger's ``(N, T, C)`` logits with a ``(N, T)`` target are the same data with the
  classes last: ``logits.transpose(1, 2)`` (``movedim(-1, 1)`` beyond 3-D, which keeps the other axes
  in order). Changing the number of classes would make it run on the wrong axis.
* **A probability target with an extra axis.** A float target must have the logits' shape; a one-hot
  ``(N, 1, C)`` is the same numbers with a size-1 axis: squeeze that axis.
* **One-hot integers.** An integer target shaped like the logits whose rows are one-hot holds class
  indices in another form: ``target.argmax(1)``.
* **The batches differ.** Torch says "Expected input batch_size (12) to match target batch_size (4)".
  When a ``batch_first=True`` RNN was given an input whose dim 0 is the logits' batch and whose dim 1 is
  the target's, the RNN read ``(T, N, C)`` data as ``(N, T, C)``: transpose its input. Otherwise the
  report says what it sees and offers no fix.
* **Logits at a lower resolution than the mask.** A segmentation head after strided layers gives
  ``(N, C, H/s, W/s)`` logits for a ``(N, H, W)`` mask. With the batch and the classes in place and every
  spatial size smaller by about one factor, the fix upsamples the logits to the mask's size
  (``F.interpolate(logits, size=…, mode="bilinear")``); downsampling the mask with ``mode="nearest"`` is
  the alternative. A mask is never reshaped or cropped (that mislabels pixels), and a 1-D sequence
  (a tagger whose conv shortened it) gets no fix: padding the conv is its fix, not interpolation.
* **BCE targets.** ``binary_cross_entropy_with_logits`` wants a float target of the logits' shape:
  an integer 0/1 target is cast with ``.float()``; a target with the logits' numbers in another shape
  (``(N,)`` for ``(N, 1)``) is reshaped like the logits.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import loss_operands, op_at, op_site
from layerlab.probe.hooks import dtype_name
from layerlab.probe.report import Diagnosis, FixStep

BCE = ("F.binary_cross_entropy_with_logits", "F.binary_cross_entropy")
_CE_RULE = "cross_entropy: logits (N, C, *) with the classes on dim 1; target (N, *) int64, or (N, C, *) float"
_BCE_RULE = "binary_cross_entropy(_with_logits): target float, the logits' shape"

#: ``(which, to, code) -> FixStep``: which 0 = logits, 1 = target; ``to`` a conversion of fixes._convert.
FixMaker = Callable[[int, str, str], FixStep]


def _op_fixes(record) -> FixMaker:
    return lambda which, to, code: FixStep("replace-op", record.source or "", code, op_site(record, arg=which, to=to))


def _module_fixes(ctx) -> FixMaker:
    keys = (ctx.key("input", 0), ctx.key("target", 1))
    return lambda which, to, code: FixStep("cast-input", ctx.path, code, {"arg": keys[which], "to": to})


def _one_hot(t: torch.Tensor, dim: int) -> bool:
    return bool(((t == 0) | (t == 1)).all() and (t.sum(dim) == 1).all())


def cross_entropy(ctx, logits, target, api: str, fix: FixMaker) -> Optional[Diagnosis]:
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor) or logits.dim() < 2:
        return None
    shape, tshape = list(logits.shape), list(target.shape)
    shown = f"{api}: logits {shape}, target {tshape} {dtype_name(target.dtype)}"
    index_shape = [shape[0], *shape[2:]]
    if not target.is_floating_point():
        if logits.dim() >= 3 and tshape == shape[:-1] and tshape != index_shape:
            code = "logits.transpose(1, 2)" if logits.dim() == 3 else "logits.movedim(-1, 1)"
            return Diagnosis(
                f"{shown}: the target is the logits' shape without the last dim, so the classes are last "
                f"({shape[-1]} classes); cross_entropy reads them on dim 1", expected=f"logits {[shape[0], shape[-1], *shape[1:-1]]}",
                got=shape, cause="layout", hint=f"move the classes to dim 1: {code} (or flatten both: "
                f"logits.reshape(-1, {shape[-1]}), target.reshape(-1))",
                fix=fix(0, "movedim:-1:1", code), rule=_CE_RULE,
                alternatives=[f"not a class count of {shape[1]}: dim 1 holds positions, not classes"])
        if tshape == shape and _one_hot(target, 1):
            return Diagnosis(
                f"{shown}: an integer target shaped like the logits whose rows are one-hot: class indices in "
                "one-hot form", expected=f"target {index_shape} int64", got=tshape, cause="loss-target",
                hint="pass the class indices: target.argmax(1) (or target.float() as probabilities)",
                fix=fix(1, "argmax:1", "target.argmax(1)"), rule=_CE_RULE)
        if tshape and tshape[0] != shape[0]:
            return _batches(ctx, logits, target, shown)
        if len(tshape) == len(index_shape) >= 3 and tshape != index_shape:
            return _resolution(ctx, shape, tshape, shown, fix)
        return None
    if tshape != shape and target.numel() == logits.numel() and target.dim() == logits.dim() + 1:
        for d in range(target.dim()):
            if tshape[d] == 1 and tshape[:d] + tshape[d + 1:] == shape:
                kind = "one-hot" if _one_hot(target.squeeze(d), 1) else "probability"
                return Diagnosis(
                    f"{shown}: a float target is read as class probabilities and must have the logits' shape; this "
                    f"{kind} target has an extra size-1 dim {d}", expected=shape, got=tshape, cause="loss-target",
                    hint=f"drop that dim: target.squeeze({d}) → {shape}"
                         + (" (or pass the class indices, target.argmax(-1))" if kind == "one-hot" else ""),
                    fix=fix(1, f"squeeze:{d}", f"target.squeeze({d})"), rule=_CE_RULE)
    return None


def _batches(ctx, logits, target, shown: str) -> Diagnosis:
    n, want = logits.shape[0], target.shape[0]
    base = f"{shown}: the logits have batch {n}, the target {want}; " + ctx.origins([("logits", logits)])
    for call, module in zip(ctx.recorder.calls, ctx.recorder.modules):
        x = call.inputs[0] if call.inputs else None
        if isinstance(module, nn.RNNBase) and module.batch_first and x is not None and x.shape is not None \
                and len(x.shape) == 3 and x.shape[0] == n and x.shape[1] == want and n != want:
            code = "x.transpose(0, 1)"
            return Diagnosis(
                f"{base}. {call.label} ({call.class_name}) has batch_first=True and got {x.shape}: it read dim 0 "
                f"({n}) as the batch, but the target's batch ({want}) is its dim 1 — the input is (T, N, C)",
                expected=f"{call.label} input (N, T, C) = {[want, n, x.shape[2]]}", got=x.shape, cause="layout",
                hint=f"transpose its input: {code} before {call.label} (or build it with batch_first=False)",
                fix=FixStep("permute-input", call.path, code, {"arg": 0, "dims": [1, 0, 2], "restore": None}),
                rule="nn.RNN/LSTM/GRU with batch_first=True: input (N, T, C)")
    return Diagnosis(base, expected=f"batch {want}", got=f"batch {n}", cause="batch",
                     hint="the logits and the target must have one row per sample; check the reshapes between the "
                          "model's input and its logits", rule=_CE_RULE)


def _resolution(ctx, shape, tshape, shown: str, fix: FixMaker) -> Optional[Diagnosis]:
    """Segmentation logits ``(N, C, h, w)`` smaller than the mask ``(N, H, W)`` by one stride factor."""
    small, big = shape[2:], tshape[1:]
    if any(s >= b for s, b in zip(small, big)):
        return None  # not smaller on every axis: a transpose or a crop, nothing an upsampling explains
    ratios = [b / s for s, b in zip(small, big)]
    sizes = f"{' × '.join(map(str, small))} vs the mask's {' × '.join(map(str, big))}"
    if not all(r >= 1.9 and abs(r - round(r)) <= 0.1 * r for r in ratios) or max(ratios) / min(ratios) > 1.25:
        return Diagnosis(  # a few pixels short (unpadded convs): resizing either side would misalign them
            f"{shown}: the logits are smaller than the mask ({sizes}), but not by a stride factor: layers "
            "without padding?", expected=f"logits {[*shape[:2], *big]}", got=shape, cause="resolution",
            hint="keep the spatial size through the network (padding=kernel_size // 2 in the convs); resizing the "
                 "logits or cutting the mask would pair logits with other pixels' labels", rule=_CE_RULE)
    size = ", ".join(map(str, big))
    mode = "bilinear" if len(big) == 2 else "trilinear"
    code = f"F.interpolate(logits, size=({size}), mode='{mode}', align_corners=False)"
    failed = ctx.failed_op
    log_probs = failed.record.op == "F.nll_loss" if failed is not None else isinstance(ctx.module, nn.NLLLoss)
    down = f"F.interpolate(mask[:, None].float(), size=({', '.join(map(str, small))}), mode='nearest')[:, 0].long()"
    return Diagnosis(
        f"{shown}: the logits are at a lower resolution than the mask ({sizes}, smaller by "
        f"{' × '.join(f'{r:g}' for r in ratios)}); cross_entropy needs one logit vector per mask pixel",
        expected=f"logits {[*shape[:2], *big]}", got=shape, cause="resolution",
        hint=f"upsample the logits to the mask's size{' before log_softmax' if log_probs else ''}: {code}",
        fix=None if log_probs else fix(0, f"interpolate:{size.replace(' ', '')}:{mode}", code),
        alternatives=[f"or downsample the mask to the logits' size (nearest, never bilinear, for labels): {down}",
                      "not a reshape or a crop of the mask: that would pair logits with other pixels' labels"],
        rule=_CE_RULE)


def bce(logits, target, api: str, fix: FixMaker) -> Optional[Diagnosis]:
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor) or not logits.is_floating_point():
        return None
    shown = f"{api}: logits {list(logits.shape)}, target {list(target.shape)} {dtype_name(target.dtype)}"
    if target.shape == logits.shape and not target.is_floating_point():
        return Diagnosis(f"{shown}: the target must be floating (0./1. per logit)", expected=dtype_name(logits.dtype),
                         got=dtype_name(target.dtype), cause="dtype", hint="cast it: target.float()",
                         fix=fix(1, dtype_name(logits.dtype), "target.float()"), rule=_BCE_RULE)
    if target.shape != logits.shape and target.numel() == logits.numel() and \
            [s for s in target.shape if s != 1] == [s for s in logits.shape if s != 1]:
        shape = ",".join(map(str, logits.shape))
        cast = "" if target.is_floating_point() else ".float()"
        return Diagnosis(f"{shown}: the same numbers in another shape: one target per logit, the logits' shape",
                         expected=list(logits.shape), got=list(target.shape), cause="loss-target",
                         hint=f"shape it like the logits: target.view_as(logits){cast}",
                         fix=fix(1, f"shape:{shape}" + (f"+{dtype_name(logits.dtype)}" if cast else ""),
                                 f"target.view_as(logits){cast}"), rule=_BCE_RULE)
    return None


@register_rule("loss/target-shape", stage="op", on=ops.CLASS_LOSSES + ops.BCE_LOSSES, order=481)
def loss_op(ctx) -> Optional[Diagnosis]:
    """``F.cross_entropy``/``F.nll_loss``/BCE whose target's shape does not fit the logits (classes on the
    last axis, one-hot or integer targets where the loss wants the other, a smaller map, another batch)."""
    failed = ctx.failed_op
    record = failed.record
    logits, target = loss_operands(failed)
    api = f"{record.op}{op_at(record)}"
    if record.op in BCE:
        return bce(logits, target, api, _op_fixes(record))
    return cross_entropy(ctx, logits, target, api, _op_fixes(record))


@register_rule("loss/target-shape-module", stage="module",
               on=(nn.CrossEntropyLoss, nn.NLLLoss, nn.BCEWithLogitsLoss, nn.BCELoss),
               order=270)
def loss_module(ctx) -> Optional[Diagnosis]:
    """``nn.CrossEntropyLoss``/``nn.NLLLoss``/``nn.BCEWithLogitsLoss``/``nn.BCELoss`` (a submodule) whose
    target's shape does not fit the logits."""
    m = ctx.module
    logits, target = ctx.arg("input", 0), ctx.arg("target", 1)
    api = f"{ctx.path or '(root)'} ({type(m).__name__})"
    if isinstance(m, (nn.BCEWithLogitsLoss, nn.BCELoss)):
        return bce(logits, target, api, _module_fixes(ctx))
    return cross_entropy(ctx, logits, target, api, _module_fixes(ctx))
