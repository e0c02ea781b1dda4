"""The batch on the wrong axis: a sequence-first tensor meets a batch-first one.

Legend: B batch, T/S sequence lengths (query/key), D/E features.

``nn.RNN``/``LSTM``/``GRU``, ``nn.MultiheadAttention`` and the ``nn.Transformer*`` layers take and
return ``(T, B, …)`` unless built with ``batch_first=True``. A model that mixes the two conventions
fails where the two kinds of tensor meet:

* **bmm / matmul.** ``torch.bmm(q, k.transpose(1, 2))`` with ``q`` ``(B, T, D)`` and ``k`` the output of a
  seq-first GRU, ``(T, B, D)``: the batch dims differ. The fix puts ``k``'s batch first,
  ``k.transpose(0, 1)``, where the line uses it; it is re-run on a copy.
* **MultiheadAttention's key/value.** A seq-first attention (a ``TransformerDecoderLayer``'s
  ``multihead_attn``) given a memory ``(B, S, E)`` from a ``batch_first=True`` encoder: the fix is
  ``memory.transpose(0, 1)`` where the model passes it. Only the key/value are moved: the query
  sets the output's layout, which the code after the call relies on.

The verdict rests on provenance, never on sizes alone: the odd tensor must be the output of a module
whose ``batch_first`` says it is the other layout (:func:`sequence_output`), and the transposed
tensor must then fit. Sizes that merely fit a transpose (a model input, a ``batch_first=True``
module's output given the wrong data) get no fix: they do not say which axis is the batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import ORIGIN_STEPS, op_at, op_site, op_tensors, op_text
from layerlab.probe.report import CallRecord, Diagnosis, FixStep, OpRecord

_RULE = ("nn.RNN/LSTM/GRU, nn.MultiheadAttention and nn.Transformer* take and return (T, B, …) "
         "unless batch_first=True")


def batch_first_of(module: nn.Module) -> Optional[bool]:
    """The layout a sequence module reads and returns (``None`` for modules without one)."""
    if isinstance(module, (nn.RNNBase, nn.MultiheadAttention, nn.Transformer)):
        return bool(module.batch_first)
    if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        return bool(module.self_attn.batch_first)
    if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)) and len(module.layers):
        return batch_first_of(module.layers[0])
    return None


@dataclass
class Source:
    """A tensor traced back to a sequence module's output: ``swap`` is the one op on the way that
    swapped its last two axes (``k.transpose(1, 2)``), where a fix of that tensor is written."""

    call: CallRecord
    batch_first: bool
    shape: List[int]
    swap: Optional[OpRecord] = None


def sequence_output(ctx, t: torch.Tensor, swaps: bool = False) -> Optional[Source]:
    """The sequence module whose (first) output ``t`` is, through one-input ops that keep the shape
    (``torch.tanh``, dropout) and, with ``swaps``, at most one swap of the last two axes."""
    op_index, call_index = ctx.made_by(t)
    shape, swap = list(t.shape), None
    for _ in range(ORIGIN_STEPS):
        record = ctx.op(op_index)
        if record is None:
            break
        if len(record.inputs) != 1 or not record.outputs:
            return None
        source = record.inputs[0]
        if swaps and swap is None and _swaps_last_two(record):
            swap = record
        elif source.shape != record.outputs[0]:
            return None
        op_index, call_index, shape = source.from_op, source.from_call, source.shape
    if op_index is not None:
        return None
    call = ctx.call(call_index)
    if call is None or len(shape) != 3:
        return None
    batch_first = batch_first_of(ctx.recorder.modules[call.index])
    outs = call.tensor_outputs
    # the sequence output comes first; an h_n or attention weights of the same shape would leave it open
    if batch_first is None or not outs or outs[0].shape != shape or any(o.shape == shape for o in outs[1:]):
        return None
    return Source(call, batch_first, shape, swap)


def _swaps_last_two(record: OpRecord) -> bool:
    """``k.transpose(1, 2)``, ``transpose(-2, -1)``, ``permute(0, 2, 1)`` on a 3-D tensor."""
    values = [v for k, v in record.args.items() if k.isdigit()]
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = list(values[0])
    if not all(isinstance(v, int) for v in values) or len(record.outputs[0]) != 3:
        return False
    if record.op in ("transpose", "swapaxes", "swapdims"):
        return len(values) == 2 and sorted(v % 3 for v in values) == [1, 2]
    return record.op == "permute" and [v % 3 for v in values] == [0, 2, 1]


def _name(name: Optional[str], default: str) -> str:
    """A variable name read from the user's line, or ``default`` (``arg1`` and ``torch`` are no names)."""
    if name and name.isidentifier() and name != "torch" and not re.fullmatch(r"arg\d+", name):
        return name
    return default


# -- bmm / matmul -----------------------------------------------------------------------------------
@register_rule("batch/seq-first-operand", stage="op",
               on=(torch.bmm, torch.Tensor.bmm, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__), order=455)
