"""Why an op of the user's own code raised: view/reshape, cat/stack, broadcasting arithmetic,
matmul/bmm, operands of mixed dtypes, float or out-of-range indices (einsum, masks and losses have
modules of their own). Each is registered in :mod:`layerlab.engine.rule_registry` with the torch
callables it explains (:mod:`layerlab.probe.op_triggers`); the registry runs them in order.

Each rule reads the failing op's *live* arguments (kept by the op trace while the failure is
diagnosed), says what clashed with the shapes aligned, where the offending tensor came from, and —
where the change is mechanical — gives a fix that replaces that one op at that source line
(``replace-op``), which :mod:`layerlab.probe.verify_fix` re-runs on a copy.
"""

from __future__ import annotations

import math
import re
from typing import Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe import join_rules
from layerlab.probe.context import op_at as _at, op_site as _site, op_tensors, op_text
from layerlab.probe.hooks import dtype_name
from layerlab.probe.report import Diagnosis, FixStep
from layerlab.probe.table_rules import table_too_short
from layerlab.probe.window_rules import requested_shape


# -- view / reshape ---------------------------------------------------------------------------------
@register_rule("view/new-shape", stage="op", on=ops.VIEWS, order=420)
def view(ctx) -> Optional[Diagnosis]:
    """``view``/``reshape`` whose new shape does not fit: a non-contiguous input (use ``reshape``) or the
    wrong element count."""
    failed = ctx.failed_op
    x = failed.args[0] if failed.args and isinstance(failed.args[0], torch.Tensor) else None
    record = failed.record
    if x is None:
        return None
    wanted = requested_shape(failed)
    message = str(failed.exc)
    if "stride" in message and record.op == "view":
        maker = _non_contiguous_maker(ctx, x)
        because = (f"since `{op_text(maker)}`{_at(maker)}, which changes the strides without moving the data"
                   if maker is not None else "(it was made by a transpose, permute, expand or slice)")
        return Diagnosis(
            f".view needs a tensor whose memory layout matches the new shape; the input {list(x.shape)} is "
            f"not contiguous {because}",
            expected="a contiguous tensor", got=f"strides {list(x.stride())}", cause="non-contiguous",
            hint=f"use .reshape({', '.join(map(str, wanted or []))}) instead of .view{_at(record)} "
                 "(it copies only when it must)",
            fix=FixStep("replace-op", record.source or "", "reshape", _site(record, **{"with": "reshape"})),
            alternatives=[f".contiguous().view(…){_at(record)}"],
            rule="view: the new shape must be expressible with the input's strides (x.is_contiguous() suffices)",
        )
    if wanted is None:
        return None
    numel = x.numel()
    known = [s for s in wanted if s != -1]
    product = math.prod(known)
    ask = " · ".join("?" if s == -1 else str(s) for s in wanted)
    if -1 in wanted:
        detail = f"the known sizes multiply to {product}, which does not divide {numel}"
    else:
        detail = f"{ask} = {product} elements"
    options = []
    for i, s in enumerate(wanted):
        rest = math.prod(v for j, v in enumerate(wanted) if j != i and v != -1)
        if s != -1 and -1 not in wanted and rest and numel % rest == 0:
            fixed = list(wanted)
            fixed[i] = numel // rest
            options.append(fixed)
    hint = (f"the input holds {numel} = {' · '.join(map(str, x.shape))} elements; "
            + (f"a shape that fits: {options[-1]}" if options else "use -1 for the one dim that should take the rest")
            + (" — and the layer after it must take that size" if options else ""))
    return Diagnosis(
        f".{record.op}({', '.join(map(str, wanted))}) asks for {detail}, but the input {list(x.shape)} has {numel}",
        expected=numel, got=wanted, cause="element-count", hint=hint,
        rule=f"{record.op}: the new shape must hold exactly as many elements as the input",
    )


def _non_contiguous_maker(ctx, x):
    """The op of the user's code that made ``x`` (or an ancestor) non-contiguous."""
    index = ctx.made_by(x)[0]
    for _ in range(8):
        record = ctx.op(index)
        if record is None:
            return None
        source = record.inputs[0] if record.inputs else None
        if record.contiguous and not record.contiguous[0]:
            before = ctx.op(source.from_op) if source is not None else None
            if before is None or (before.contiguous and before.contiguous[0]):
                return record
        if source is None:
            return None
        index = source.from_op
    return None


