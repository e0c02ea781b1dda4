"""A conv2d fed a flat ``(N, C·H·W)`` image: a generator's Linear output, or a Flatten too early.

Legend: N batch, C ``in_channels``, H = W the side of a square map.

``nn.Conv2d`` wants ``(N, C, H, W)``; a GAN generator ending in ``nn.Linear(…, C·H·W)`` returns
``(N, C·H·W)``. When the flat size is ``in_channels`` times a square, ``x.view(-1, C, H, H)`` is the
fix, verified on a copy. ``x.unsqueeze(0)`` would also run when C = 1 (the batch read as the image
height) and is not offered. A flat size that is not C times a square gets no fix: which H×W the
numbers are is not known, and the report says so. Nor does a flat tensor that is the model's own
input: data comes with its layout fixed (a numpy image is H·W·C, a mel patch 4 × 16 is no square),
and the square channels-first view would run on scrambled pixels. Only a layer's output (a
generator's Linear, whose layout is whatever the view says it is) gets the view.
"""

from __future__ import annotations

import math
from typing import Optional

import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis, FixStep


def _model_input(ctx, x) -> bool:
    """Whether ``x`` is one of the model's own inputs (data), not a layer's output."""
    if not ctx.outer:
        return True
    _, args, kwargs = ctx.outer[0]
    return any(a is x for a in (*args, *kwargs.values()))


@register_rule("layout/flat-image", stage="refine", order=80)
def flat_image(ctx) -> Optional[Diagnosis]:
    """A conv2d fed a flat (N, C·H·W) image: ``x.view(-1, C, H, H)`` when the flat size is C times a square."""
    found = ctx.found
    module = ctx.module
    if found.cause != "rank" or type(module) is not nn.Conv2d:
        return None
    x = ctx.arg("input", 0)
    if x is None or x.dim() != 2:
        return None
    n, flat = x.shape
    c = module.in_channels
    key = ctx.locate(x)
    base = f"Conv2d got a 2-D input {list(x.shape)}: (N, C·H·W) = ({n}, {flat}), a flat image"
    side = math.isqrt(flat // c) if flat % c == 0 else 0
    if side and side * side * c == flat and key is not None and _model_input(ctx, x):
        return Diagnosis(
            base + f" given to the model as it is; {flat} = {c} × {side} × {side} fits a square channels-first map, "
            f"but the data's own layout is not known (channels last, or a map that is not square, fit too)",
            expected=f"4-D (N, {c}, H, W)", got=list(x.shape), cause="rank",
            hint=f"reshape it as the data is laid out: x.view(-1, {c}, H, W) for C·H·W"
                 + (f", or x.view(-1, H, W, {c}).permute(0, 3, 1, 2) for H·W·C" if c > 1 else "")
                 + f"; H·W = {flat // c}",
            rule=found.rule,
        )
    if side == 0 or side * side * c != flat or key is None:
        return Diagnosis(
            base + f" that is not in_channels = {c} times a square map: layerlab cannot tell its H × W",
            expected=f"4-D (N, {c}, H, W)", got=list(x.shape), cause="rank",
            hint=f"reshape it to the image it holds: x.view(-1, {c}, H, W) with H·W = {flat / c:g}",
            rule=found.rule,
        )
    code = f"x.view(-1, {c}, {side}, {side})"
    return Diagnosis(
        base + f"; {flat} = {c} × {side} × {side}: in_channels = {c} channels of a {side}×{side} map",
        expected=f"4-D (N, {c}, H, W)", got=list(x.shape), cause="rank",
        hint=f"reshape it to the image: {code} → [{n}, {c}, {side}, {side}]",
        fix=FixStep("cast-input", ctx.path, code, {"arg": key, "to": f"shape:-1,{c},{side},{side}"}),
        alternatives=["not x.unsqueeze(0): with one channel it runs, reading the batch as the image's height"],
        rule=found.rule,
    )
