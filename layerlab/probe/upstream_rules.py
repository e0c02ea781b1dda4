"""Failures whose fix belongs to an *earlier* layer: the one that made the input the failing call
cannot take.

* ``nn.PixelShuffle(r)`` fed channels that are not a multiple of r²: the conv before it sets them;
* ``nn.Unflatten(dim, sizes)`` fed a dim that is not ``prod(sizes)``: the Linear before it sets it;
* a pooling layer whose map has already shrunk below its kernel: the downsampling steps before it
  are listed, with the input size that would survive them;
* ``torch.cat`` of a ConvTranspose output with a skip connection one row/column larger (an odd
  size lost in a stride-2 pool): ``output_size=`` of that ConvTranspose call restores it.

Every fix here changes the producer, found through the recorder (``ctx.producer``); when there is
no producer of a known kind, the diagnosis explains and offers no fix.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.layout import operand_side
from layerlab.probe.report import Diagnosis, FixStep

_CONV_TRANSPOSE = ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")


def _submodule(ctx, path: str) -> Optional[nn.Module]:
    root = getattr(ctx.recorder, "root", None)
    if root is None:
        return None
    try:
        return root.get_submodule(path) if path else root
    except AttributeError:
        return None


def _model_input(ctx) -> Optional[torch.Tensor]:
    """The first tensor the outermost call received (the model's input)."""
    args, kwargs = (ctx.outer[0][1], ctx.outer[0][2]) if ctx.outer else (ctx.args, ctx.kwargs)
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor):
            return value
    return None


# -- PixelShuffle -----------------------------------------------------------------------------------
@register_rule("upstream/pixel-shuffle-channels", stage="module", on=(nn.PixelShuffle,), order=230)
def pixel_shuffle(ctx) -> Optional[Diagnosis]:
    """nn.PixelShuffle(r) fed channels that are not a multiple of r²: the conv before it sets them."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    r = m.upscale_factor
    C = x.shape[-3]
    if C % (r * r) == 0:
        return None
    call = ctx.producer(x)
    maker = _submodule(ctx, call.path) if call is not None else None
    base = (f"PixelShuffle({r}) turns C·{r * r} channels into C channels at {r}× the resolution, but its input "
            f"{list(x.shape)} has {C} channels, not a multiple of {r}² = {r * r}")
    rule = "PixelShuffle: (N, C·r², H, W) → (N, C, H·r, W·r)"
    if not isinstance(maker, nn.modules.conv._ConvNd) or call is None:
        return Diagnosis(base, expected=f"a multiple of {r * r}", got=C, cause="size",
                         hint=f"make the layer before it output C·{r * r} channels for the C channels you want after the shuffle",
                         rule=rule)
    image = _model_input(ctx)
    wanted = image.shape[1] if isinstance(image, torch.Tensor) and image.dim() == 4 and image.shape[1] in (1, 3) else None
    hint = (f"set out_channels of {call.label} ({call.class_name}) to C·{r * r} for the C channels you want "
            f"after the shuffle")
    if wanted is None:
        return Diagnosis(f"{base}; they come from {call.label} ({call.class_name})", expected=f"a multiple of {r * r}",
                         got=C, cause="size", hint=hint, rule=rule)
    value = wanted * r * r
    return Diagnosis(
        f"{base}; they come from {call.label} ({call.class_name})", expected=f"a multiple of {r * r}", got=C,
        cause="size", hint=f"{hint}: out_channels={value} gives {wanted} channels, as many as the input image has",
        fix=FixStep("set-arg", call.path, f"out_channels={value}", {"name": "out_channels", "value": value}),
        alternatives=[f"another multiple of {r * r} if the output should not have {wanted} channels"] + _other_factor(C, wanted, r),
        rule=rule)


# -- Unflatten --------------------------------------------------------------------------------------
@register_rule("upstream/unflatten-size", stage="module", on=(nn.Unflatten,), order=240)
def unflatten(ctx) -> Optional[Diagnosis]:
    """nn.Unflatten fed a dim that is not the product of its sizes: the Linear before it sets it."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return None
    sizes = [int(s) for s in m.unflattened_size] if not isinstance(m.unflattened_size[0], tuple) else None
    if sizes is None or any(s < 0 for s in sizes):
        return None
    dim = m.dim % x.dim()
    want, got = math.prod(sizes), x.shape[dim]
    if want == got:
        return None
    text = " · ".join(map(str, sizes))
    base = (f"Unflatten({m.dim}, {tuple(sizes)}) splits dim {dim} into {text} = {want} elements, but the input "
            f"{list(x.shape)} has {got} there")
    rule = "Unflatten: the unflattened sizes multiply to the size of the dim they replace"
    call = ctx.producer(x)
    maker = _submodule(ctx, call.path) if call is not None else None
    if isinstance(maker, nn.Linear) and dim == x.dim() - 1 and call.path:
        return Diagnosis(
            f"{base}; it comes from {call.label} (Linear, out_features={got})", expected=want, got=got, cause="size",
            hint=f"set out_features={want} on {call.label} so that it fills {tuple(sizes)}",
            fix=FixStep("set-arg", call.path, f"out_features={want}", {"name": "out_features", "value": want}),
            alternatives=[f"or unflatten to sizes that multiply to {got}, if the layers after it take them"], rule=rule)
    return Diagnosis(base, expected=want, got=got, cause="size",
                     hint=f"make the sizes multiply to {got}, or make the layer before it output {want}", rule=rule)