# -- cat / stack ------------------------------------------------------------------------------------
@register_rule("join/cat-sizes", stage="op", on=ops.JOINS + ops.STACK, order=432)
def cat(ctx) -> Optional[Diagnosis]:
    """``cat``/``stack`` whose operands' sizes clash: the dim to join along, or which sizes differ."""
    failed = ctx.failed_op
    record = failed.record
    seq = failed.args[0] if failed.args else failed.kwargs.get("tensors")
    if not isinstance(seq, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in seq) or len(seq) < 2:
        return None
    shapes = [list(t.shape) for t in seq]
    dim = failed.args[1] if len(failed.args) > 1 else failed.kwargs.get("dim", 0)
    named = [(f"tensors[{i}]", t) for i, t in enumerate(seq)]
    if record.op == "stack":
        bad = next(i for i, s in enumerate(shapes) if s != shapes[0])
        return Diagnosis(
            f"stack needs tensors of one shape; tensors[0] is {shapes[0]} and tensors[{bad}] is {shapes[bad]}",
            expected=shapes[0], got=shapes[bad], cause="size",
            hint="make them the same shape, or use torch.cat to join along an existing dim of different sizes",
            rule="stack: every tensor the same shape; a new dim is added", alternatives=[ctx.origins(named)],
        )
    if len({len(s) for s in shapes}) != 1:
        return Diagnosis(
            f"cat needs tensors with the same number of dims, got shapes {shapes}", expected="same rank",
            got=shapes, cause="rank", hint="unsqueeze or flatten the odd one out", rule="cat: same rank",
        )
    r = len(shapes[0])
    dim = dim % r if isinstance(dim, int) else 0
    clash = [k for k in range(r) if k != dim and len({s[k] for s in shapes}) > 1]
    works = [d for d in range(r) if all(len({s[k] for s in shapes}) == 1 for k in range(r) if k != d)]
    where = ", ".join(f"dim {k}: {[s[k] for s in shapes]}" for k in clash)
    base = (f"cat(dim={dim}) needs every other dim equal, but {where} (shapes {shapes}); "
            + ctx.origins(named))
    joined = join_rules.features_joined(ctx, record, seq, dim, works, clash, base, shapes)
    if joined is not None:  # conv maps joined on their channels: the odd length is the bug, not the dim
        return joined
    if works:
        d = works[0]
        out = list(shapes[0])
        out[d] = sum(s[d] for s in shapes)
        return Diagnosis(
            base, expected=f"equal sizes except dim {dim}", got=shapes, cause="cat-dim",
            hint=f"join along dim {d}: {record.op}(…, dim={d}){_at(record)} → {out}",
            fix=FixStep("replace-op", record.source or "", f"{record.op}(…, dim={d})", _site(record, dim=d)),
            rule="cat: sizes may differ only along the joined dim",
        )
    return Diagnosis(base, expected=f"equal sizes except dim {dim}", got=shapes, cause="size",
                     hint="resize one of them (a projection or a pool) so that the other dims agree",
                     rule="cat: sizes may differ only along the joined dim")


# -- broadcasting -----------------------------------------------------------------------------------
@register_rule("broadcast/sizes", stage="op", on=ops.BROADCAST + ops.MASKED_FILL, order=490)
def broadcast(ctx) -> Optional[Diagnosis]:
    """Elementwise operands that do not broadcast: the clashing dims aligned from the right, and the layer to
    resize."""
    failed = ctx.failed_op
    tensors = [t for t in op_tensors(failed) if t.dim() > 0]
    if len(tensors) < 2 or "size" not in str(failed.exc):
        return None
    a, b = tensors[0], tensors[1]
    r = max(a.dim(), b.dim())
    pa = [None] * (r - a.dim()) + list(a.shape)
    pb = [None] * (r - b.dim()) + list(b.shape)
    clash = [k for k in range(r) if pa[k] is not None and pb[k] is not None and pa[k] != pb[k] and 1 not in (pa[k], pb[k])]
    if not clash:
        return None
    record = failed.record
    aligned = f"a {_aligned(pa)}\nb {_aligned(pb)}"
    dims = ", ".join(f"dim {k - r}: {pa[k]} vs {pb[k]}" for k in clash)
    named = [("a", a), ("b", b)]
    message = (f"`{op_text(record)}`{_at(record)} broadcasts a {list(a.shape)} with b {list(b.shape)}: "
               f"sizes must be equal or 1 from the right, but {dims}; " + ctx.origins(named))
    fix, hint = _branch_width_fix(ctx, a, b, clash[-1] - r)
    hint = hint or table_too_short(ctx, a, b, clash[-1] - r) or _slice_hint(ctx, a, b, clash[-1] - r)
    if sorted(a.shape) == sorted(b.shape) and a.dim() == b.dim() and fix is None:
        hint = "the operands hold the same sizes in another order: one of them is transposed — permute it to match"
    return Diagnosis(
        message, expected=list(a.shape), got=list(b.shape), cause="broadcast",
        hint=hint or "make the clashing dims equal (or 1): a residual needs the branch to keep the width, "
                     "or a projection of the shortcut",
        fix=fix, rule=f"broadcasting, aligned from the right:\n{aligned}",
    )


