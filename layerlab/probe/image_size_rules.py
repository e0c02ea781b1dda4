"""A Linear after a conv stack, sized for another image size (a VAE or CNN head built for 28×28, fed 32×32).

The Linear's ``in_features`` is ``C·h·w`` of the map the stack made for the image size the model was
written for; an image of another size makes another map. "set in_features=4096" makes that one layer
run, but everything else derived from the same size (a decoder's ``Linear(z, 64·7·7)`` and
``Unflatten(64, 7, 7)``, a reconstruction loss against the input) still assumes 28×28. When the
numbers say so — ``in_features = C·s²`` for the flattened map's ``C``, the model input is a whole
multiple of the map, and another layer is sized from the same map (a decoder's Linear to ``C·s²`` or
Unflatten to ``(C, s, s)``) — the report names the image size the model was built for, and offers no
resize of the one layer. A classifier head alone keeps its verified ``in_features`` fix.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis


@register_rule("size/built-for-other-image-size", stage="refine", order=20)
def built_for_other_size(ctx) -> Optional[Diagnosis]:
    """A Linear after a conv stack sized for another image size: feed that size, or rebuild the model for this
    one."""
    found = ctx.found
    fix = found.fix
    if fix is None or fix.kind != "set-arg" or fix.params.get("name") != "in_features":
        return None
    if not isinstance(ctx.module, torch.nn.Linear):
        return None
    x = ctx.arg("input", 0)
    call = ctx.producer(x) if isinstance(x, torch.Tensor) and x.dim() == 2 else None
    if call is None or call.class_name != "Flatten" or not call.inputs or len(call.inputs[0].shape or []) != 4:
        return None
    _, C, H, W = call.inputs[0].shape
    want = ctx.module.in_features
    side = math.isqrt(want // C) if want % C == 0 else 0
    image = _model_image(ctx)
    if H != W or side < 1 or side * side * C != want or side == H or image is None or image % H:
        return None
    if not _also_sized(ctx.recorder.root, want, (C, side, side)):
        return None  # this Linear alone holds the size: resizing it is the fix (its verification says so)
    built = side * (image // H)
    found.message += (f"; {want} = {C}·{side}·{side}: a {side}×{side} map, which the layers before it make from a "
                      f"{built}×{built} input, but the input is {image}×{image} ({H}×{H} maps): the model was built "
                      f"for {built}×{built} images")
    found.cause = "input-size"
    found.hint = (f"feed {built}×{built} images (resize or crop them), or build the model for {image}×{image}: "
                  f"in_features={C * H * W} here and every other size derived from {side}×{side} (a decoder's "
                  f"Linear/Unflatten)")
    found.alternatives = [f"in_features={C * H * W} alone makes this layer run; the rest of the model still "
                          f"assumes {built}×{built}"] + list(found.alternatives)
    found.fix = None
    return found


def _also_sized(root, want: int, map_shape: tuple) -> bool:
    """Whether another layer of the model is sized from the same map: a Linear that outputs ``want``
    features or an Unflatten back to ``map_shape`` (a decoder)."""
    for module in root.modules():
        if isinstance(module, torch.nn.Linear) and module.out_features == want:
            return True
        if isinstance(module, torch.nn.Unflatten) and tuple(module.unflattened_size) == map_shape:
            return True
    return False


def _model_image(ctx) -> Optional[int]:
    """The side of the square image the model was given (its first 4-D input)."""
    for _, args, kwargs in ctx.outer[:1]:
        for value in [*args, *kwargs.values()]:
            if isinstance(value, torch.Tensor) and value.dim() == 4 and value.shape[2] == value.shape[3]:
                return int(value.shape[2])
    return None
