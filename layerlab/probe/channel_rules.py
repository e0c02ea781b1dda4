"""Channels-last pixels (N, H, W, C) fed to a model that reads (N, C, H, W) and checks its channel
count itself — Hugging Face's vision embeddings (``ViTPatchEmbeddings``, ``ConvNextEmbeddings`` …)
declare ``num_channels`` and raise "Make sure that the channel dimension of the pixel values match"
before their conv runs, so no torch.nn rule sees the failure.

When dim 1 is not ``num_channels`` but the last dim is, the input is NHWC, and the fix is
``permute(0, 3, 1, 2)`` — of the model's input, where the user wrote it: the outermost call that
received this very tensor (a fix deep inside would leave the layers around it reading the old
layout). A size fix (``num_channels=W``) is never offered: it would run on the image's columns.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.layout import made, move_axis, permute_code
from layerlab.probe.ops import library_class
from layerlab.probe.report import Diagnosis, FixStep


@register_rule("layout/pixels-channels-last", stage="module", on=(nn.Module,), order=300)
def channels_last(ctx) -> Optional[Diagnosis]:
    """A model's own module that checks its pixels' channels (HF vision embeddings) given NHWC pixels: permute
    at the model input."""
    m = ctx.module
    if library_class(type(m)):  # torch.nn layers have rules of their own: this reads a model's own module
        return None
    C = getattr(m, "num_channels", None)
    x = ctx.arg("pixel_values", 0)
    if "channel" not in str(ctx.exc).lower():  # the module said what it checks; any other failure is not this
        return None
    if not isinstance(C, int) or isinstance(C, bool) or not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    shape, r = list(x.shape), x.dim()
    if shape[1] == C or shape[-1] != C:
        return None
    dims = move_axis(r, r - 1, 1)
    path, key, name = ctx.passed_at(x, "pixel_values", 0)
    code = permute_code(name, dims)
    spatial = ", ".join("HWD"[i] for i in range(r - 2)) if r <= 5 else "…"
    return Diagnosis(
        f"{type(m).__name__} reads pixels as (N, C, {spatial}) with C = num_channels = {C}, got {shape}: its last dim "
        f"is {C}, so the pixels are channels-last (N, {spatial}, C)",
        expected=f"(N, {C}, …)", got=shape, cause="layout",
        hint=f"move the channels to dim 1 before the model: {code} → {[shape[i] for i in dims]}"
             + (f" (the argument of {path})" if path else ""),
        fix=FixStep("permute-input", path, code, {"arg": key, "dims": dims, "restore": None}),
        alternatives=[f"not num_channels={shape[1]}: dim 1 holds the image's rows ({shape[1]}), not its channels"],
        rule=f"{type(m).__name__}: pixel_values (N, num_channels, {spatial}); channels-last → first is permute{tuple(dims)}",
    )


@register_rule("channels/gray-pixels", stage="module", on=(nn.Module,), order=310)
def gray_pixels(ctx) -> Optional[Diagnosis]:
    """One-channel (grayscale) pixels for a model built for 3 (RGB): repeat the gray channel, as image
    processors do for pretrained weights; ``num_channels=1`` only for a model trained from scratch."""
    m = ctx.module
    if library_class(type(m)):
        return None
    C = getattr(m, "num_channels", None)
    x = ctx.arg("pixel_values", 0)
    if "channel" not in str(ctx.exc).lower() or C != 3 or not isinstance(x, torch.Tensor) or x.dim() != 4:
        return None
    shape = list(x.shape)
    if shape[1] != 1 or shape[-1] == C:
        return None
    path, key, name = ctx.passed_at(x, "pixel_values", 0)
    code = f"{name}.expand(-1, 3, -1, -1)"
    return Diagnosis(
        f"{type(m).__name__} reads RGB pixels, C = num_channels = 3, got {shape}: one channel, grayscale images",
        expected="(N, 3, H, W)", got=shape, cause="size",
        hint=f"repeat the gray channel: {code} → {[shape[0], 3, *shape[2:]]} (what image processors do for "
             "pretrained RGB weights); for a model trained from scratch on gray images, num_channels=1 in its config",
        fix=FixStep("cast-input", path, code, {"arg": key, "to": "expand:1:3"}),
        alternatives=["num_channels=1 in the config (new patch-embedding weights: from scratch only)"],
        rule=f"{type(m).__name__}: pixel_values (N, num_channels, H, W)",
    )


@register_rule("layout/video-frames-first", stage="module", on=(nn.Conv3d,), order=110)
def video_frames_first(ctx) -> Optional[Diagnosis]:
    """Conv3d fed clips as video loaders stack them, (N, T, C, H, W) — frames first, each C×H×W —
    where Conv3d reads (N, C, T, H, W). The wanted channel count on dim 2 (and only there), not on
    dim 1, is that layout; a size fix (``in_channels=T``) would convolve across the channels with
    the frames as channels, so it is only the alternative."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(m, torch.nn.Conv3d) or not isinstance(x, torch.Tensor) or x.dim() != 5:
        return None
    shape, C = list(x.shape), m.in_channels
    if shape[1] == C or shape[2] != C or C in (shape[3], shape[4]):
        return None  # several axes fit (or none): the general conv rule says what it can
    if made(ctx, x)[0] == "first":
        return None  # a conv's map: dim 1 holds channels, the depth is C by chance (the conv rule resizes)
    dims = [0, 2, 1, 3, 4]
    return Diagnosis(
        f"Conv3d expects C = in_channels = {C} input channels, got {shape[1]} (input {shape}); {C} sits on "
        f"dim 2: the input is laid out (N, T, C, H, W) — frames first, as video loaders stack them — "
        f"where Conv3d reads (N, C, T, H, W)",
        expected=C, got=shape[1], cause="layout",
        hint=f"move the channels before the frames: x.transpose(1, 2) → {[shape[d] for d in dims]}",
        fix=FixStep("permute-input", ctx.path, "x.transpose(1, 2)",
                    {"arg": ctx.key("input", 0), "dims": dims, "restore": None}),
        alternatives=[f"set in_channels={shape[1]} — only if dim 1 really holds the channels and dim 2 the depth"],
        rule=f"Conv3d: input (N, C_in = in_channels, D, H, W) — weight {list(m.weight.shape)}, groups={m.groups}",
    )
