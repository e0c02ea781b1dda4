"""A Linear after ``nn.Unfold`` + ``transpose(1, 2)`` sized for the wrong patch vector.

``nn.Unfold(kernel_size=p, stride=p)`` gives (B, C·p·p, L); the ViT-style ``transpose(1, 2)`` puts
each patch's C·p·p values last, where a patch projection reads them. When the Linear's
``in_features`` then equals L (p·p = L, e.g. 8×8 patches of a 64×64 image, with the channels
forgotten), the Linear rule cannot tell the transpose from the layer's size. The Unfold says which:
the last dim is exactly C·∏kernel, the patch vector, so ``in_features`` is the fix.
"""

from __future__ import annotations

import math
from typing import Optional

import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis, FixStep


def _unfold_patch_size(ctx, record) -> Optional[int]:
    """C·∏kernel of the nn.Unfold whose output the transpose ``record`` moved."""
    if not record.inputs:
        return None
    call = ctx.call(record.inputs[0].from_call)
    if call is None or record.inputs[0].from_op is not None:
        return None
    module = ctx.recorder.modules[call.index]
    if not isinstance(module, nn.Unfold) or not call.tensor_inputs:
        return None
    k = module.kernel_size
    kernel = math.prod(k) if isinstance(k, (tuple, list)) else k * k
    return call.tensor_inputs[0].shape[1] * kernel


@register_rule("layout/unfold-patch-features", stage="refine", order=60)
def unfold_features(ctx) -> Optional[Diagnosis]:
    """A Linear after ``nn.Unfold`` + ``transpose(1, 2)`` sized for the wrong patch vector: ``in_features`` =
    C·∏kernel."""
    found = ctx.found
    if found.cause != "ambiguous" or not isinstance(ctx.module, nn.Linear):
        return None
    x = ctx.arg("input", 0)
    record = ctx.producer_op(x)
    if record is None or record.op not in ("transpose", "swapaxes") or x.dim() != 3:
        return None
    patch = _unfold_patch_size(ctx, record)
    if patch is None or x.shape[-1] != patch:
        return None
    got = x.shape[-1]
    return Diagnosis(
        f"Linear expects last dim = in_features = {ctx.module.in_features}, got {got} (input {list(x.shape)}); "
        f"the input is nn.Unfold's (B, C·k·k, L) moved by the {record.label} to (B, L, C·k·k): its last dim "
        f"{got} is the patch vector (channels × kernel), so the layer's size is wrong, not the transpose",
        expected=f"[*, {ctx.module.in_features}]", got=list(x.shape), cause="size",
        hint=f"set in_features={got} (C·k·k: every channel of a patch)",
        fix=FixStep("set-arg", ctx.path, f"in_features={got}", {"name": "in_features", "value": got}),
        alternatives=["not removing the transpose: the Linear would mix the patches instead of projecting each one"],
        rule="Linear: input [*, in_features]; nn.Unfold: (B, C·∏kernel, L)",
    )