def _aligned(shape) -> str:
    return "(" + ", ".join("·" if s is None else str(s) for s in shape) + ")"


def _slice_hint(ctx, a, b, dim: int) -> Optional[str]:
    """A parameter or buffer longer than the input on ``dim`` (a position table of max_len added
    to a shorter sequence): slice it. A hint only — which part to take is the model's choice."""
    for table, other in ((b, a), (a, b)):
        owner = ctx.owner(table)
        if owner is not None and table.dim() >= -dim and other.dim() >= -dim and table.shape[dim] > other.shape[dim]:
            index, attr = ", ".join([":"] * (table.dim() + dim) + [f":{other.shape[dim]}"]), owner.split("`")[1]
            return f"{owner} is longer than the input on dim {dim}: slice it, e.g. self.{attr.split('.')[-1]}[{index}]"
    return None


def _branch_width_fix(ctx, a, b, dim: int):
    """A residual ``x + f(x)`` whose branch ``f`` ends in a Linear/Conv of the wrong width: set
    that layer's output size to the other operand's — unless that layer keeps its width (the block
    widened earlier, ResNet-style: the shortcut needs a projection, a hint without a fix)."""
    for branch, other in ((b, a), (a, b)):
        call = ctx.producer(branch)
        if call is None:
            continue
        module = ctx.recorder.modules[call.index]
        width = other.shape[dim] if other.dim() >= -dim else None
        if isinstance(module, torch.nn.Linear) and dim == -1 and branch.dim() >= 1:
            attr = "out_features"
        elif isinstance(module, torch.nn.modules.conv._ConvNd) and branch.dim() - 1 + dim + 1 == 1:
            attr = "out_channels"
        else:
            continue
        if width is None:
            continue
        size_in = module.in_features if attr == "out_features" else module.in_channels
        if size_in == getattr(module, attr):  # the branch widened before this layer: not its size to change
            return None, (f"the branch keeps its width {size_in} at {call.label} ({call.class_name}), so it widened "
                          f"earlier: a widening block needs a projection of the shortcut to {size_in} (a Linear or "
                          f"1×1 conv, like ResNet's downsample) — or a branch that keeps {width}")
        return (FixStep("set-arg", call.path, f"{attr}={width}", {"name": attr, "value": width}),
                f"make {call.label} ({call.class_name}) output the other operand's width: {attr}={width} "
                f"(or project the other side to {getattr(module, attr)})")
    return None, None


