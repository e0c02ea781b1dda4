"""Why a torch.nn layer raised, from its contract — and the fix that keeps the model's meaning.

One rule per layer family: ``rule(ctx) -> Diagnosis | None`` (``ctx`` a
:class:`~layerlab.probe.context.FailureContext`). The order inside each rule is the point:

1. **layout** — the size the layer wants sits on another axis of its input (Conv1d fed (N, L, C)
   from an Embedding, NHWC into Conv2d, BatchNorm1d on (N, L, C), LayerNorm(C) on NCHW, an LSTM
   fed conv features (N, C, L)). The fix moves that axis (``x.transpose(1, 2)``), and for layers
   that keep the layout (the norms) moves it back after. Where the wanted size sits on several
   axes and nothing tells which is meant, the cause is ``ambiguous`` and no fix is offered.
2. **rank** — a dimension is missing or extra: say which one (Conv3d given (N, C, H, W) lacks the
   depth dim; a Linear given (N, C, H, W) whose C·H·W is in_features lacks a flatten).
3. **size** — only when no axis fits: change the layer's size argument.

Shape symbols: N batch, C channels, L/S sequence lengths (query/key), E embedding, H hidden size.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn

from layerlab.probe import layout as Lay
from layerlab.probe.formula import explain_failure
from layerlab.probe.hooks import dtype_name
from layerlab.probe.report import Diagnosis, FixStep


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


def _name(ctx) -> str:
    return ctx.path or "(root)"


def _permute_fix(ctx, key, dims, restore: bool) -> FixStep:
    code = Lay.permute_code("x", dims)
    if restore:
        back = Lay.permute_code("", Lay.inverse(dims))
        code = f"{_name(ctx)}({code}){back}"
    return FixStep("permute-input", ctx.path, code,
                   {"arg": key, "dims": list(dims), "restore": Lay.inverse(dims) if restore else None})


def _made_features_last(ctx, x) -> bool:
    producer = ctx.producer(x)
    return producer is not None and producer.class_name in Lay.FEATURES_LAST


def _made_channels_first(ctx, x) -> bool:
    producer = ctx.producer(x)
    return producer is not None and producer.class_name in Lay.CHANNELS_FIRST


def _set_arg(ctx, name: str, value) -> FixStep:
    return FixStep("set-arg", ctx.path, f"{name}={value}", {"name": name, "value": value})


def _ambiguous(ctx, what: str, want: int, shape: list, axes: list, options: list) -> Diagnosis:
    return Diagnosis(
        f"{type(ctx.module).__name__} expects {what} = {want}, and {want} sits on {Lay.axis_list(axes)} "
        f"of the input {shape}: layerlab cannot tell which axis holds the features",
        expected=want, got=shape, cause="ambiguous",
        hint=options[0] + " — or " + options[1] if len(options) > 1 else options[0],
        alternatives=options[1:],
        rule=f"{type(ctx.module).__name__}: features on one axis; the other axes are batch/positions",
    )


# -- Linear -----------------------------------------------------------------------------------------
def linear(ctx) -> Optional[Diagnosis]:
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
    axes = Lay.axes_with(shape, want, skip={x.dim() - 1} | ({0} if x.dim() >= 2 else set()))
    if axes:
        axis = Lay.one_axis(axes, prefer=(1,) if _made_channels_first(ctx, x) else ())
        if axis is None:
            return _ambiguous(ctx, "last dim = in_features", want, shape, axes,
                              [f"move the feature axis last (x.movedim({axes[0]}, -1))", f"set in_features={got}"])
        dims = Lay.move_axis(x.dim(), axis, -1)
        return Diagnosis(
            f"{base}; {want} sits on dim {axis}: the features are on dim {axis}, not last "
            f"(e.g. conv features (N, C, L) where Linear reads (N, L, C))",
            expected=f"[*, {want}]", got=shape, cause="layout",
            hint=f"move the features last before {_name(ctx)}: {Lay.permute_code('x', dims)} "
                 f"→ {Lay.permuted(shape, dims)}",
            fix=_permute_fix(ctx, key, dims, restore=False),
            alternatives=[f"set in_features={got} — only if dim {x.dim() - 1} really holds the features"],
            rule=rule,
        )
    return Diagnosis(
        base, expected=f"[*, {want}]", got=shape, cause="size",
        hint=f"set in_features={got}, or reshape the input so that its last dim is {want}",
        fix=_set_arg(ctx, "in_features", got), rule=rule,
    )


# -- Conv -------------------------------------------------------------------------------------------
_SPATIAL = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}
_MISSING = {1: ("length dim L", -1), 2: ("height dim H", 2), 3: ("depth dim D", 2)}


def conv(ctx) -> Optional[Diagnosis]:
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
            return Diagnosis(
                f"{name} expects a {nd + 2}-D (N, C, {dims}) input, got {r}-D {shape}: dim 2 = {C} = in_channels, "
                f"so it looks like a stack of samples (N, T, C, {dims})",
                expected=f"{nd + 2}-D (N, C, {dims})", got=shape, cause="rank",
                hint=f"fold dims 0 and 1 into the batch: x.flatten(0, 1) → {[shape[0] * shape[1], *shape[2:]]} "
                     f"(and unflatten the output), or use Conv{nd + 1}d" if nd < 3 else "",
                fix=FixStep("reshape-input", ctx.path, "x.flatten(0, 1)", {"arg": key, "op": "flatten", "start": 0, "end": 1}),
                rule=rule,
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
    cat = _cat_fix(ctx, x, ch_axis, C)
    if cat is not None:
        return Diagnosis(
            f"{base}; the input is `{cat[0].code or cat[0].op}` at {cat[0].source}, which joins along dim "
            f"{cat[1]}: joined along dim {ch_axis} it has {C} channels",
            expected=C, got=channels, cause="cat-dim",
            hint=f"concatenate along the channel dim: {cat[0].op}(…, dim={ch_axis}) at {cat[0].source}",
            fix=cat[2], rule=rule,
        )
    axes = Lay.axes_with(shape, C, skip=set(range(ch_axis + 1)))
    if axes:
        last = r - 1
        axis = last if axes == [last] or (last in axes and _made_features_last(ctx, x)) else None
        if axis is None:
            return _ambiguous(ctx, "C = in_channels", C, shape, axes + ([ch_axis] if False else []),
                              [f"if the input is channels-last, move the channels to dim {ch_axis}: "
                               f"{Lay.permute_code('x', Lay.move_axis(r, axes[-1], ch_axis))}",
                               f"if dim {ch_axis} holds the channels, set in_channels={channels}"])
        moved = Lay.move_axis(r, axis, ch_axis)
        made = ctx.producer(x)
        source = f" ({made.label} ({made.class_name}) puts its features last)" if made is not None and \
            made.class_name in Lay.FEATURES_LAST else ""
        return Diagnosis(
            f"{base}; {C} sits on the last dim: the input is channels-last "
            f"(N, {dims}, C){source} where {name} reads (N, C, {dims})",
            expected=C, got=channels, cause="layout",
            hint=f"move the channels to dim {ch_axis} before {_name(ctx)}: {Lay.permute_code('x', moved)} "
                 f"→ {Lay.permuted(shape, moved)}",
            fix=_permute_fix(ctx, key, moved, restore=False),
            alternatives=[f"set in_channels={channels} — only if dim {ch_axis} really holds the channels"],
            rule=rule,
        )
    return Diagnosis(
        base, expected=C, got=channels, cause="size",
        hint=f"set in_channels={channels}, or make the previous layer output {C} channels",
        fix=_set_arg(ctx, "in_channels", channels), rule=rule,
    )


def _insert(shape: list, at: int, size: int) -> list:
    out = list(shape)
    out.insert(at if at >= 0 else len(out) + 1 + at, size)
    return out


def _cat_fix(ctx, x, axis: int, want: int):
    """``(op record, its dim, fix)`` when ``x`` is a ``torch.cat`` of the user's code that, joined
    along ``axis`` instead, would have ``want`` there."""
    record = ctx.producer_op(x)
    if record is None or record.op not in ("cat", "concat", "concatenate") or len(record.inputs) < 2:
        return None
    shapes = [i.shape for i in record.inputs]
    if any(len(s) != len(shapes[0]) for s in shapes):
        return None
    dim = record.args.get("1", record.args.get("dim", 0))
    if not isinstance(dim, int) or dim % len(shapes[0]) == axis:
        return None
    others = [k for k in range(len(shapes[0])) if k != axis]
    if any(s[k] != shapes[0][k] for s in shapes for k in others) or sum(s[axis] for s in shapes) != want:
        return None
    site = {"file": getattr(record, "file", None), "line": getattr(record, "line", None), "op": record.op}
    fix = FixStep("replace-op", record.source or "", f"{record.op}(…, dim={axis})", {**site, "dim": axis})
    return record, dim, fix


def formula(module, x) -> Optional[Diagnosis]:
    """The explain-shape arithmetic's verdict on this module and input shape (size-type errors)."""
    err = explain_failure(module, _shape(x))
    if err is None:
        return None
    return Diagnosis(err.message, expected=err.expected, got=err.got, hint=err.hint, rule=err.rule, cause="size")


