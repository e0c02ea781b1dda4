"""Two heads on one input whose widths clash: a VAE's ``mu``/``logvar``, a gate's two projections.

Legend: h the shared input, a = f(h) and b = g(h) the operands of the op that raised.

``z = mu + eps * std`` with ``mu = nn.Linear(H, Z)`` and ``logvar = nn.Linear(H, H)`` fails to
broadcast. Neither operand is a residual shortcut (the broadcast rule's "widening block" reading
would add a projection, and run, with a latent of the wrong size): both are heads of the same h,
and one of them has the wrong ``out_features``. Which one, the rest of the model says: each head is
resized to the other's width on a copy and the whole forward re-run. When exactly one of the two
runs (the decoder of the latent takes that width), that head is the one to resize. A Linear that has
not run yet is no witness by itself: a critic of h with ``in_features`` = h's width, or a condition
projection that runs later on another input, would pick the wrong head and still "run" (a latent of
the wrong width). When both or neither re-run, both readings are named and no size is offered.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import op_tensors
from layerlab.probe.report import Diagnosis, FixStep


def _head(ctx, t):
    call = ctx.producer(t)
    if call is None or not call.tensor_inputs:
        return None
    module = ctx.recorder.modules[call.index]
    return (call, module) if type(module) is nn.Linear else None


def _runs_resized(ctx, call, width) -> bool:
    """Whether the model's forward, on a copy with ``call``'s Linear set to ``out_features=width``, runs."""
    from layerlab.probe.fixes import apply_fixes  # fixes → rules would be a cycle at import time

    if not ctx.outer or not call.path:
        return False
    _, args, kwargs = ctx.outer[0]
    step = FixStep("set-arg", call.path, f"out_features={width}", {"name": "out_features", "value": width})
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # the model's own randn_like: leave the seed be
            apply_fixes(ctx.recorder.root, [step])(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any failure means this reading does not explain the model
        return False
    return True


@register_rule("heads/sibling-head-width", stage="op", order=300)
def sibling_heads(ctx) -> Optional[Diagnosis]:
    """Two heads on one input whose widths clash (a VAE's mu/logvar): resize the one whose change makes the
    model run."""
    failed = ctx.failed_op
    tensors = [t for t in op_tensors(failed) if isinstance(t, torch.Tensor) and t.dim() > 0]
    if len(tensors) < 2 or "must match the size" not in str(failed.exc):
        return None
    a, b = tensors[0], tensors[1]
    if a.dim() != b.dim() or a.shape[:-1] != b.shape[:-1] or a.shape[-1] == b.shape[-1]:
        return None
    ha, hb = _head(ctx, a), _head(ctx, b)
    if ha is None or hb is None or ha[0].index == hb[0].index:
        return None
    if ha[0].tensor_inputs[0].slot != hb[0].tensor_inputs[0].slot:  # not the same h: the broadcast rule's case
        return None
    record = failed.record
    where = f" at {record.source}" if record.source else ""
    wa, wb = a.shape[-1], b.shape[-1]
    ca, cb = ha[0], hb[0]
    message = (f"`{record.op}`{where}: a [{', '.join(map(str, a.shape))}] comes from {ca.label} (Linear, "
               f"out_features={wa}) and b [{', '.join(map(str, b.shape))}] from {cb.label} (Linear, out_features={wb}); "
               f"both read the same input, so they are two heads of one tensor and one of them has the wrong width")
    witness = [w for w, call in ((wa, cb), (wb, ca)) if _runs_resized(ctx, call, w)]
    both = (f"set {cb.label} out_features={wa}, or {ca.label} out_features={wb} — whichever width the layers "
            f"after this op take")
    if len(witness) != 1:
        return Diagnosis(message + "; the rest of the model runs with either width, or with neither, so nothing says which", expected=list(a.shape), got=list(b.shape),
                         cause="ambiguous", hint=both, rule="heads combined elementwise must have one width")
    width = witness[0]
    call = cb if width == wa else ca
    return Diagnosis(
        message + f"; the model runs on with width {width} and not with the other (tried on a copy), so "
        f"{call.label} is the head to resize",
        expected=list(a.shape), got=list(b.shape), cause="size",
        hint=f"set {call.label} out_features={width}",
        fix=FixStep("set-arg", call.path, f"out_features={width}", {"name": "out_features", "value": width}),
        alternatives=["not a projection of the other head: it would run with a latent of the wrong width"],
        rule="heads combined elementwise must have one width",
    )
