"""Why a torch.nn layer raised, from its contract — and the fix that keeps the model's meaning.

One rule per layer family: ``rule(ctx) -> Diagnosis | None`` (``ctx`` a
:class:`~layerlab.probe.context.FailureContext`). The order inside each rule is the point:

1. **provenance** — the module that made the input settles its layout (:func:`_made`): an
   Embedding's, a Linear's or an LSTM's output has its features last, a conv's on dim 1. A conv
   fed an Embedding's output is a layout error whatever the sizes; a Linear fed another Linear's
   output is a size error even when the size it wants happens to sit on the time axis (moving that
   axis would run and compute garbage).
2. **layout** — for inputs of unknown provenance (a model input, an op that moved axes): the size
   the layer wants sits on exactly one other axis (NHWC into Conv2d). The fix moves that axis
   (``x.transpose(1, 2)``), and for layers that keep the layout (the norms) moves it back after.
   Where the size sits on several axes, the cause is ``ambiguous`` and no fix is offered.
3. **rank** — a dimension is missing or extra: say which one (Conv3d given (N, C, H, W) lacks the
   depth dim; a Linear given (N, C, H, W) whose C·H·W is in_features lacks a flatten).
4. **size** — only when no axis fits: change the layer's size argument.

Shape symbols: N batch, C channels, L/S sequence lengths (query/key), E embedding, H hidden size.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import groups_rules, layout as Lay, upstream_rules
from layerlab.probe.formula import explain_failure
from layerlab.probe.report import Diagnosis, FixStep


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


def _name(ctx) -> str:
    return ctx.path or "(root)"


def _set_arg(ctx, name: str, value) -> FixStep:
    return FixStep("set-arg", ctx.path, f"{name}={value}", {"name": name, "value": value})


def _layout(ctx, message: str, dims, rule: str, expected, got, what: str, alternatives=(), restore=False) -> Diagnosis:
    """Move the input's axes by ``dims`` (and back after, for layers that keep the layout)."""
    fix = Lay.permute_fix(ctx, ctx.key("input", 0), dims, restore)
    hint = (f"{what} and keep the layout: {fix.code}" if restore else
            f"{what} before {_name(ctx)}: {fix.code} → {Lay.permuted(_shape(ctx.arg('input', 0)), dims)}")
    return Diagnosis(message, expected=expected, got=got, cause="layout", hint=hint, fix=fix,
                     alternatives=list(alternatives), rule=rule)


def _size(ctx, base: str, side, made: str, attr: str, value, rule: str, expected, got, hint=None) -> Diagnosis:
    """Change the layer's size argument; when the producer settles the layout, say so."""
    puts = "its features last" if side == "last" else "its channels on dim 1"
    because = f"; {made} puts {puts}, so the layout is right and {attr} is not" if side else ""
    return Diagnosis(base + because, expected=expected, got=got, cause="size", hint=hint or f"set {attr}={value}",
                     fix=_set_arg(ctx, attr, value), rule=rule)