def shape_layer(ctx) -> Optional[Diagnosis]:
    x = ctx.arg("input", 0)
    return formula(ctx.module, x) if isinstance(x, torch.Tensor) and ctx.module is not None else None


# -- norms ------------------------------------------------------------------------------------------
def _channel_norm(ctx, x, want: int, attr: str, name: str, rule: str) -> Optional[Diagnosis]:
    """BatchNorm / GroupNorm: channels on dim 1; a layout fix permutes there and back after."""
    shape, key = _shape(x), ctx.key("input", 0)
    got = shape[1]
    base = f"{name} expects C = {attr} = {want} (dim 1), got {got} (input {shape})"
    axes = Lay.axes_with(shape, want, skip={0, 1})
    if axes:
        last = x.dim() - 1
        axis = last if axes == [last] or (last in axes and _made_features_last(ctx, x)) else None
        if axis is None:
            return _ambiguous(ctx, f"C = {attr}", want, shape, axes,
                              [f"move the channels to dim 1 and back: {_name(ctx)}("
                               f"{Lay.permute_code('x', Lay.move_axis(x.dim(), axes[-1], 1))})…",
                               f"set {attr}={got}"])
        dims = Lay.move_axis(x.dim(), axis, 1)
        return Diagnosis(
            f"{base}; {want} sits on the last dim: the input is channels-last (N, …, C) where {name} "
            f"normalizes dim 1",
            expected=want, got=got, cause="layout",
            hint=f"normalize over the channel dim and keep the layout: {_permute_fix(ctx, key, dims, True).code}",
            fix=_permute_fix(ctx, key, dims, restore=True),
            alternatives=[f"set {attr}={got} — only if dim 1 really holds the channels"],
            rule=rule,
        )
    return Diagnosis(base, expected=want, got=got, cause="size", hint=f"set {attr}={got}",
                     fix=_set_arg(ctx, attr, got), rule=rule)


