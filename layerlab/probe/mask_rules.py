"""Attention masks: nn.MultiheadAttention's contract, and the True/False conventions that bite.

The two conventions are opposite, and integer 0/1 masks (Hugging Face's ``attention_mask``:
1 = a real token, 0 = padding) fit neither:

* ``nn.MultiheadAttention`` (``key_padding_mask``, bool ``attn_mask``) and ``Tensor.masked_fill``:
  **True = ignore / fill** this position;
* ``F.scaled_dot_product_attention`` (bool ``attn_mask``): **True = take part** in attention.

So the fix for an integer mask depends on what its 1s mean. :func:`keeps` reads it from the mask's
structure, never from its majority (a batch padded to ``max_length`` is mostly padding under either
convention): a causal triangle, or a row with no padding — all 1s under "1 = keep", all 0s under
"1 = hide". When neither is there, no conversion is offered: both run, and one hides the real tokens.
The diagnosis says which reading it took.

:func:`mha` is the rule of the module; :func:`masked_fill` and :func:`sdpa` are rules of ops of the
user's code (dispatched by :mod:`layerlab.probe.op_rules`), whose fixes replace that one call.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.hooks import dtype_name
from layerlab.probe.report import Diagnosis, FixStep

TRUE_IGNORES = "True = ignore"
TRUE_ATTENDS = "True = take part"


def keeps(mask: torch.Tensor) -> Optional[bool]:
    """Whether the 1s (Trues) of a mask mark positions to keep (``True``) or to hide (``False``), from its
    structure; ``None`` when it does not say.

    * a causal (L, L) mask: 1s strictly above the diagonal hide the future; 1s on and below keep the past;
    * a padding mask (…, S): a row of all 1s is a sequence without padding under "1 = keep" (under
      "1 = hide" it would be all padding), a row of all 0s one under "1 = hide". A batch padded to
      ``max_length`` has neither, and then the majority says nothing either: most of it is padding,
      marked 0 under one convention and 1 under the other."""
    if mask.numel() == 0:
        return True
    m = mask != 0
    if m.dim() >= 2 and m.shape[-1] == m.shape[-2] > 1:
        future = torch.ones(m.shape[-2:], dtype=torch.bool, device=m.device).triu(1)
        if bool((m == future).all()):
            return False
        if bool((m == ~future).all()):
            return True
    rows = m.reshape(-1, m.shape[-1]) if m.dim() >= 1 else m.reshape(1, 1)
    full, empty = bool(rows.all(1).any()), bool((~rows).all(1).any())
    return full if full != empty else None


def integer_mask_fix(mask: torch.Tensor, convention: str) -> Tuple[Optional[str], str, str]:
    """``(to, code, reading)``: the conversion of an integer mask for an API with ``convention``
    (``to`` is ``None`` when the mask does not say what its 1s mean: no conversion is safe)."""
    keep = keeps(mask)
    if keep is None:
        return None, "mask == 0", ("neither its rows nor its shape say whether 1 marks a position to keep or to "
                                   "hide (no row is all 1s or all 0s: a batch padded to a fixed length?)")
    reading = ("a row of it is all 1s, so 1 reads as keep (Hugging Face's attention_mask convention)"
               if keep else "its rows say 1 reads as a position to hide")
    if (convention == TRUE_IGNORES) == keep:
        return "eq0", "mask == 0", reading
    return "bool", "mask.bool()", reading


def mask_dtype(mask, label: str, convention: str, where: str, arg, api: str, floats: bool = True) -> Optional[Diagnosis]:
    """An integer mask passed where bool (or, for attention, ``floats``: an additive float) is wanted."""
    if not isinstance(mask, torch.Tensor) or mask.dtype == torch.bool or (floats and mask.is_floating_point()):
        return None
    to, code, reading = integer_mask_fix(mask, convention)
    other = "mask.bool()" if to == "eq0" else "mask == 0"
    additive = " or a float mask (added to the scores)" if floats else ""
    if to is None:  # both conversions run; one hides the real tokens
        return Diagnosis(
            f"{label} is {dtype_name(mask.dtype)}; {api} takes a bool mask ({convention}){additive}; {reading}",
            expected="bool or float" if floats else "bool", got=dtype_name(mask.dtype), cause="mask-dtype",
            hint=f"pass {label.split()[0]}=mask == 0 if its 1s mark real tokens (Hugging Face's attention_mask), "
                 f"mask.bool() if they mark positions to hide ({convention})",
            alternatives=["mask.bool()", "mask == 0"],
            rule=f"{api}: bool mask {convention}" + ("; float mask added to the attention scores" if floats else ""),
        )
    return Diagnosis(
        f"{label} is {dtype_name(mask.dtype)}; {api} takes a bool mask ({convention}){additive}; {reading}",
        expected="bool or float" if floats else "bool", got=dtype_name(mask.dtype), cause="mask-dtype",
        hint=f"pass {label.split()[0]}={code} (bool, {convention})",
        fix=FixStep("cast-input", where, code, {"arg": arg, "to": to}),
        alternatives=[f"{other} if the 1s mark positions to {'hide' if to == 'eq0' else 'keep'}"],
        rule=f"{api}: bool mask {convention}" + ("; float mask added to the attention scores" if floats else ""),
    )


@register_rule("attention/mha-contract", stage="module", on=(nn.MultiheadAttention,), order=160)
def mha(ctx) -> Optional[Diagnosis]:
    """nn.MultiheadAttention's contract: mask dtypes and shapes, ``batch_first``, query/key/value sizes."""
    m: nn.MultiheadAttention = ctx.module
    q, k, v = ctx.arg("query", 0), ctx.arg("key", 1), ctx.arg("value", 2)
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None
    for name, position in (("key_padding_mask", 3), ("attn_mask", 5)):
        found = mask_dtype(ctx.arg(name, position), name, TRUE_IGNORES, ctx.path, ctx.key(name, position),
                           "nn.MultiheadAttention")
        if found is not None:
            return found
    layout = "(N, L, E)" if m.batch_first else "(L, N, E)"
    rule = f"MultiheadAttention: query {layout}, key/value {layout.replace('L', 'S')}, batch_first={m.batch_first}"
    for label, t, want in (("query", q, m.embed_dim), ("key", k, m.kdim), ("value", v, m.vdim)):
        if t.shape[-1] != want:
            attr = "embed_dim" if label == "query" else ("kdim" if label == "key" else "vdim")
            return Diagnosis(
                f"MultiheadAttention expects {label}'s last dim = {attr} = {want}, got {t.shape[-1]} "
                f"({label} {list(t.shape)})",
                expected=want, got=t.shape[-1], cause="size",
                hint=f"set {attr}={t.shape[-1]}" + (" (and num_heads dividing it)" if attr == "embed_dim" else "")
                + (f", or project the {label} to {want} features" if attr != "embed_dim" else ""),
                rule=rule,
            )
    batched = q.dim() == 3
    n = (q.shape[0] if m.batch_first else q.shape[1]) if batched else None
    L = q.shape[-2] if (batched and m.batch_first) or not batched else q.shape[0]
    S = k.shape[-2] if (batched and m.batch_first) or not batched else k.shape[0]
    flipped = _other_layout(m, q, k)
    kpm = ctx.arg("key_padding_mask", 3)
    if isinstance(kpm, torch.Tensor) and n is not None and list(kpm.shape) != [n, S]:
        if flipped is not None and list(kpm.shape) == [flipped[0], flipped[2]]:
            return _batch_first(ctx, m, f"key_padding_mask {list(kpm.shape)} is (N, S) for the query read as "
                                        f"{'(L, N, E)' if m.batch_first else '(N, L, E)'}", rule)
        return Diagnosis(
            f"key_padding_mask must be (N, S) = {[n, S]}, got {list(kpm.shape)}",
            expected=[n, S], got=list(kpm.shape), cause="mask-shape",
            hint="one row per sequence, one column per key; True marks padding to ignore",
            rule="key_padding_mask (N, S): True = ignore this key",
        )
    mask = ctx.arg("attn_mask", 5)
    if isinstance(mask, torch.Tensor):
        ok2 = [L, S]
        ok3 = [n * m.num_heads, L, S] if n is not None else None
        if list(mask.shape) not in (ok2, ok3):
            if flipped is not None and mask.dim() == 3 and list(mask.shape) == [flipped[0] * m.num_heads, flipped[1], flipped[2]]:
                return _batch_first(ctx, m, f"attn_mask {list(mask.shape)} is (N·num_heads, L, S) for the other layout", rule)
            if flipped is not None and list(mask.shape) == [flipped[1], flipped[2]] and flipped[1] != L:
                # (L, S) exactly for the other layout: read first, or a causal crop to the batch size would
                # run with the batch taken as the sequence (attention across the samples)
                found = _batch_first(ctx, m, f"attn_mask {list(mask.shape)} is (L, S) for the query read as "
                                             f"{'(L, N, E)' if m.batch_first else '(N, L, E)'}", rule)
                found.alternatives.append(f"only if dim {1 if m.batch_first else 0} really is the sequence and the mask "
                                          f"was built for a longer one: attn_mask[:{L}, :{L}] (cropping it otherwise "
                                          f"runs with the batch taken as the sequence: attention across samples)")
                return found
            if ok3 is not None and list(mask.shape) == [n, L, S]:  # one mask per sequence, none per head
                return _per_sequence_mask(ctx, m, mask, ok3)
            if L == S and mask.dim() == 2 and mask.shape[0] == mask.shape[1] > L and _causal(mask):
                return _causal_crop(ctx, mask, L, rule)
            if n is not None and list(mask.shape) == [n, S] and kpm is None:
                return _padding_as_attn_mask(ctx, mask, n, S)
            return Diagnosis(
                f"attn_mask must be (L, S) = {ok2}" + (f" or (N·num_heads, L, S) = {ok3}" if ok3 else "")
                + f", got {list(mask.shape)}",
                expected=ok2, got=list(mask.shape), cause="mask-shape",
                hint=f"build it for L = {L} queries and S = {S} keys, e.g. "
                f"nn.Transformer.generate_square_subsequent_mask({L}) for a causal mask",
                rule="attn_mask: True / −inf = may not attend; 2-D is shared by every batch and head",
            )
    return None


