"""A residual ``out + identity`` whose shortcut keeps the spatial size the main branch strides away.

Legend: N batch, C channels, H/W (and D, L) spatial sizes, s the stride the main branch applied.

A ResNet block that downsamples (``conv1`` with ``stride=s``) needs a shortcut that downsamples
too: ``downsample = Sequential(Conv2d(cin, cout, 1, stride=s), BatchNorm2d(cout))``. When the 1×1
projection is left at ``stride=1`` the add fails on the spatial dims (8 vs 16), with the channels
already equal. Torch's message names two sizes; the fix is the projection's stride.

The rule gives that fix only when the larger operand is, through norms and activations, the output
of a 1×1 conv *that reads the block's own input* (the tensor the block was called with): that is a
shortcut projection. A 1×1 conv deeper in the main branch (a bottleneck's ``conv3``) reads something
else, and there the stride belongs on another conv, so no fix is given. When the larger operand is
the block's input itself (an identity shortcut in a block that strides) the hint says that a
projection is needed, without a fix. Removing the main branch's stride would also make the add run,
but the block would no longer downsample: never offered. The block must be called with one tensor:
an FPN merge ``lateral(c4) + top(c5)`` has a 1×1 conv of its first input on the larger side too, but
the coarser map comes from another input and is to be upsampled, not the lateral strided.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import op_at, op_text
from layerlab.probe.report import Diagnosis, FixStep

_ADDS = {"add", "__add__", "__radd__", "add_", "__iadd__"}
#: Modules a shortcut's projection may be followed by without changing the spatial size.
_KEEP_SIZE = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.ReLU, nn.Identity, nn.Dropout)


@register_rule("residual/strided-shortcut", stage="op", order=110)
def strided_shortcut(ctx) -> Optional[Diagnosis]:
    """``out + identity`` at the op that raised, the shortcut 1×1 conv missing the main branch's stride."""
    failed = ctx.failed_op
    record = failed.record
    if record.op not in _ADDS:
        return None
    tensors = [t for t in failed.args[:2] if isinstance(t, torch.Tensor)]
    if len(tensors) != 2 or tensors[0].dim() < 3 or tensors[0].dim() != tensors[1].dim():
        return None
    a, b = tensors
    if a.shape[:2] != b.shape[:2] or a.shape[2:] == b.shape[2:]:
        return None  # channels differ too, or nothing spatial clashes: another rule's business
    small, large = (a, b) if all(x <= y for x, y in zip(a.shape[2:], b.shape[2:])) else (b, a)
    if not all(x <= y for x, y in zip(small.shape[2:], large.shape[2:])):
        return None
    stride = _stride_between(list(large.shape[2:]), list(small.shape[2:]))
    if stride is None:
        return None
    block = ctx.call(record.call)
    block_input = block.tensor_inputs[0].slot if block is not None and block.tensor_inputs else None
    conv_call = _projection(ctx, large)
    sizes = f"{list(large.shape[2:])} vs {list(small.shape[2:])}"
    head = (f"`{op_text(record)}`{op_at(record)} adds tensors of {list(small.shape[:2])} channels whose spatial "
            f"sizes differ, {sizes}: one branch downsampled by {stride}, the other did not")
    if conv_call is None:
        if block_input is not None and _slot(ctx, large) == block_input:
            return Diagnosis(
                f"{head}; the larger one is the block's own input (an identity shortcut)",
                expected=list(small.shape), got=list(large.shape), cause="shortcut-stride",
                hint=f"a block that strides needs a projection shortcut with the same stride: e.g. "
                     f"nn.Sequential(nn.Conv{small.dim() - 2}d(C, C, 1, stride={stride}, bias=False), norm)",
                rule="residual: shortcut and main branch must have the same shape")
        return None
    conv = ctx.recorder.modules[conv_call.index]
    if not isinstance(conv, nn.modules.conv._ConvNd) or isinstance(conv, nn.modules.conv._ConvTransposeNd) \
            or any(k != 1 for k in conv.kernel_size) or any(s != 1 for s in conv.stride) \
            or not isinstance(conv.padding, tuple) or any(p != 0 for p in conv.padding):
        return None
    reads = conv_call.tensor_inputs[0].slot if conv_call.tensor_inputs else None
    if block_input is None or reads != block_input:
        return None  # a 1×1 conv inside the main branch: the stride belongs elsewhere
    if len(block.tensor_inputs) != 1:
        return None  # the smaller side may come from another input (an FPN's coarser level)
    return Diagnosis(
        f"{head}; the larger one is the shortcut: {conv_call.label} ({type(conv).__name__}, 1×1) projects the "
        f"block's input with stride 1, while the main branch strides by {stride}",
        expected=list(small.shape), got=list(large.shape), cause="shortcut-stride",
        hint=f"give the shortcut projection the block's stride: {conv_call.label} stride={stride} "
             f"(as torchvision's ResNet downsample does)",
        fix=FixStep("set-arg", conv_call.path, f"stride={stride}", {"name": "stride", "value": stride}),
        alternatives=["removing the main branch's stride would run too, but the block would no longer downsample"],
        rule="residual: shortcut and main branch must have the same shape; a 1×1 projection with stride s "
             "gives (in − 1) // s + 1",
    )


def _stride_between(large: List[int], small: List[int]) -> Optional[int]:
    """The one stride ``s ≥ 2`` with ``(L − 1) // s + 1 == S`` on every spatial dim (a 1×1 kernel, no padding)."""
    for s in range(2, max(large) + 1):
        if all((L - 1) // s + 1 == S for L, S in zip(large, small)):
            return s
    return None


def _slot(ctx, t: torch.Tensor) -> Optional[int]:
    try:
        return ctx.recorder._slot_of(t)
    except Exception:  # noqa: BLE001 - a tensor the recorder never saw
        return None


def _projection(ctx, t: torch.Tensor):
    """The conv call that made ``t``, looking back through norms and activations (modules only)."""
    call = ctx.producer(t)
    for _ in range(4):
        if call is None:
            return None
        module = ctx.recorder.modules[call.index]
        if isinstance(module, nn.modules.conv._ConvNd):
            return call
        if not isinstance(module, _KEEP_SIZE) or not call.tensor_inputs or call.tensor_inputs[0].source is None:
            return None
        call = ctx.call(call.tensor_inputs[0].source)
    return None