# -- Linear -----------------------------------------------------------------------------------------
@register_rule("linear/in-features", stage="module", on=(nn.Linear,), order=100)
def linear(ctx) -> Optional[Diagnosis]:
    """nn.Linear whose input's last dim is not ``in_features``: flatten, layout (move the features last) or
    size."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] == m.in_features:
        return None
    want, got, shape, key = m.in_features, x.shape[-1], _shape(x), ctx.key("input", 0)
    rule = "Linear: input [*, in_features] → output [*, out_features]"
    base = f"Linear expects last dim = in_features = {want}, got {got} (input {shape})"
    for start in range(1 if x.dim() >= 2 else 0, x.dim() - 1):
        if math.prod(shape[start:]) == want:
            tail = " · ".join(map(str, shape[start:]))
            return Diagnosis(
                f"{base}; dims {start}… multiply to {tail} = {want}: the input was not flattened",
                expected=f"[*, {want}]", got=shape, cause="rank",
                hint=f"flatten before {_name(ctx)}: x.flatten({start}) (or nn.Flatten({start}))",
                fix=FixStep("reshape-input", ctx.path, f"x.flatten({start})", {"arg": key, "op": "flatten", "start": start}),
                rule=rule,
            )
    folded = Lay.batch_folded(ctx, x, want, base, rule)  # a size fix would run with the wrong rows
    if folded is not None:
        return folded
    reduced = upstream_rules.reduced_wrong_axis(ctx, x, want, base, rule)  # in_features=L would run, wrongly
    if reduced is not None:
        return reduced
    side, made = Lay.made(ctx, x)
    if side == "first":
        return _linear_on_channels_first(ctx, x, base, made, rule)
    axes = [] if side == "last" else Lay.axes_with(shape, want, skip={x.dim() - 1} | ({0} if x.dim() >= 2 else set()))
    if axes:
        axis = Lay.one_axis(axes)
        if axis is None:
            return Lay.ambiguous(ctx, "last dim = in_features", want, shape, axes,
                                 [f"move the feature axis last (x.movedim({axes[0]}, -1))", f"set in_features={got}"])
        moved = _moved_on_purpose(ctx, x)
        if moved is not None:  # moving the axis back would undo the user's own transpose
            return Diagnosis(
                f"{base}; {want} sits on dim {axis}, where {moved} put it just before: moving it back last "
                "would undo that transpose, so layerlab cannot tell which of the two is wrong",
                expected=f"[*, {want}]", got=shape, cause="ambiguous",
                hint=f"if the transpose is meant (mixing along the other axis, as an MLP-Mixer's token mixing "
                     f"does), size {_name(ctx)} for that axis: in_features={got} (and out_features to match what "
                     f"follows); otherwise remove the transpose",
                alternatives=[f"in_features={got}", "remove the transpose"], rule=rule)
        return _layout(ctx, f"{base}; {want} sits on dim {axis}: the features are on dim {axis}, not last",
                       Lay.move_axis(x.dim(), axis, -1), rule, f"[*, {want}]", shape, "move the features last",
                       [f"set in_features={got} — only if dim {x.dim() - 1} really holds the features"])
    return _size(ctx, base, side, made, "in_features", got, rule, f"[*, {want}]", shape,
                 hint=f"set in_features={got}, or reshape the input so that its last dim is {want}")


def _moved_on_purpose(ctx, x) -> Optional[str]:
    """``"x.transpose(1, 2) at model.py:34"`` when ``x`` comes straight from a transpose in the user's
    code: the axis a layout fix would move last is the one that transpose just moved away."""
    record = ctx.producer_op(x)
    if record is None or record.op not in (*Lay.AXIS_MOVES, "mT", "T"):
        return None
    return record.label


def _linear_on_channels_first(ctx, x, base: str, made: str, rule: str) -> Diagnosis:
    """A Linear fed (N, C, *positions) from a conv: its last dim is a position axis, never features."""
    shape, want, C = _shape(x), ctx.module.in_features, x.shape[1]
    if x.dim() == 3 and C == want:
        return _layout(ctx, f"{base}; {made} puts its channels on dim 1: the input is (N, C, L) where Linear reads "
                       "(N, L, C)", [0, 2, 1], rule, f"[*, {want}]", shape, "move the channels last",
                       [f"set in_features={shape[-1]} — only if the Linear should mix the positions of each channel",
                        f"x.mean(-1) before it — if it classifies the whole sequence: the transpose gives one output "
                        f"per position ({shape[-1]} of them)"])
    positions, size = tuple(range(2, x.dim())), f"in_features={C}" + (" (as set)" if C == want else "")
    options = [f"pool the positions away (x.mean(dim={positions if len(positions) > 1 else 2})) with {size}",
               f"flatten them (x.flatten(1)) with in_features={math.prod(shape[1:])}",
               f"or apply it at every position (x.movedim(1, -1)) with {size}"]
    return Diagnosis(
        f"{base}; {made} puts its channels on dim 1, so the last dim ({shape[-1]}) is a position axis, not "
        "features: which fix is right depends on what the Linear should see",
        expected=f"[*, {want}]", got=shape, cause="ambiguous", hint=f"{options[0]}, or {options[1]}",
        alternatives=options[2:], rule=rule,
    )


# -- Conv -------------------------------------------------------------------------------------------
_SPATIAL = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}
_MISSING = {1: ("length dim L", -1), 2: ("height dim H", 2), 3: ("depth dim D", 2)}


@register_rule("conv/in-channels", stage="module", on=(nn.modules.conv._ConvNd,), order=120)
def conv(ctx) -> Optional[Diagnosis]:
    """A conv whose input's rank or channels do not fit: a missing dim, channels-last layout, a cat axis, or
    the size."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    nd, C, name = len(m.kernel_size), m.in_channels, type(m).__name__
    dims = ", ".join(_SPATIAL[nd])
    shape, r, key = _shape(x), x.dim(), ctx.key("input", 0)
    rule = f"{name}: input (N, C_in = in_channels, {dims}) — weight {_shape(m.weight)}, groups={m.groups}"
    if r == nd + 1 and shape[0] != C:  # read as unbatched (C, *spatial)
        if shape[1] == C:
            what, at = _MISSING[nd]
            other = f"nn.Conv{nd - 1}d" if nd > 1 else "nn.Linear"
            return Diagnosis(
                f"{name} got a {r}-D input {shape}, which torch reads as one unbatched sample (C, {dims}) "
                f"with C = {shape[0]}; its dim 1 = {C} = in_channels, so it looks like (N, C, …) lacking the {what}",
                expected=f"{nd + 2}-D (N, C, {dims})", got=shape, cause="rank",
                hint=f"add the missing dim: x.unsqueeze({at}) → {_insert(shape, at, 1)}",
                fix=FixStep("reshape-input", ctx.path, f"x.unsqueeze({at})", {"arg": key, "op": "unsqueeze", "dim": at}),
                alternatives=[f"use {other} if the data has no {what.split()[0]} dim"],
                rule=rule,
            )
        if C == 1:
            return Diagnosis(
                f"{name} got a {r}-D input {shape}: torch reads it as one sample with C = {shape[0]} channels; "
                f"in_channels = 1, so it looks like (N, {dims}) lacking the channel dim",
                expected=f"{nd + 2}-D (N, 1, {dims})", got=shape, cause="rank",
                hint=f"add the channel dim: x.unsqueeze(1) → {_insert(shape, 1, 1)}",
                fix=FixStep("reshape-input", ctx.path, "x.unsqueeze(1)", {"arg": key, "op": "unsqueeze", "dim": 1}),
                rule=rule,
            )
    if r not in (nd + 1, nd + 2):
        if r == nd + 3 and shape[2] == C:
            # Folding T into the batch is the fix only when this layer is the whole model: the caller
            # then unfolds its output. Inside a model, the layers after it would run on N·T rows and
            # the model would return N·T results for N samples: no mechanical fix there.
            fold = FixStep("reshape-input", ctx.path, "x.flatten(0, 1)", {"arg": key, "op": "flatten", "start": 0, "end": 1})
            return Diagnosis(
                f"{name} expects a {nd + 2}-D (N, C, {dims}) input, got {r}-D {shape}: dim 2 = {C} = in_channels, "
                f"so it looks like a stack of samples (N, T, C, {dims})",
                expected=f"{nd + 2}-D (N, C, {dims})", got=shape, cause="rank",
                hint=f"fold dims 0 and 1 into the batch: x.flatten(0, 1) → {[shape[0] * shape[1], *shape[2:]]}, "
                     f"then unfold the result (y.unflatten(0, ({shape[0]}, {shape[1]}))) and reduce over T if meant"
                     + (f"; or use Conv{nd + 1}d on (N, C, T, {dims})" if nd < 3 else ""),
                fix=fold if not ctx.path else None, rule=rule,
            )
        return Diagnosis(
            f"{name} expects a {nd + 1}-D (C, {dims}) or {nd + 2}-D (N, C, {dims}) input, got {r}-D {shape}",
            expected=f"{nd + 2}-D (N, C, {dims})", got=shape, cause="rank",
            hint="add or remove a dimension (x.unsqueeze(0) for a single sample; check a Flatten or view before it)",
            rule=rule,
        )
    ch_axis = 1 if r == nd + 2 else 0
    channels = shape[ch_axis]
    if channels == C:
        return formula(ctx.module, x)
    base = f"{name} expects C = in_channels = {C} input channels, got {channels} (input {shape})"
    cat = Lay.cat_fix(ctx, x, ch_axis, C)
    if cat is not None:
        return Diagnosis(
            f"{base}; the input is `{cat[0].code or cat[0].op}` at {cat[0].source}, which joins along dim "
            f"{cat[1]}: joined along dim {ch_axis} it has {C} channels",
            expected=C, got=channels, cause="cat-dim",
            hint=f"concatenate along the channel dim: {cat[0].op}(…, dim={ch_axis}) at {cat[0].source}",
            fix=cat[2], rule=rule,
        )
    redo = Lay.permute_redo(ctx, x, ch_axis, C, base, rule)  # (0, 2, 3, 1) where NHWC needed (0, 3, 1, 2)
    if redo is not None:
        return redo
    side, made = Lay.made(ctx, x)
    last = r - 1
    axes = Lay.axes_with(shape, C, skip=set(range(ch_axis + 1)))
    if side == "last" or (side is None and axes == [last]):
        source = f" ({made} puts its features last)" if side else ""
        return _layout(ctx, f"{base}; {f'{C} sits on the last dim: the' if shape[last] == C else 'the'} input is "
                       f"channels-last (N, {dims}, C){source} where {name} reads (N, C, {dims})"
                       + Lay.then_size(shape[last], C, "in_channels"), Lay.move_axis(r, last, ch_axis), rule, C,
                       channels, f"move the channels to dim {ch_axis}",
                       [] if side else [f"set in_channels={channels} — only if dim {ch_axis} really holds the channels"])
    if side is None and axes:
        return Lay.ambiguous(ctx, "C = in_channels", C, shape, axes,
                             [f"if the input is channels-last, move the channels to dim {ch_axis}: "
                              f"{Lay.permute_code('x', Lay.move_axis(r, axes[-1], ch_axis))}",
                              f"if dim {ch_axis} holds the channels, set in_channels={channels}"])
    if m.groups == C > 1 and m.out_channels % C == 0:
        return groups_rules.depthwise(ctx, base, channels, rule)
    return _size(ctx, base, side, made, "in_channels", channels, rule, C, channels,
                 hint=f"set in_channels={channels}, or make the previous layer output {C} channels")



