"""An RNN given one axis too many: token ids shaped ``(B, T, 1)`` looked up by an Embedding.

Legend: B batch, T positions, E the embedding size.

Ids loaded as a column per position (``(B, T, 1)``, one token each) go through ``nn.Embedding``
without complaint, which appends its axis: ``(B, T, 1, E)``. The RNN after it refuses a 4-D input.
The size-1 axis is the ids' trailing one, and squeezing it (``x.squeeze(2)``) gives exactly the
lookup of the ``(B, T)`` ids, so the fix is mechanical and re-run on a copy.

The rule needs the provenance: the input must be an Embedding's output whose ids end in a size-1
axis, and the squeezed input must have the RNN's ``input_size`` last. A 4-D input with a size-1
axis from anywhere else (a conv's ``(N, C, 1, L)``: squeezing it would run and read the channels
as time steps) is left to the RNN's own rule.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis, FixStep


@register_rule("rnn/trailing-one-ids", stage="module", on=(nn.RNNBase,), order=130)
def trailing_one_ids(ctx) -> Optional[Diagnosis]:
    """An RNN given (B, T, 1, E): token ids (B, T, 1) looked up by an Embedding; ``x.squeeze(2)``."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(m, nn.RNNBase) or not isinstance(x, torch.Tensor) or x.dim() != 4:
        return None
    call = ctx.producer(x)
    if call is None or not isinstance(ctx.recorder.modules[call.index], nn.Embedding) or not call.tensor_inputs:
        return None
    ids = call.tensor_inputs[0].shape
    if len(ids) != 3 or ids[-1] != 1 or list(x.shape[:-1]) != ids or x.shape[-1] != m.input_size:
        return None
    axis, name = x.dim() - 2, type(m).__name__
    squeezed = [*x.shape[:axis], x.shape[-1]]
    layout = "(N, L, input_size)" if m.batch_first else "(L, N, input_size)"
    code = f"x.squeeze({axis})"
    return Diagnosis(
        f"{name} expects a 3-D input {layout} (or 2-D unbatched), got 4-D {list(x.shape)}: `{call.label}` "
        f"(Embedding) made it from ids {ids}, whose trailing size-1 axis became dim {axis} — one token per "
        "position, in a list of one",
        expected=layout, got=list(x.shape), cause="rank",
        hint=f"squeeze that axis before {ctx.path or '(root)'}: {code} → {squeezed}",
        fix=FixStep("cast-input", ctx.path, code, {"arg": ctx.key("input", 0), "to": f"squeeze:{axis}"}),
        alternatives=[f"squeeze the ids before {call.label}: ids.squeeze(-1) → {ids[:-1]} (the same lookup)"],
        rule=f"{name}: input {layout} (batch_first={m.batch_first}); Embedding: (*) ids → (*, embedding_dim)",
    )
