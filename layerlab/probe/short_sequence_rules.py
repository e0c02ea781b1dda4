"""A Conv1d over token embeddings whose kernel is longer than the sentence: pad the ids.

Legend: N batch, T tokens, E embedding features, k kernel span (``dilation·(kernel − 1) + 1``),
p the conv's padding.

A Kim-style text CNN (kernels 3, 4, 5 over ``emb(ids).transpose(1, 2)``) raises "Kernel size can't
be greater than actual input size" for a batch of short sentences. The sentences are too short,
not the kernel too long: ``kernel_size=T`` would run and change the model. When the conv's input
comes (through transposes) from an ``nn.Embedding`` that has a ``padding_idx`` and reads the model's
own input, the fix pads the ids with that id to ``k − 2·p`` tokens — exactly what a collate
function with a minimum length does — and is verified. Without a ``padding_idx`` the pad id is
unknown: the hint says what to do, no fix.

Seq-first ids (T, N) given to a batch-first model look the same: the conv then reads the batch as
time, and padding "the sentences" pads the batch axis and runs. So the fix is given only when the
ids' dim 0 could not be the sentences either (fewer than ``k − 2·p`` of them), or when their padding
says which axis is the sequence: each row's padding ids a suffix along dim 1, and some column with a
padding id before a token (no suffix along dim 0). Otherwise both readings are named, no fix.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis, FixStep

_STEPS = 4


@register_rule("size/short-token-ids", stage="refine", order=50)
def pad_short_ids(ctx) -> Optional[Diagnosis]:
    """Refine "the kernel does not fit in the padded input" of a Conv1d fed token embeddings."""
    found = ctx.found
    conv = ctx.module
    if not isinstance(conv, nn.Conv1d) or "kernel does not fit" not in found.message:
        return None
    x = ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or not isinstance(conv.padding, tuple):
        return None
    span = conv.dilation[0] * (conv.kernel_size[0] - 1) + 1
    need, T = span - 2 * conv.padding[0], x.shape[-1]
    found.hint = (f"the input has {T} positions and {ctx.path}'s kernel spans {span}: pad the sequences to at "
                  f"least {need} positions (or give {ctx.path} padding ≥ {-(-(span - T) // 2)}); a smaller "
                  "kernel_size would run but change the model")
    emb_call = _embedding_behind(ctx, x)
    if emb_call is None:
        return found
    emb = ctx.recorder.modules[emb_call.index]
    pad = emb.padding_idx
    ids_slot = emb_call.tensor_inputs[0].slot if emb_call.tensor_inputs else None
    placed = model_input(ctx, ids_slot)
    if pad is None or placed is None:
        found.hint += f"; {emb_call.label} (Embedding) has no padding_idx to pad the ids with" if pad is None else ""
        return found
    where, arg, name, ids = placed
    if ids.dim() != 2 or ids.shape[1] != T:
        return found
    if ids.shape[0] >= need and not _padded_rows(ids, pad):
        found.message += (f"; the {T} positions are dim 1 of the model's input `{name}` {list(ids.shape)}, and "
                          f"nothing says whether that is (N, T) or seq-first (T, N)")
        found.hint = (f"if `{name}` is (N, T), pad the sentences to {need} with the padding id {pad}; if it is "
                      f"seq-first (T, N) = {list(ids.shape)}, transpose it ({name}.t()): the conv reads the batch "
                      "as time")
        return found
    code = f"F.pad({name}, (0, {need - T}), value={pad})"
    found.message += (f"; the {T} positions are the tokens of the model's input `{name}` {list(ids.shape)}, "
                      f"embedded by {emb_call.label} (padding_idx={pad})")
    found.hint = (f"pad the token ids to {need} with the padding id: {code} (a minimum length in the collate "
                  f"function); a smaller kernel_size would run but change the model")
    found.fix = FixStep("cast-input", where, code, {"arg": arg, "to": f"padto:{need}:{pad}"})
    found.cause = "short-sequence"
    return found


def _padded_rows(ids: torch.Tensor, pad: int) -> bool:
    """Padding as a suffix of each row (dim 1 is the sequence), and not a suffix of each column."""
    is_pad = ids == pad
    if not bool(is_pad.any()):
        return False

    def suffixes(mask):  # along dim 1: once a pad, pads to the end
        return bool((mask.int().cummax(dim=1).values == mask.int()).all())
    return suffixes(is_pad) and not suffixes(is_pad.t())


def _embedding_behind(ctx, x: torch.Tensor):
    """The Embedding call whose output ``x`` is, through transposes and permutes of the user's code."""
    op_index, call_index = ctx.made_by(x)
    for _ in range(_STEPS):
        record = ctx.op(op_index)
        if record is None:
            break
        if record.op not in ("transpose", "permute", "movedim", "swapaxes", "contiguous") or len(record.inputs) != 1:
            return None
        op_index, call_index = record.inputs[0].from_op, record.inputs[0].from_call
    call = ctx.call(call_index) if op_index is None else None
    if call is None or not isinstance(ctx.recorder.modules[call.index], nn.Embedding):
        return None
    return call


def model_input(ctx, slot):
    """``(path, key, name, tensor)`` of the outermost call's argument that is the tracked tensor ``slot``."""
    from layerlab.probe.hooks import forward_arg_names

    if slot is None or not ctx.outer:
        return None
    path, args, kwargs = ctx.outer[0]
    module = ctx.recorder.root.get_submodule(path) if path else ctx.recorder.root
    names = forward_arg_names(type(module))
    for key, value in [*enumerate(args), *kwargs.items()]:
        if isinstance(value, torch.Tensor) and ctx.recorder._slot_of(value) == slot:
            name = key if isinstance(key, str) else (names[key] if key < len(names) else "ids")
            return path, key, name, value
    return None