def _insert(shape: list, at: int, size: int) -> list:
    out = list(shape)
    out.insert(at if at >= 0 else len(out) + 1 + at, size)
    return out


def formula(module, x) -> Optional[Diagnosis]:
    """The explain-shape arithmetic's verdict on this module and input shape (size-type errors)."""
    err = explain_failure(module, _shape(x))
    if err is None:
        return None
    return Diagnosis(err.message, expected=err.expected, got=err.got, hint=err.hint, rule=err.rule, cause="size")


@register_rule("shape/layer-arithmetic", stage="module", on=(nn.Module,), order=900)
def shape_layer(ctx) -> Optional[Diagnosis]:
    """explain-shape's arithmetic for conv/pool-type layers: the size that raised (kernel larger than the
    padded input …)."""
    x = ctx.arg("input", 0)
    return formula(ctx.module, x) if isinstance(x, torch.Tensor) and ctx.module is not None else None


# -- norms ------------------------------------------------------------------------------------------
def _channel_norm(ctx, x, want: int, attr: str, name: str, rule: str) -> Optional[Diagnosis]:
    """BatchNorm / GroupNorm: channels on dim 1; a layout fix permutes there and back after."""
    shape, got, last = _shape(x), x.shape[1], x.dim() - 1
    base = f"{name} expects C = {attr} = {want} (dim 1), got {got} (input {shape})"
    side, made = Lay.made(ctx, x)
    axes = Lay.axes_with(shape, want, skip={0, 1})
    if side == "last" or (side is None and axes == [last]):
        source = f" ({made} puts its features last)" if side else ""
        return _layout(ctx, f"{base}; the input is channels-last (N, …, C){source} where {name} normalizes dim 1"
                       + Lay.then_size(shape[last], want, attr), Lay.move_axis(x.dim(), last, 1), rule, want, got,
                       "normalize over the channel dim",
                       [] if side else [f"set {attr}={got} — only if dim 1 really holds the channels"], restore=True)
    if side is None and axes:
        return Lay.ambiguous(ctx, f"C = {attr}", want, shape, axes,
                             [f"move the channels to dim 1 and back: {_name(ctx)}("
                              f"{Lay.permute_code('x', Lay.move_axis(x.dim(), axes[-1], 1))})…", f"set {attr}={got}"])
    return _size(ctx, base, side, made, attr, got, rule, want, got)