def _padding_as_attn_mask(ctx, mask: torch.Tensor, n: int, S: int) -> Diagnosis:
    """An (N, S) attn_mask: one row per sequence, one column per key — a padding mask. Its place is
    ``key_padding_mask``, whose convention in nn.MultiheadAttention is the attn_mask's (bool True, or a
    float added to the scores, hides a key), so moving it is exact. Building an (L, S) mask instead
    would make the call run with one mask for every sequence: not what a padding mask says."""
    key = ctx.key("attn_mask", 5)
    return Diagnosis(
        f"attn_mask {list(mask.shape)} is (N, S) = one row per sequence ({n}) and one column per key ({S}): a "
        "padding mask, passed where a per-query mask (L, S) or (N·num_heads, L, S) is read",
        expected="(L, S) or (N·num_heads, L, S)", got=list(mask.shape), cause="mask-shape",
        hint="pass it as key_padding_mask= instead of attn_mask= (same convention: True or −inf hides a key)",
        fix=FixStep("move-input", ctx.path, "key_padding_mask=attn_mask", {"arg": key, "to_name": "key_padding_mask"}),
        alternatives=["expanding it to (L, S) would give every sequence one shared mask"],
        rule="key_padding_mask (N, S); attn_mask (L, S) or (N·num_heads, L, S)",
    )