def batch_norm(ctx) -> Optional[Diagnosis]:
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


def group_norm(ctx) -> Optional[Diagnosis]:
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[1] == m.num_channels:
        return None
    return _channel_norm(ctx, x, m.num_channels, "num_channels", "GroupNorm", "GroupNorm: input (N, C = num_channels, *)")


def layer_norm(ctx) -> Optional[Diagnosis]:
    m, x = ctx.module, ctx.arg("input", 0)
    want = list(m.normalized_shape)
    if not isinstance(x, torch.Tensor) or _shape(x)[-len(want):] == want:
        return None
    shape, key = _shape(x), ctx.key("input", 0)
    tail = shape[-len(want):] if x.dim() >= len(want) else shape
    rule = "LayerNorm: input [*, *normalized_shape], normalizes the last len(normalized_shape) dims"
    base = (f"LayerNorm normalizes the last {len(want)} dim(s) and expects them = normalized_shape = {want}, "
            f"got {tail} (input {shape})")
    if len(want) == 1 and x.dim() >= 2:
        axes = Lay.axes_with(shape, want[0], skip={0, x.dim() - 1})
        if axes:
            axis = Lay.one_axis(axes, prefer=(1,))
            dims = Lay.move_axis(x.dim(), axis, -1)
            fix = _permute_fix(ctx, key, dims, restore=True)
            return Diagnosis(
                f"{base}; {want[0]} sits on dim {axis}: the input is channels-first (N, C, …) where LayerNorm "
                f"normalizes the last dim",
                expected=["*", *want], got=shape, cause="layout",
                hint=f"normalize over the channel dim and keep the layout: {fix.code}",
                fix=fix,
                alternatives=[f"set normalized_shape={tail[0]} — only if the last dim really holds the features",
                              "or use nn.GroupNorm(1, C) for a norm over (C, H, W)"],
                rule=rule,
            )
    value = tail if len(tail) > 1 else tail[0]
    return Diagnosis(base, expected=["*", *want], got=shape, cause="size", hint=f"set normalized_shape={value}",
                     fix=_set_arg(ctx, "normalized_shape", value), rule=rule)