@register_rule("norm/batch-norm-features", stage="module", on=(nn.modules.batchnorm._BatchNorm,), order=190)
def batch_norm(ctx) -> Optional[Diagnosis]:
    """BatchNorm whose ``num_features`` is not the input's dim 1: rank, layout or size."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    name = type(m).__name__
    dims = {"BatchNorm1d": (2, 3), "BatchNorm2d": (4,), "BatchNorm3d": (5,)}.get(name)
    if dims and x.dim() not in dims:
        return Diagnosis(
            f"{name} expects a {' or '.join(f'{d}-D' for d in dims)} input, got {x.dim()}-D {_shape(x)}",
            expected=" or ".join(f"{d}-D" for d in dims), got=_shape(x), cause="rank",
            hint="BatchNorm1d for (N, C) or (N, C, L), BatchNorm2d for (N, C, H, W), BatchNorm3d for (N, C, D, H, W)",
            rule=f"{name}: input (N, C = num_features, *)",
        )
    if x.dim() >= 2 and x.shape[1] != m.num_features:
        return _channel_norm(ctx, x, m.num_features, "num_features", name, f"{name}: input (N, C = num_features, *)")
    per_channel = x.numel() // max(x.shape[1], 1) if x.dim() >= 2 else x.numel()
    if m.training and per_channel <= 1:
        return Diagnosis(
            f"{name} in training mode needs more than 1 value per channel to compute batch statistics, "
            f"got input {_shape(x)}",
            expected="N·(spatial) > 1", got=_shape(x), cause="size",
            hint="use a batch of 2 or more, or run in eval mode (--mode eval)",
            rule="BatchNorm (train): statistics over N and the spatial dims",
        )
    return None


@register_rule("norm/group-norm-channels", stage="module", on=(nn.GroupNorm,), order=200)
def group_norm(ctx) -> Optional[Diagnosis]:
    """nn.GroupNorm whose ``num_channels`` is not the input's dim 1, or whose groups do not divide them."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[1] == m.num_channels:
        return None
    found = _channel_norm(ctx, x, m.num_channels, "num_channels", "GroupNorm", "GroupNorm: input (N, C = num_channels, *)")
    return groups_rules.group_norm_groups(ctx, found) or found


