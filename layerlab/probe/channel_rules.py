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

from layerlab.probe.hooks import forward_arg_names
from layerlab.probe.layout import move_axis, permute_code
from layerlab.probe.report import Diagnosis, FixStep


def _where_passed(ctx, x: torch.Tensor):
    """``(path, key, name)`` of the outermost call that received ``x`` itself as an argument."""
    for path, args, kwargs in ctx.outer:
        names = ()
        try:
            module = ctx.recorder.root.get_submodule(path) if path else ctx.recorder.root
            names = forward_arg_names(type(module))
        except Exception:
            pass
        for i, a in enumerate(args):
            if a is x:
                return path, i, names[i] if i < len(names) else "x"
        for k, a in kwargs.items():
            if a is x:
                return path, k, k
    return ctx.path, ctx.key("pixel_values", 0), "pixel_values"


def channels_last(ctx) -> Optional[Diagnosis]:
    m = ctx.module
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
    path, key, name = _where_passed(ctx, x)
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