# -- recurrent --------------------------------------------------------------------------------------
def rnn(ctx) -> Optional[Diagnosis]:
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    name, shape, key = type(m).__name__, _shape(x), ctx.key("input", 0)
    layout = "(N, L, input_size)" if m.batch_first else "(L, N, input_size)"
    rule = f"{name}: input {layout} (batch_first={m.batch_first})"
    if x.dim() not in (2, 3):
        return Diagnosis(
            f"{name} expects a 3-D input {layout} or a 2-D unbatched (L, input_size), got {x.dim()}-D {shape}",
            expected=layout, got=shape, cause="rank", hint="reshape the input to 3-D", rule=rule,
        )
    if x.shape[-1] != m.input_size:
        want, got = m.input_size, x.shape[-1]
        base = f"{name} expects last dim = input_size = {want}, got {got} (input {shape})"
        axes = Lay.axes_with(shape, want, skip={x.dim() - 1} | ({0} if m.batch_first and x.dim() == 3 else set()))
        if axes and x.dim() == 3:
            axis = Lay.one_axis(axes, prefer=(1,))
            conv_made = _made_channels_first(ctx, x)
            if m.batch_first and axis == 1:
                dims = [0, 2, 1]
            elif not m.batch_first and axis == 1 and conv_made:
                dims = [2, 0, 1]  # (N, C, L) → (L, N, C)
            else:
                dims = None
            if dims is not None:
                return Diagnosis(
                    f"{base}; {want} sits on dim 1: the input is (N, C, L) — channels first, as a conv "
                    f"outputs — where {name} reads {layout}",
                    expected=want, got=got, cause="layout",
                    hint=f"put the features last before {_name(ctx)}: {Lay.permute_code('x', dims)} "
                         f"→ {Lay.permuted(shape, dims)}",
                    fix=_permute_fix(ctx, key, dims, restore=False),
                    alternatives=[f"set input_size={got} — only if the last dim really holds the features"],
                    rule=rule,
                )
            return _ambiguous(ctx, "last dim = input_size", want, shape, axes,
                              [f"move the feature axis last (x.movedim({axes[0]}, -1)) and check which dim is "
                               f"the batch (batch_first={m.batch_first})", f"set input_size={got}"])
        return Diagnosis(
            base, expected=want, got=got, cause="size",
            hint=f"set input_size={got}, or project the input to {want} features",
            fix=_set_arg(ctx, "input_size", got), rule=rule,
        )
    return _rnn_hidden(m, x, ctx.arg("hx", 1))