def _causal(mask: torch.Tensor) -> bool:
    """Whether ``mask`` hides exactly the future (bool True, or −inf, above the diagonal)."""
    future = torch.ones(mask.shape, dtype=torch.bool, device=mask.device).triu(1)
    if mask.dtype == torch.bool:
        return bool((mask == future).all())
    if not mask.is_floating_point():
        return False
    return bool((mask[future] < -1e4).all() and (mask[~future] == 0).all())


def _causal_crop(ctx, mask: torch.Tensor, L: int, rule: str) -> Diagnosis:
    """A causal mask built once for the longest sequence (``max_len``) and passed whole for a
    shorter one: its top-left L×L corner *is* the causal mask of length L, so the slice is exact."""
    M = mask.shape[0]
    where, key, name = ctx.passed_at(mask, "attn_mask", 5, unnamed="mask")  # slice it where the user passes it
    code = f"{name}[:{L}, :{L}]"
    return Diagnosis(
        f"attn_mask is a causal mask for {M} positions ({M}×{M}), but the sequence has {L}: it must be ({L}, {L})",
        expected=[L, L], got=list(mask.shape), cause="mask-shape",
        hint=f"slice it to the sequence length: {code} (in general [:T, :T] with T = x.size(1)) — the top-left "
             f"corner of a causal mask is the causal mask of the shorter sequence",
        fix=FixStep("cast-input", where, code, {"arg": key, "to": f"crop:{L},{L}"}),
        alternatives=[f"or build it per call: nn.Transformer.generate_square_subsequent_mask({L})"],
        rule=rule + "; attn_mask (L, S)",
    )