@register_rule("norm/layer-norm-shape", stage="module", on=(nn.LayerNorm,), order=180)
def layer_norm(ctx) -> Optional[Diagnosis]:
    """nn.LayerNorm whose ``normalized_shape`` is not the input's trailing dims: layout or size."""
    m, x = ctx.module, ctx.arg("input", 0)
    want = list(m.normalized_shape)
    if not isinstance(x, torch.Tensor) or _shape(x)[-len(want):] == want:
        return None
    shape = _shape(x)
    tail = shape[-len(want):] if x.dim() >= len(want) else shape
    rule = "LayerNorm: input [*, *normalized_shape], normalizes the last len(normalized_shape) dims"
    base = (f"LayerNorm normalizes the last {len(want)} dim(s) and expects them = normalized_shape = {want}, "
            f"got {tail} (input {shape})")
    side, made = Lay.made(ctx, x) if x.dim() >= 2 else (None, "")
    if len(want) == 1 and x.dim() >= 2 and side != "last":
        axes = [1] if side == "first" else Lay.axes_with(shape, want[0], skip={0, x.dim() - 1})
        axis = Lay.one_axis(axes, prefer=(1,))
        if axes and axis is None:
            return Lay.ambiguous(ctx, "normalized_shape", want[0], shape, axes,
                                 [f"normalize dim {axes[0]}: {_name(ctx)}(x.movedim({axes[0]}, -1)).movedim(-1, {axes[0]})",
                                  f"set normalized_shape={tail[0]}"])
        if axis is not None:
            source = f" ({made} puts its channels on dim 1)" if side else ""
            caveat = [] if side else [f"set normalized_shape={tail[0]} — only if the last dim really holds the features"]
            return _layout(ctx, f"{base}; the input is channels-first (N, C, …){source} where LayerNorm normalizes the "
                           "last dim" + Lay.then_size(shape[axis], want[0], "normalized_shape"),
                           Lay.move_axis(x.dim(), axis, -1), rule, ["*", *want], shape, "normalize over the channel dim",
                           caveat + [f"or normalized_shape={shape[axis:]} (nn.GroupNorm(1, C) without the image size) for one "
                                    "norm over each sample's (C, H, W)"], restore=True)
    return _size(ctx, base, side, made, "normalized_shape", tail if len(tail) > 1 else tail[0], rule, ["*", *want], shape)