def _rnn_hidden(m: nn.RNNBase, x: torch.Tensor, hx) -> Optional[Diagnosis]:
    if hx is None:
        return None
    name = type(m).__name__
    d = 2 if m.bidirectional else 1
    lead = [m.num_layers * d]
    if x.dim() == 3:
        lead.append(x.shape[0] if m.batch_first else x.shape[1])
    h_size = m.proj_size if getattr(m, "proj_size", 0) else m.hidden_size
    wanted = [("h0", lead + [h_size])]
    states = [hx]
    if isinstance(m, nn.LSTM):
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            return Diagnosis(
                "LSTM expects its state as a tuple (h0, c0)", expected="(h0, c0)", got=type(hx).__name__,
                hint="pass hx=(h0, c0), or nothing for zeros", rule="LSTM: hx = (h0, c0)", cause="rank",
            )
        wanted.append(("c0", lead + [m.hidden_size]))
        states = list(hx)
    for (label, want), state in zip(wanted, states):
        if isinstance(state, torch.Tensor) and _shape(state) != want:
            got = _shape(state)
            swap = "" if sorted(got) != sorted(want) else (
                " — it looks like batch-first; use h0.transpose(0, 1).contiguous()"
            )
            return Diagnosis(
                f"{name} expects {label} of shape [num_layers·D, N, H] = {want}, got {got}"
                + (" (the batch is dim 1 even with batch_first=True)" if m.batch_first else ""),
                expected=want, got=got, cause="layout" if swap else "size",
                hint=f"build {label} as torch.zeros({', '.join(map(str, want))}){swap}",
                rule=f"{name}: {label} [num_layers·D, N, H], D = {d}, H = {want[-1]}; batch_first never applies to states",
            )
    return None


# -- embedding --------------------------------------------------------------------------------------
def embedding(ctx) -> Optional[Diagnosis]:
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    rule = "Embedding: ids (*) integer in [0, num_embeddings) → (*, embedding_dim)"
    if x.is_floating_point() or x.dtype == torch.bool:
        integral = x.numel() > 0 and bool(torch.all(x == torch.round(x.float()))) if x.is_floating_point() else True
        if integral:
            return Diagnosis(
                f"Embedding expects integer ids (int64 or int32), got {dtype_name(x.dtype)} holding whole numbers",
                expected="int64", got=dtype_name(x.dtype), cause="dtype",
                hint="pass the ids as integers: x.long() (in a spec: dtype: int64 with low/high)",
                fix=FixStep("cast-input", ctx.path, "x.long()", {"arg": ctx.key("input", 0), "to": "long"}),
                rule=rule,
            )
        return Diagnosis(
            f"Embedding expects integer ids, got {dtype_name(x.dtype)} values that are not whole numbers "
            f"(input {_shape(x)}): these look like features, not token ids",
            expected="int64 ids", got=dtype_name(x.dtype), cause="dtype",
            hint="an Embedding looks ids up; to map real-valued features use nn.Linear(in_features, "
                 f"{m.embedding_dim}) instead, or feed the ids rather than their vectors",
            rule=rule,
        )
    if x.numel() == 0:
        return None
    lo, hi = int(x.min()), int(x.max())
    n = m.num_embeddings
    if lo >= 0 and hi < n:
        return None
    bad = hi if hi >= n else lo
    return Diagnosis(
        f"Embedding index {bad} out of range: num_embeddings = {n} allows ids 0..{n - 1}; "
        f"the input's ids span {lo}..{hi}",
        expected=f"0 ≤ id < {n}", got=bad, cause="index-range",
        hint=(f"set num_embeddings={hi + 1} (or larger) if the vocabulary really has {hi + 1} ids, or remap the ids"
              if bad >= n else "negative ids are never valid: remap them (padding ids must be ≥ 0)"),
        fix=_set_arg(ctx, "num_embeddings", hi + 1) if bad >= n else None,
        rule=rule,
    )