def _per_sequence_mask(ctx, m, mask: torch.Tensor, ok3: list) -> Diagnosis:
    """An (N, L, S) attn_mask: a 3-D mask holds one (L, S) mask per sequence *and head*, in the order
    ``n * num_heads + h`` — ``repeat_interleave`` along dim 0 (``repeat`` would pair sequence 0's heads
    with other sequences' masks)."""
    heads, key = m.num_heads, ctx.key("attn_mask", 5)
    code = f"attn_mask.repeat_interleave({heads}, dim=0)"
    same = bool((mask == mask[:1]).all())
    return Diagnosis(
        f"attn_mask {list(mask.shape)} is (N, L, S): one mask per sequence, but a 3-D attn_mask needs one per "
        f"sequence and head, (N·num_heads, L, S) = {ok3}, sequence-major",
        expected=ok3, got=list(mask.shape), cause="mask-shape",
        hint=f"repeat each sequence's mask for its {heads} heads: {code} (not .repeat: it would mix sequences)"
        + ("; every sequence has the same mask here, so attn_mask[0] (L, S) would do too" if same else ""),
        fix=FixStep("reshape-input", ctx.path, code, {"arg": key, "op": "repeat_interleave", "repeats": heads, "dim": 0}),
        rule="attn_mask: 2-D (L, S) shared by every batch and head, or 3-D (N·num_heads, L, S)",
    )


def _other_layout(m, q, k) -> Optional[tuple]:
    """``(N, L, S)`` if the inputs were read with the other ``batch_first``."""
    if q.dim() != 3 or k.dim() != 3:
        return None
    if m.batch_first:  # read as (L, N, E)
        return q.shape[1], q.shape[0], k.shape[0]
    return q.shape[0], q.shape[1], k.shape[1]


def _batch_first(ctx, m, why: str, rule: str) -> Diagnosis:
    want = not m.batch_first
    owner = _transformer_owner(ctx)
    build = (f"construct {owner.label} ({owner.class_name}) with batch_first={want} (it passes it to its "
             "attention)" if owner is not None else f"construct it with batch_first={want}")
    return Diagnosis(
        f"MultiheadAttention has batch_first={m.batch_first}, but {why}: the inputs are "
        f"{'(N, L, E)' if want else '(L, N, E)'}",
        expected=f"batch_first={want}", got=f"batch_first={m.batch_first}", cause="layout",
        hint=f"{build} (the output then has the inputs' layout too)",
        fix=FixStep("set-attr", ctx.path, f"batch_first={want}", {"name": "batch_first", "value": want}),
        rule=rule,
    )