# -- matmul -----------------------------------------------------------------------------------------
@register_rule("matmul/inner-dims", stage="op", on=ops.MATMUL, order=460)
def matmul(ctx) -> Optional[Diagnosis]:
    """matmul/bmm/F.linear whose inner or batch dims clash: which operand to transpose, when the sizes say so."""
    failed = ctx.failed_op
    tensors = op_tensors(failed)
    record = failed.record
    if record.op in ("baddbmm", "addmm"):
        tensors = tensors[1:]
    if len(tensors) < 2:
        return None
    a, b = tensors[0], tensors[1]
    if record.op == "F.linear":  # weight (out, in): x's last dim must be in
        if b.dim() != 2 or a.shape[-1] == b.shape[1]:
            return None
        k, k2 = a.shape[-1], b.shape[1]
        transposed = b.shape[0] == k
        return Diagnosis(
            f"F.linear(x, weight){_at(record)}: x's last dim {k} must equal weight's dim 1 (in_features) {k2}; "
            f"weight is {list(b.shape)} = (out_features, in_features)",
            expected=k2, got=k, cause="inner-dim",
            hint=(f"the weight is stored as (in, out): pass weight.t(){_at(record)}" if transposed
                  else f"make the weight ({b.shape[0]}, {k})"),
            fix=FixStep("replace-op", record.source or "", "weight.t()", _site(record, transpose=1)) if transposed else None,
            rule="F.linear: x (*, in) · weightᵀ, weight (out, in)",
        )
    if a.dim() < 2 or b.dim() < 2:
        return None
    k, k2 = a.shape[-1], b.shape[-2]
    if k == k2:  # (a seq-first operand of bmm: the rule batch/seq-first-operand ran before)
        return _batch_dims(ctx, record, a, b)
    named = [("a", a), ("b", b)]
    base = (f"`{op_text(record)}`{_at(record)} multiplies a {list(a.shape)} by b {list(b.shape)}: "
            f"a's last dim ({k}) must equal b's second-to-last ({k2}); " + ctx.origins(named))
    rule = "matmul: (…, n, k) @ (…, k, m) → (…, n, m)"
    if b.shape[-1] == k:
        return Diagnosis(
            base, expected=k, got=k2, cause="inner-dim",
            hint=f"b is (…, m, k): transpose it — a @ b.transpose(-2, -1){_at(record)} (as in q @ kᵀ)",
            fix=FixStep("replace-op", record.source or "", "b.transpose(-2, -1)", _site(record, transpose=1)),
            rule=rule,
        )
    if a.shape[-2] == k2:
        return Diagnosis(
            base, expected=k, got=k2, cause="inner-dim",
            hint=f"a is (…, k, n): transpose it — a.transpose(-2, -1) @ b{_at(record)}",
            fix=FixStep("replace-op", record.source or "", "a.transpose(-2, -1)", _site(record, transpose=0)),
            rule=rule,
        )
    return Diagnosis(base, expected=k, got=k2, cause="inner-dim",
                     hint="project one operand so that the inner dims agree", rule=rule)


def _batch_dims(ctx, record, a, b) -> Optional[Diagnosis]:
    if a.shape[:-2] == b.shape[:-2]:
        return None
    return Diagnosis(
        f"`{op_text(record)}`{_at(record)}: the batch dims {list(a.shape[:-2])} and {list(b.shape[:-2])} "
        f"do not match (inner dims are fine); " + ctx.origins([("a", a), ("b", b)]),
        expected=list(a.shape[:-2]), got=list(b.shape[:-2]), cause="broadcast",
        hint="bmm needs equal batch sizes; matmul broadcasts them (sizes equal or 1)",
        rule="matmul: batch dims broadcast; bmm: (B, n, k) @ (B, k, m)",
    )


# -- indices, dtypes ---------------------------------------------------------------------------------
@register_rule("index/out-of-range", stage="op", on=ops.INDEX, order=485)
def index(ctx) -> Optional[Diagnosis]:
    """An index op given float ids or indices out of range: the range they span against the valid one."""
    failed = ctx.failed_op
    message = str(failed.exc)
    record = failed.record
    tensors = op_tensors(failed)
    src = tensors[0] if tensors else None
    ids = next((t for t in tensors[1:] if not t.is_floating_point() and t.dtype != torch.bool), None)
    if record.op == "F.embedding" and tensors:
        ids, src = tensors[0], tensors[1] if len(tensors) > 1 else None
        if ids.is_floating_point() or ids.dtype == torch.bool:  # torch says "indices", not "index"
            fix = FixStep("replace-op", record.source or "", "ids.long()", _site(record, arg=0, to="long"))
            return float_ids(ids, fix, f"F.embedding{_at(record)}", "F.linear", "embedding: ids integer in [0, rows)")
    if "out of" not in message and "index" not in message:
        return None
    m = re.search(r"index (-?\d+) is out of bounds for dimension (\d+) with size (\d+)", message)
    if ids is not None and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        dim_size = (src.shape[0] if record.op == "F.embedding" and src is not None else
                    int(m.group(3)) if m else None)
        limit = f" (valid 0..{dim_size - 1})" if dim_size is not None else ""
        return Diagnosis(
            f"`{op_text(record)}`{_at(record)}: the indices span {lo}..{hi}{limit}; "
            + ctx.origins([("index", ids)]),
            expected=f"0 ≤ index < {dim_size}" if dim_size is not None else "indices within the dim",
            got=f"{lo}..{hi}", cause="index-range",
            hint="an off-by-one (ids counted from 1), a vocabulary or class count set too small, or padding "
                 "ids like -100 reaching an index op",
            rule="indices must lie in [-size, size) (gather, index_select, embedding: [0, size))",
        )
    if m:
        return Diagnosis(
            f"`{op_text(record)}`{_at(record)}: index {m.group(1)} on dim {m.group(2)} of size {m.group(3)}",
            expected=f"index < {m.group(3)}", got=int(m.group(1)), cause="index-range",
            hint="check the index arithmetic (an off-by-one, or a size that changed upstream)",
            rule="indices must lie in [-size, size)",
        )
    return None