def _other_factor(channels: int, wanted: int, r: int) -> List[str]:
    """The other reading when ``channels = wanted · k²`` for a factor ``k ≠ r``: the conv is sized for
    PixelShuffle(k), and the shuffle's factor may be the bug (the same numbers either way; both run)."""
    k = math.isqrt(channels // wanted) if channels % wanted == 0 else 0
    if k < 2 or k * k * wanted != channels or k == r:
        return []
    return [f"PixelShuffle({k}) — if the model upsamples ×{k}: the conv's {channels} = {wanted}·{k}² channels fit it"]


# -- pooling below its kernel -----------------------------------------------------------------------
def _pairs(value, n: int) -> List[int]:
    return list(value) if isinstance(value, (tuple, list)) else [value] * n


@register_rule("upstream/pool-map-too-small", stage="module",
               on=(nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd),
               order=250)
def pool_too_small(ctx) -> Optional[Diagnosis]:
    """A pooling layer whose map already shrank below its kernel: the downsampling steps before it."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or "too small" not in str(ctx.exc):
        return None
    nd = len(_pairs(m.kernel_size, 1)) if isinstance(m.kernel_size, tuple) else x.dim() - 2
    nd = min(nd, x.dim() - 1)
    spatial = list(x.shape[-nd:])
    kernel = _pairs(m.kernel_size, nd)
    padding = _pairs(getattr(m, "padding", 0), nd)
    dilation = _pairs(getattr(m, "dilation", 1), nd)
    need = [(k - 1) * d + 1 - 2 * p for k, d, p in zip(kernel, dilation, padding)]
    size = "×".join(map(str, spatial))
    steps = _shrinking_calls(ctx, nd)
    image = _model_input(ctx)
    history = ""
    hint = f"this layer needs at least {'×'.join(map(str, need))}: "
    if steps:
        history = "; the map shrank " + " → ".join([steps[0][1]] + [f"{out} at {label}" for label, _, out in steps])
    if isinstance(image, torch.Tensor) and image.dim() == x.dim() and all(s > 0 for s in spatial):
        grow = max(math.ceil(n / s) for n, s in zip(need, spatial))
        first = [s * grow for s in image.shape[-nd:]]
        hint += f"feed a larger input ({grow}× in each spatial dim: {'×'.join(map(str, first))}), "
    hint += f"remove a downsampling step before it, or use nn.AdaptiveAvgPool{nd}d/AdaptiveMaxPool{nd}d for the last one"
    return Diagnosis(
        f"{type(m).__name__} gets a {size} map, smaller than its kernel {'×'.join(map(str, need))} "
        f"(kernel {tuple(kernel)}, padding {tuple(padding)}): its output would be empty" + history,
        expected=f"spatial ≥ {'×'.join(map(str, need))}", got=spatial, cause="size", hint=hint,
        rule=f"{type(m).__name__}: out = (in + 2·padding − dilation·(kernel − 1) − 1) // stride + 1 must be ≥ 1")


def _shrinking_calls(ctx, nd: int):
    """``(label, "in", "out")`` of the finished calls before this one that made a map smaller."""
    out = []
    for call in ctx.recorder.calls:
        if call.status != "ok" or not call.tensor_inputs or not call.tensor_outputs:
            continue
        a, b = call.tensor_inputs[0].shape, call.tensor_outputs[0].shape
        if len(a) != len(b) or len(a) < nd + 1:
            continue
        sa, sb = a[-nd:], b[-nd:]
        if all(y <= x for x, y in zip(sa, sb)) and sa != sb:
            out.append((f"{call.label} ({call.class_name})", "×".join(map(str, sa)), "×".join(map(str, sb))))
    return out[-6:]


# -- cat after a ConvTranspose ----------------------------------------------------------------------
@register_rule("join/cat-after-upsample", stage="op", on=ops.JOINS, order=100)
def cat_after_upsample(ctx) -> Optional[Diagnosis]:
    """``torch.cat`` of a ConvTranspose output with a skip one row/column larger: ``output_size=`` of that
    call."""
    failed = ctx.failed_op
    if failed.record.op not in ("cat", "concat", "concatenate"):
        return None
    seq = failed.args[0] if failed.args else failed.kwargs.get("tensors")
    if not isinstance(seq, (list, tuple)) or len(seq) != 2 or not all(isinstance(t, torch.Tensor) for t in seq):
        return None
    a, b = seq
    if a.dim() != b.dim() or a.dim() < 3:
        return None
    dim = failed.args[1] if len(failed.args) > 1 else failed.kwargs.get("dim", 0)
    dim = dim % a.dim() if isinstance(dim, int) else 0
    if dim != 1 or a.shape[0] != b.shape[0]:
        return None
    for up, other in ((a, b), (b, a)):
        call = ctx.producer(up)
        if call is None or call.class_name not in _CONV_TRANSPOSE:
            continue
        module = _submodule(ctx, call.path)
        short = [o - u for u, o in zip(up.shape[2:], other.shape[2:])]
        if module is None or not any(short) or any(s < 0 or s >= st for s, st in zip(short, module.stride)):
            return None  # larger or far off: not the lost odd row; the generic cat rule speaks
        size = list(other.shape[2:])
        record = failed.record
        return Diagnosis(
            f"cat(dim=1){op_at(record)} joins {list(up.shape)} from {call.label} ({call.class_name}) with "
            f"{list(other.shape)}: the spatial sizes differ by {short}. A stride-{module.stride[0]} downsampling "
            f"floors an odd size, and {call.label} cannot know the size it was",
            expected=size, got=list(up.shape[2:]), cause="size",
            hint=f"pass the size to restore to {call.label} ({call.class_name}): "
                 f"{call.label}(…, output_size=skip.shape[-{len(size)}:]) → {size}, where skip is the tensor it is joined with",
            fix=FixStep("call-kwarg", call.path, f"output_size={size}", {"name": "output_size", "value": size}),
            alternatives=["F.pad the upsampled map, or crop the skip connection, to the same size"],
            rule="ConvTranspose: out = (in − 1)·stride − 2·padding + dilation·(kernel − 1) + output_padding + 1; "
                 "output_size= picks among the sizes a stride allows",
        )
    return None


# -- a reduction over the wrong axis ----------------------------------------------------------------
_REDUCTIONS = ("max", "amax", "min", "amin", "mean", "sum", "logsumexp", "median", "nanmean", "nansum")


def reduced_wrong_axis(ctx, x, want: int, base: str, rule: str) -> Optional[Diagnosis]:
    """``x.max(dim=1)`` of a conv's (N, C, L) fed to a Linear(C): the reduction removed the very axis
    the Linear wants, and kept a position axis. ``in_features=L`` would run and tie the model to one
    sequence length, so the fix is the reduction's ``dim`` — only when exactly one other axis fits."""
    record = ctx.producer_op(x)
    if record is None or record.op not in _REDUCTIONS or len(record.inputs) != 1 or not record.outputs:
        return None
    shape, args = list(record.inputs[0].shape or []), record.args
    dim = args.get("dim", args.get("1"))
    if not isinstance(dim, int) or args.get("keepdim", args.get("2")) or len(shape) < 3:
        return None
    dim %= len(shape)
    if shape[dim] != want or record.outputs[0] != shape[:dim] + shape[dim + 1:]:
        return None
    side = operand_side(ctx, record.inputs[0], len(shape))
    if side is not None and dim != (1 if side == "first" else len(shape) - 1):
        return None  # it pooled the positions of a map whose maker says where its features are: the usual pool
    fits = [a for a in range(1, len(shape)) if a != dim and (shape[:a] + shape[a + 1:])[-1] == want]
    if len(fits) != 1:
        return None
    axis = fits[0]
    return Diagnosis(
        f"{base}; {want} was on dim {dim} of {shape} before `{record.op}(dim={dim})`{op_at(record)}, "
        f"which reduced that axis away and kept dim {axis} ({shape[axis]}): the reduction ran over the wrong axis",
        expected=f"[*, {want}]", got=list(x.shape), cause="reduce-dim",
        hint=f"reduce over dim {axis} instead: {record.op}(dim={axis}) → {shape[:axis] + shape[axis + 1:]}",
        fix=FixStep("replace-op", record.source or "", f"{record.op}(…, dim={axis})", op_site(record, dim=axis)),
        alternatives=[f"set in_features={x.shape[-1]} — only if the Linear should see dim {axis} "
                      "(it would tie the model to that size)"],
        rule=rule,
    )