def _transformer_owner(ctx):
    """The TransformerEncoderLayer/DecoderLayer call whose ``self_attn`` failed (its ``batch_first``
    is what the user sets), or ``None``."""
    parent = ctx.path.rpartition(".")[0] if "." in ctx.path else ("" if ctx.path else None)
    if parent is None:
        return None
    call = next((c for c in reversed(ctx.recorder.calls) if c.path == parent), None)
    return call if call is not None and call.class_name in _TRANSFORMER_LAYERS else None


_TRANSFORMER_LAYERS = ("TransformerEncoderLayer", "TransformerDecoderLayer")
#: nn.Transformer* forward arguments that are masks: all "True = ignore", like MultiheadAttention's
_TRANSFORMER_MASKS = ("mask", "src_mask", "src_key_padding_mask", "tgt_mask", "memory_mask",
                      "tgt_key_padding_mask", "memory_key_padding_mask")


@register_rule("mask/transformer-integer-mask", stage="module",
               on=(nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder, nn.TransformerEncoderLayer,
                   nn.TransformerDecoderLayer), order=170)
def transformer_masks(ctx) -> Optional[Diagnosis]:
    """nn.Transformer / TransformerEncoder(Layer) / TransformerDecoder(Layer) given an integer mask:
    they check the masks' dtype themselves, before any attention runs."""
    from layerlab.probe.hooks import forward_arg_names

    names = forward_arg_names(type(ctx.module))
    for name in _TRANSFORMER_MASKS:
        if name not in ctx.kwargs and name not in names:
            continue
        position = names.index(name) if name in names else len(ctx.args)
        found = mask_dtype(ctx.arg(name, position), name, TRUE_IGNORES, ctx.path, ctx.key(name, position),
                           f"nn.{type(ctx.module).__name__}")
        if found is not None:
            return found
    return None


# -- ops of the user's code -------------------------------------------------------------------------
def _replace(found: Optional[Diagnosis], record, arg) -> Optional[Diagnosis]:
    """The module-style cast fix of :func:`mask_dtype` as a fix of that one op call."""
    if found is not None and found.fix is not None:
        found.fix = FixStep("replace-op", record.source or "", found.fix.code,
                            op_site(record, arg=arg, to=found.fix.params["to"]))
    return found


@register_rule("mask/masked-fill-dtype", stage="op", on=ops.MASKED_FILL, order=440)
def masked_fill(ctx) -> Optional[Diagnosis]:
    """``masked_fill`` given a non-bool mask: its conversion, from what the mask's 1s mean."""
    failed = ctx.failed_op
    if "boolean" not in str(failed.exc):
        return None
    mask = failed.args[1] if len(failed.args) > 1 else failed.kwargs.get("mask")
    record = failed.record
    found = _replace(mask_dtype(mask, "mask", TRUE_IGNORES, record.source or "", 1,
                                f"{record.op} (fills where the mask is True)", floats=False), record, 1)
    if found is not None and found.fix is not None:
        found.hint = found.hint.replace("pass mask=", "pass ").replace(" (bool,", f"{op_at(record)} (bool,", 1)
    return found