def seq_first_operand(ctx) -> Optional[Diagnosis]:
    """``bmm(a, b)`` whose batch dims differ (the inner dims agree) because one operand is a seq-first
    module's output: that operand's ``transpose(0, 1)``."""
    failed = ctx.failed_op
    tensors = op_tensors(failed)
    if len(tensors) < 2:
        return None
    a, b = tensors[0], tensors[1]
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:  # inner dims first: the matmul rule's
        return None
    record = failed.record
    if record.op not in ("bmm", "matmul", "__matmul__") or a.dim() != 3 or b.dim() != 3 or a.shape[0] == b.shape[0]:
        return None
    sources = [sequence_output(ctx, t, swaps=True) for t in (a, b)]
    seq_first = [i for i, s in enumerate(sources) if s is not None and not s.batch_first]
    if len(seq_first) != 1:  # neither (no provenance), or both: nothing says which one is wrong
        return None
    i = seq_first[0]
    src, t, other = sources[i], (a, b)[i], (b, a)[i]
    T, B, D = src.shape
    fixed = [B, D, T] if src.swap is not None else [B, T, D]
    fits = other.shape[0] == B and (fixed[-2] == other.shape[-1] if i == 1 else fixed[-1] == other.shape[-2])
    if not fits:  # the batches differ for another reason than the layout
        return None
    site = src.swap if src.swap is not None else record
    if not site.source or (site.code or "").count("@" if site.op == "__matmul__" else f"{site.op}(") != 1:
        return None  # the fix replaces that one call at its line: two calls there would both change
    label = "ab"[i]
    var = _name(site.inputs[0].name if src.swap is not None else record.inputs[i].name, label)
    code = f"{var}.transpose(0, 1)"
    swapped = op_text(src.swap).split(".", 1)[-1] if src.swap is not None and src.swap.receiver else None
    written = f"{code}.{swapped}" if swapped else code  # k.transpose(0, 1).transpose(1, 2) on that line
    return Diagnosis(
        f"`{op_text(record)}`{op_at(record)}: the batch dims {[a.shape[0]]} and {[b.shape[0]]} do not match: "
        f"{label} {list(t.shape)} comes from `{src.call.label}` ({src.call.class_name}, batch_first=False), whose "
        f"output {src.shape} is (T, B, D) with the sequence first, while the other operand has its batch "
        f"({B}) first; " + ctx.origins([("a", a), ("b", b)]),
        expected=f"{label} with batch {B} on dim 0", got=list(t.shape), cause="layout",
        hint=f"put its batch first: {code}{op_at(site)}"
             + (f" ({written} there)" if written != code else "") + f" → {fixed}",
        fix=FixStep("replace-op", site.source, code,
                    op_site(site, arg=0 if src.swap is not None else i, to="movedim:0:1")),
        alternatives=[f"build {src.call.label} with batch_first=True and give it (B, T, …) input"],
        rule="bmm: (B, n, k) @ (B, k, m), the batch on dim 0; " + _RULE,
    )


# -- MultiheadAttention -----------------------------------------------------------------------------
@register_rule("attention/mixed-layouts", stage="module", on=(nn.MultiheadAttention,), order=150)
def mixed_layouts(ctx) -> Optional[Diagnosis]:
    """A key/value in the other layout than the query and the attention's ``batch_first``."""
    m = ctx.module
    q, k, v = ctx.arg("query", 0), ctx.arg("key", 1), ctx.arg("value", 2)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (q, k, v)):
        return None
    axis = 0 if m.batch_first else 1
    n = q.shape[axis]
    if k.shape[axis] == n or k.shape[1 - axis] != n or v.shape != k.shape:
        return None  # the batches agree, or the key's other axis is no batch either
    query = sequence_output(ctx, q)
    if query is not None and query.batch_first != m.batch_first:
        return None  # the query is the odd one (or all are): not the key's transpose
    layout = "(N, L, E)" if m.batch_first else "(L, N, E)"
    other = "(N, S, E)" if not m.batch_first else "(S, N, E)"
    rule = f"MultiheadAttention (batch_first={m.batch_first}): query {layout}, key/value {layout.replace('L', 'S')}"
    base = (f"MultiheadAttention has batch_first={m.batch_first}: the query {list(q.shape)} has batch {n} on dim "
            f"{axis}, the key {list(k.shape)} has {k.shape[axis]} there and {n} on dim {1 - axis}")
    src = sequence_output(ctx, k)
    if src is None or src.batch_first == m.batch_first:
        said = (f"; `{src.call.label}` ({src.call.class_name}, batch_first={src.batch_first}) made it, so that "
                "is its layout" if src is not None else
                f": if the key is {other}, transpose it — its provenance does not say, so layerlab offers no fix")
        check = (f"; check what {src.call.label} was given: batch-first data read by a batch_first="
                 f"{src.batch_first} module puts the time steps where the batch goes" if src is not None else "")
        return Diagnosis(base + said, expected=f"key batch {n}", got=list(k.shape), cause="batch",
                         hint=f"give query, key and value one batch: query {layout}, key/value "
                              f"{layout.replace('L', 'S')}{check}", rule=rule)
    where, key, name = ctx.passed_at(k, "key", 1)
    arg = key
    if where == ctx.path:
        if v is not k:
            arg = [key, ctx.key("value", 2)]
        name = "key"
    elif v is not k:
        return Diagnosis(base, expected=f"key batch {n}", got=list(k.shape), cause="layout",
                         hint=f"transpose key and value to {layout.replace('L', 'S')}: .transpose(0, 1)", rule=rule)
    code = f"{name}.transpose(0, 1)"
    fixed = [k.shape[1], k.shape[0], k.shape[2]]
    return Diagnosis(
        base + f": it comes from `{src.call.label}` ({src.call.class_name}, batch_first={src.batch_first}), "
        f"which returns {other}",
        expected=f"key/value {layout.replace('L', 'S')}", got=list(k.shape), cause="layout",
        hint=f"transpose it where it is passed to {where or '(root)'}: {code} → {fixed}"
             + (" (key and value alike)" if v is not k else ""),
        fix=FixStep("cast-input", where, code, {"arg": arg, "to": "movedim:0:1"}),
        alternatives=[f"build the attention with batch_first={src.batch_first} — only if the query is "
                      f"{other.replace('S', 'L')} too (it sets the output's layout)"],
        rule=rule + "; " + _RULE,
    )
