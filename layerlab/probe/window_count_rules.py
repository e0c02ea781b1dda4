"""A Linear after ``x.unfold(dim, size, step)`` + flatten, sized for non-overlapping windows.

Legend: L the unfolded length, w the window ``size``, s the ``step``, n = (L − w) // s + 1 windows,
k the features per window after the layers between the unfold and the flatten.

PatchTST-style forecasters cut a series into patches with ``x.unfold(1, w, s)``, embed each and
flatten the n·k values into a head. With ``step=1`` where ``step=w`` was meant the unfold makes
(L − w) + 1 overlapping windows, and the head's ``in_features`` (sized for L / w patches) no longer
matches. ``in_features = n·k`` would run — and tie the head to this length and this step, reading
overlapping windows the model was not designed for. When ``step = w`` gives exactly the head's size,
both readings are named and no size is offered; the step is not changed on a copy (no fix to verify).
A head sized wrong for the windows the unfold already makes (step = w, or no step that fits) is left
to the Linear rule.
"""

from __future__ import annotations

from typing import Optional

import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis

_FLATTENS = ("flatten", "view", "reshape")


def _unfold_before(ctx, x):
    """The ``unfold`` op record whose window count n, times k, is ``x``'s last dim, and that k."""
    made = ctx.producer_op(x)
    if made is None or made.op not in _FLATTENS or not made.inputs:
        return None
    flat_in = made.inputs[0].shape
    for record in reversed(ctx.trace.records if ctx.trace is not None else []):
        if record.op != "unfold" or record.index >= made.index or not record.outputs or not record.inputs:
            continue
        args = [record.args.get(str(i)) for i in (1, 2, 3)]
        if any(not isinstance(v, int) for v in args):
            return None
        dim, size, step = args
        source, out = record.inputs[0].shape, record.outputs[0]
        dim = dim % len(source)
        n = out[dim]
        # the windows axis kept its place and count up to the flatten; k is what follows it
        if len(flat_in) <= dim or flat_in[dim] != n or x.shape[-1] % n:
            return None
        return record, source[dim], size, step, n, x.shape[-1] // n
    return None


@register_rule("size/overlapping-windows", stage="refine", order=70)
def overlapping_windows(ctx) -> Optional[Diagnosis]:
    """Refines the Linear rule's ``in_features=…`` when an overlapping unfold explains the size."""
    found = ctx.found
    if not isinstance(ctx.module, nn.Linear) or found.fix is None or found.fix.params.get("name") != "in_features":
        return None
    x = ctx.arg("input", 0)
    hit = _unfold_before(ctx, x)
    if hit is None:
        return None
    record, length, size, step, n, k = hit
    want = ctx.module.in_features
    if step >= size or want % k or (length - size) // size + 1 != want // k:
        return None
    patches = want // k
    where = f" at {record.source}" if record.source else ""
    call = f"{record.receiver or 'x'}.unfold({record.args['1']}, {size}, {step})"
    return Diagnosis(
        f"Linear expects in_features = {want}, got {x.shape[-1]} (input {list(x.shape)}) = {n} windows × {k}: "
        f"`{call}`{where} makes {n} overlapping windows of {length} (step {step} < size {size}); with "
        f"step={size} it makes {patches} non-overlapping patches, and {patches} × {k} = {want} = in_features. "
        f"layerlab cannot tell which was meant",
        expected=f"[*, {want}]", got=list(x.shape), cause="ambiguous",
        hint=f"if non-overlapping patches were meant: {record.receiver or 'x'}.unfold({record.args['1']}, {size}, "
             f"{size}) (step = the patch size); if overlapping windows are meant: in_features={x.shape[-1]} — "
             f"which ties the head to this sequence length",
        alternatives=[f"in_features={x.shape[-1]} runs, but reads {n} overlapping windows where the head was "
                      f"built for {patches} patches"],
        rule="Tensor.unfold(dim, size, step): (L − size) // step + 1 windows",
    )