@register_rule("mask/sdpa-mask", stage="op", on=ops.SDPA, order=450)
def sdpa(ctx) -> Optional[Diagnosis]:
    """``F.scaled_dot_product_attention``'s ``attn_mask``: dtype, convention (True = take part) and shape."""
    failed = ctx.failed_op
    mask = failed.kwargs.get("attn_mask", failed.args[3] if len(failed.args) > 3 else None)
    record = failed.record
    if not isinstance(mask, torch.Tensor):
        return None
    arg = "attn_mask" if "attn_mask" in failed.kwargs else 3
    found = _replace(mask_dtype(mask, "attn_mask", TRUE_ATTENDS, record.source or "", arg,
                                "F.scaled_dot_product_attention"), record, arg)
    if found is not None:
        found.alternatives.append("careful: nn.MultiheadAttention's bool masks mean the opposite (True = ignore)")
        return found
    q, k = failed.args[0], failed.args[1]
    want = [*q.shape[:-2], q.shape[-2], k.shape[-2]]
    try:
        torch.broadcast_shapes(tuple(mask.shape), tuple(want))
        return None  # the mask fits: the failure is about something else
    except RuntimeError:
        pass
    padding = mask.dim() == 2 and q.dim() >= 3 and list(mask.shape) == [q.shape[0], k.shape[-2]]
    found = Diagnosis(
        f"attn_mask {list(mask.shape)} does not broadcast to the scores (N, …, L, S) = {want}"
        + ("; it is (N, S): a padding mask" if padding else ""),
        expected=want, got=list(mask.shape), cause="mask-shape",
        hint=f"build it as (L, S) = {[q.shape[-2], k.shape[-2]]} or (N, 1, L, S); a padding mask (N, S) "
             "needs mask[:, None, None, :]",
        rule="F.scaled_dot_product_attention: attn_mask broadcasts to (N, heads, L, S); bool True = take part",
    )
    return _padding_fix(found, mask, q, record, arg, ctx.passed_at(mask, "attn_mask", 3)[2]) if padding else found


def _padding_fix(found: Diagnosis, mask: torch.Tensor, q: torch.Tensor, record, arg, name: str = "") -> Diagnosis:
    """An (N, S) padding mask gets one axis per dim between N and S (heads, queries), values as they
    are: the reshape never changes what True means. A bool mask whose Trues are the minority reads
    as True = padding (nn.MultiheadAttention's key_padding_mask): reshaped as it is, SDPA would
    attend to the padding only — so then no fix, and the hint says which of the two to write."""
    extra = q.dim() - 2
    index = f"[:, {'None, ' * extra}:]"
    code = f"mask{index}"
    found.hint = f"a padding mask (N, S) needs {code}{op_at(record)}: one axis each for " + (
        "the heads and the queries" if extra == 2 else f"the {extra} dims between N and S")
    if mask.dtype == torch.bool and "padding" in name.lower():  # its own name says True = padding: invert
        code = f"~{name}{index}"
        found.message += f"; it is the model's input `{name}`: True = padding (key_padding_mask's convention)"
        found.hint = f"reshape and invert it: {code}{op_at(record)} (in SDPA a bool True takes part)"
        found.fix = FixStep("replace-op", record.source or "", code,
                            op_site(record, arg=arg, to="not:insert:" + ",".join(["1"] * extra)))
        found.alternatives.append(f"{name}{index} without ~ would attend to the padding only")
        return found
    if mask.dtype == torch.bool and not keeps(mask):  # hide-reading or unknown: reshaped as it is, it may attend to padding
        found.message += ("; its True may mark padding (key_padding_mask's convention)" if keeps(mask) is False else
                          "; no row is all True or all False, so it does not say whether True marks padding")
        found.hint += (f"; in SDPA True = take part: use ~mask{index} if True marks padding, "
                       f"mask{index} if True marks real tokens")
        return found
    if mask.dtype == torch.bool:
        found.message += "; True = a real token (its rows say so), as SDPA reads bool masks"
    found.fix = FixStep("replace-op", record.source or "", code,
                        op_site(record, arg=arg, to="insert:" + ",".join(["1"] * extra)))
    found.alternatives.append("~mask only if its True marks padding (nn.MultiheadAttention's convention): "
                              "in SDPA a bool True takes part")
    return found