def float_ids(x: torch.Tensor, fix: FixStep, api: str, linear: str, rule: str) -> Diagnosis:
    """Float (or bool) ids for an embedding lookup: cast them when they are whole numbers; when
    they are not, they are features, and a cast would look up garbage."""
    whole = x.numel() > 0 and bool(torch.all(x == torch.round(x.float()))) if x.is_floating_point() else True
    if whole:
        return Diagnosis(
            f"{api} expects integer ids (int64 or int32), got {dtype_name(x.dtype)} holding whole numbers",
            expected="int64", got=dtype_name(x.dtype), cause="dtype",
            hint=f"pass the ids as integers: {fix.code}", fix=fix, rule=rule,
        )
    return Diagnosis(
        f"{api} expects integer ids, got {dtype_name(x.dtype)} values that are not whole numbers "
        f"(input {list(x.shape)}): these look like features, not token ids",
        expected="int64 ids", got=dtype_name(x.dtype), cause="dtype",
        hint=f"an embedding looks ids up; to map real-valued features use {linear} instead, or feed the ids "
             "rather than their vectors",
        rule=rule,
    )


@register_rule("dtype/mixed-operands", stage="op", order=400)
def dtypes(ctx) -> Optional[Diagnosis]:
    """Floating operands of different dtypes (float64 from numpy meets float32 weights). The
    parameters, and what the model's layers made, set the dtype; the odd operand is converted."""
    failed = ctx.failed_op
    if "type" not in str(failed.exc):  # torch: "same dtype", "scalar type Float", "Input type (double)"
        return None
    named = [(i, t) for i, t in enumerate(failed.args) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if len({t.dtype for _, t in named}) < 2:
        return None
    record, labels = failed.record, {i: chr(ord("a") + i) for i, _ in named}  # a, b as the matmul rule names them
    model = {t.dtype for _, t in named if isinstance(t, torch.nn.Parameter) or ctx.made_by(t)[1] is not None}
    odd = [(i, t) for i, t in named if len(model) == 1 and t.dtype not in model]
    message = (f"`{op_text(record)}`{_at(record)} mixes dtypes: "
               + ", ".join(f"{labels[i]} {list(t.shape)} {dtype_name(t.dtype)}" for i, t in named)
               + "; " + ctx.origins([(labels[i], t) for i, t in named]))
    rule = "an op's floating operands must share one dtype (outside autocast; +, * promote, matmul does not)"
    if len(odd) != 1:  # no parameter or layer output says which dtype the model computes in
        return Diagnosis(message, expected="one dtype", got=[dtype_name(t.dtype) for _, t in named], cause="dtype",
                         hint="convert the operands to one dtype (.to(torch.float32)), or the model with .to(dtype)", rule=rule)
    (i, t), want = odd[0], dtype_name(next(iter(model)))
    code = f"{labels[i]}.to(torch.{want})"
    return Diagnosis(
        message, expected=want, got=dtype_name(t.dtype), cause="dtype",
        hint=f"convert {labels[i]} to the parameters' dtype{_at(record)}: {code} (or the model with "
             f".to(torch.{dtype_name(t.dtype)}))",
        fix=FixStep("replace-op", record.source or "", code, _site(record, arg=i, to=want)), rule=rule,
    )