# -- recurrent --------------------------------------------------------------------------------------
@register_rule("rnn/input-size", stage="module", on=(nn.RNNBase,), order=140)
def rnn(ctx) -> Optional[Diagnosis]:
    """An RNN whose input's rank, layout or ``input_size`` does not fit (and its hidden state's shape)."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    name, shape = type(m).__name__, _shape(x)
    layout = "(N, L, input_size)" if m.batch_first else "(L, N, input_size)"
    rule = f"{name}: input {layout} (batch_first={m.batch_first})"
    if x.dim() not in (2, 3):
        return Diagnosis(
            f"{name} expects a 3-D input {layout} or a 2-D unbatched (L, input_size), got {x.dim()}-D {shape}",
            expected=layout, got=shape, cause="rank", hint="reshape the input to 3-D", rule=rule,
        )
    if x.shape[-1] == m.input_size:  # the input fits: its state is the rule rnn/initial-state's (it ran before)
        return None
    want, got = m.input_size, x.shape[-1]
    base = f"{name} expects last dim = input_size = {want}, got {got} (input {shape})"
    side, made = Lay.made(ctx, x)
    axes = Lay.axes_with(shape, want, skip={x.dim() - 1} | ({0} if m.batch_first and x.dim() == 3 else set()))
    if side == "first" or (side is None and axes and x.dim() == 3):
        axis = 1 if side == "first" else Lay.one_axis(axes, prefer=(1,))
        dims = None
        if axis == 1:  # (N, C, L) → (N, L, C), or (L, N, C) only when a conv made it (N first)
            dims = [0, 2, 1] if m.batch_first else ([2, 0, 1] if side == "first" else None)
        if dims is None:
            return Lay.ambiguous(ctx, "last dim = input_size", want, shape, axes,
                                 [f"move the feature axis last (x.movedim({axes[0]}, -1)) and check which dim is "
                                  f"the batch (batch_first={m.batch_first})", f"set input_size={got}"])
        source = f" ({made} puts its channels on dim 1)" if side else ""
        return _layout(ctx, f"{base}; the input is (N, C, L) — channels first{source} — where {name} reads {layout}"
                       + Lay.then_size(shape[1], want, "input_size"), dims, rule, want, got, "put the features last",
                       [] if side else [f"set input_size={got} — only if the last dim really holds the features"])
    return _size(ctx, base, side, made, "input_size", got, rule, want, got,
                 hint=f"set input_size={got}, or project the input to {want} features")
