"""Axis arithmetic for layout diagnoses: where does the size a layer wants sit, and which
``permute`` / ``transpose`` puts it where the layer reads it.

A layer that reads its features from one axis (Conv and BatchNorm: dim 1; Linear, LayerNorm,
RNN, MultiheadAttention: the last) and finds the wrong size there very often got the right data
in another layout: (N, L, C) from an Embedding where Conv1d wants (N, C, L), NHWC where Conv2d
wants NCHW. When the wanted size sits on exactly one other axis, moving that axis is the fix;
changing the layer's size instead makes the model run and compute garbage.

The module that made a tensor settles its layout better than any size does: an Embedding's or a
Linear's output has its features last, a conv's on dim 1, whatever sizes happen to coincide
(:func:`features_side`), also after a slice, a pad or a cat that hid it (:func:`made`). A rule trusts
that first, and reads sizes only for tensors of unknown provenance (a model input, or an op that
moved axes).

The rules' shared verdicts live here too: the fix that permutes an input (:func:`permute_fix`),
the ambiguous verdict that offers none (:func:`ambiguous`), and the ``torch.cat`` that joined along
the wrong dim (:func:`cat_fix`).
"""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence, Tuple

from layerlab.probe.context import op_site, op_text
from layerlab.probe.report import Diagnosis, FixStep

#: Module classes whose output puts the features on the last axis: a tensor they made is
#: (N, …, features), whatever its sizes say.
FEATURES_LAST = (
    "Embedding", "Linear", "LayerNorm", "RMSNorm", "MultiheadAttention", "TransformerEncoderLayer",
    "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "Transformer",
    "LSTM", "GRU", "RNN", "Bilinear", "LazyLinear",
)
#: ... and on axis 1: (N, C, *spatial).
CHANNELS_FIRST = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
                  "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
                  "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
                  "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
                  "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "Upsample")
#: Modules whose output has their input's shape and layout (activations, dropout): a tensor they
#: made has the layout of their input, so provenance is followed through them.
ELEMENTWISE = ("ReLU", "ReLU6", "LeakyReLU", "PReLU", "GELU", "SiLU", "Mish", "ELU", "SELU", "CELU",
               "Tanh", "Sigmoid", "Hardtanh", "Hardswish", "Hardsigmoid", "Softplus", "Softsign",
               "Tanhshrink", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Identity")


def features_side(class_name: Optional[str], ndim: int) -> Optional[str]:
    """``"last"`` or ``"first"`` (dim 1): where a tensor made by a ``class_name`` module holds its
    features; ``None`` when unknown, and for 2-D tensors (there dim 1 *is* the last)."""
    if class_name is None or ndim < 3:
        return None
    if class_name in FEATURES_LAST:
        return "last"
    return "first" if class_name in CHANNELS_FIRST else None


def axes_with(shape: Sequence[int], size: int, skip: Iterable[int] = ()) -> List[int]:
    """The axes of ``shape`` (non-negative indices) whose size is ``size``, except ``skip``."""
    skipped = {s % len(shape) for s in skip} if shape else set()
    return [k for k, n in enumerate(shape) if n == size and k not in skipped]


def move_axis(ndim: int, src: int, dst: int) -> List[int]:
    """The ``permute`` order that moves axis ``src`` to position ``dst`` (others keep their order)."""
    src, dst = src % ndim, dst % ndim
    dims = [k for k in range(ndim) if k != src]
    dims.insert(dst, src)
    return dims


#: the tensor methods/functions of the user's code that move axes (their record's ``op``)
AXIS_MOVES = ("transpose", "permute", "swapaxes", "movedim")


def inverse(dims: Sequence[int]) -> List[int]:
    out = [0] * len(dims)
    for position, axis in enumerate(dims):
        out[axis] = position
    return out


def permute_code(var: str, dims: Sequence[int]) -> str:
    """``x.transpose(1, 2)`` for a swap of two axes, ``x.permute(0, 3, 1, 2)`` otherwise."""
    moved = [k for k, d in enumerate(dims) if d != k]
    if len(moved) == 2:
        return f"{var}.transpose({moved[0]}, {moved[1]})"
    return f"{var}.permute({', '.join(map(str, dims))})"


def permuted(shape: Sequence[int], dims: Sequence[int]) -> List[int]:
    return [shape[d] for d in dims]


def one_axis(candidates: List[int], prefer: Sequence[int] = ()) -> Optional[int]:
    """The one candidate axis, or the preferred one among several (``None``: can't tell)."""
    if len(candidates) == 1:
        return candidates[0]
    for axis in prefer:
        if axis in candidates:
            return axis
    return None


def axis_list(axes: Sequence[int]) -> str:
    names = [f"dim {a}" for a in axes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# -- what rules build from these --------------------------------------------------------------------
def permute_fix(ctx, key, dims, restore: bool, var: str = "x") -> FixStep:
    """Permute the argument ``key`` of the failing module by ``dims`` (and the output back, for
    layers that keep their input's layout: ``restore``)."""
    code = permute_code(var, dims)
    if restore:
        code = f"{(ctx.path or '(root)')}({code}){permute_code('', inverse(dims))}"
    return FixStep("permute-input", ctx.path, code,
                   {"arg": key, "dims": list(dims), "restore": inverse(dims) if restore else None})


def made(ctx, x) -> Tuple[Optional[str], str]:
    """``(side, "emb (Embedding)")``: where the module that made ``x`` puts its features (``"last"``,
    ``"first"`` or ``None`` when unknown, see :func:`features_side`).

    Looks through the ops that cut, pad or join a tensor without moving its axes (a causal conv's
    ``y[..., :-2]``, ``F.pad``, ``cat([emb, feats], -1)``, see :func:`_keeps_axes`): a sliced conv map
    still has its channels on dim 1, and a size that sits on another axis by coincidence (16 positions
    into a Conv1d(16, …)) is no reason to move it there."""
    call = ctx.producer(x)
    if call is not None:
        return features_side(call.class_name, x.dim()), f"{call.label} ({call.class_name})"
    op_index, call_index = ctx.made_by(x)
    found = [(c, via) for c, via in _makers(ctx, op_index, call_index, x.dim(), ORIGIN_DEPTH, None) if via]
    sides = {features_side(c.class_name, x.dim()) for c, _ in found} - {None}
    if len(sides) != 1:  # nothing known, or branches of both layouts joined: say nothing
        return None, ""
    side = sides.pop()
    call, via = next((c, v) for c, v in found if features_side(c.class_name, x.dim()) == side)
    return side, f"{call.label} ({call.class_name}, then `{via.op}` at {via.source or '?'})"


def operand_side(ctx, operand, ndim: int) -> Optional[str]:
    """:func:`made`'s side for an op's recorded operand (its ``from_op``/``from_call``): where the
    module that made it puts its features, or ``None`` when unknown or the makers disagree."""
    sides = {features_side(c.class_name, ndim)
             for c, _ in _makers(ctx, operand.from_op, operand.from_call, ndim, ORIGIN_DEPTH, None)}
    return sides.pop() if len(sides) == 1 else None


#: How many ops and modules :func:`made` walks back through.
ORIGIN_DEPTH = 6
#: Ops of the user's code that keep every axis where it was (the rank too): cutting, padding,
#: joining, rolling. Reshapes and views are not here: they can fold one axis into another.
KEEP_AXES = ("F.pad", "narrow", "cat", "concat", "concatenate", "roll", "flip", "repeat", "contiguous", "clone")
_SLICE_ONLY = re.compile(r"slice\([^()]*\)|Ellipsis")


def _keeps_axes(record) -> bool:
    if record.op == "__getitem__":  # only slices: x[..., :-2], x[:, 1:] (no None, int or tensor index)
        index = str(record.args.get("1", ""))
        if index == "tuple":  # a long index the trace kept by its type: slices only shrink axes in place
            before = record.inputs[0].shape if record.inputs else None
            after = record.outputs[0] if record.outputs else None
            return bool(before) and after is not None and len(before) == len(after) and \
                all(b >= a for b, a in zip(before, after))
        return bool(index) and not _SLICE_ONLY.sub("", index).strip("(), ")
    return record.op in KEEP_AXES


def _makers(ctx, op_index, call_index, ndim: int, depth: int, via) -> list:
    """``[(call, op)]``: the module calls that made a tensor of rank ``ndim`` (from an operand's
    ``from_op``/``from_call``), through shape-keeping ops, axis-keeping ops (:data:`KEEP_AXES`; ``op``
    is the first one crossed) and elementwise modules."""
    if depth <= 0:
        return []
    if op_index is not None:
        record = ctx.op(op_index)
        if record is None:
            return []
        out = record.outputs[0] if record.outputs else None
        operands = [i for i in record.inputs if i.shape == out]
        if not operands and _keeps_axes(record):
            operands, via = [i for i in record.inputs if i.shape is not None and len(i.shape) == ndim], via or record
        return [found for i in operands for found in _makers(ctx, i.from_op, i.from_call, ndim, depth - 1, via)]
    call = ctx.through_elementwise(ctx.call(call_index), depth)
    return [(call, via)] if call is not None else []


def ambiguous(ctx, what: str, want: int, shape: list, axes: list, options: list) -> Diagnosis:
    """The wanted size sits on several axes and nothing says which: options, and no fix."""
    return Diagnosis(
        f"{type(ctx.module).__name__} expects {what} = {want}, and {want} sits on {axis_list(axes)} "
        f"of the input {shape}: layerlab cannot tell which axis holds the features",
        expected=want, got=shape, cause="ambiguous",
        hint=options[0] + " — or " + options[1] if len(options) > 1 else options[0],
        alternatives=options[1:],
        rule=f"{type(ctx.module).__name__}: features on one axis; the other axes are batch/positions",
    )


def then_size(size: int, want: int, attr: str) -> str:
    """What a layout fix leaves to change: the layer's size, when the moved axis is not ``want``."""
    return "" if size == want else f"; after that {attr} must be {size}"


def cat_fix(ctx, x, axis: int, want: int):
    """``(op record, its dim, fix)`` when ``x`` is a ``torch.cat`` of the user's code that, joined
    along ``axis`` instead, would have ``want`` there (two conv branches joined along time where the
    next conv wants their channels)."""
    record = ctx.producer_op(x)
    if record is None or record.op not in ("cat", "concat", "concatenate") or len(record.inputs) < 2:
        return None
    shapes = [i.shape for i in record.inputs]
    if any(len(s) != len(shapes[0]) for s in shapes):
        return None
    dim = record.args.get("1", record.args.get("dim", 0))
    if not isinstance(dim, int) or dim % len(shapes[0]) == axis:
        return None
    others = [k for k in range(len(shapes[0])) if k != axis]
    if any(s[k] != shapes[0][k] for s in shapes for k in others) or sum(s[axis] for s in shapes) != want:
        return None
    fix = FixStep("replace-op", record.source or "", f"{record.op}(…, dim={axis})", op_site(record, dim=axis))
    return record, dim, fix


# -- the batch axis ---------------------------------------------------------------------------------
#: The rank of an *unbatched* input of these modules: torch reads (C, *spatial) as one sample.
UNBATCHED_RANK = {"Conv1d": 2, "Conv2d": 3, "Conv3d": 4, "MaxPool1d": 2, "MaxPool2d": 3, "MaxPool3d": 4,
                  "AvgPool1d": 2, "AvgPool2d": 3, "AvgPool3d": 4}


def model_batch(ctx) -> Optional[int]:
    """Dim 0 of the model's first tensor input of rank ≥ 2 (the batch, as the caller built it)."""
    calls = getattr(ctx.recorder, "calls", None)
    if not calls:
        return None
    for info in calls[0].tensor_inputs:
        if info.shape is not None and len(info.shape) >= 2:
            return info.shape[0]
    return None


def batch_folded(ctx, x, want: int, base: str, rule: str) -> Optional[Diagnosis]:
    """A flattened ``(rows, features)`` input whose rows are not the samples, so that changing the
    layer's size would make the model run with the wrong number of outputs per sample:

    * a conv earlier in the model got an *unbatched* input (one image without its batch dim): torch
      reads it as (C, H, W), and after ``flatten(1)`` its channels are the rows, while the elements
      here make exactly one row of ``want`` (the fix adds the batch dim where it is missing);
    * the elements here make exactly ``batch`` rows of ``want`` but dim 0 is not the batch: a
      ``stack``/``cat``/``permute`` before it put another axis first. No fix is offered: which op
      moved the batch is the model's business.
    """
    if x.dim() != 2 or x.numel() % want:
        return None
    rows, n = x.shape[0], x.numel() // want
    if n == 1 and rows != 1:
        for call in ctx.recorder.calls:
            ins = call.tensor_inputs
            if call.class_name in UNBATCHED_RANK and ins and ins[0].shape is not None \
                    and len(ins[0].shape) == UNBATCHED_RANK[call.class_name]:
                return Diagnosis(
                    f"{base}; {call.label} ({call.class_name}) got a {len(ins[0].shape)}-D input {ins[0].shape}, "
                    f"which torch reads as one unbatched sample (C, …): its {rows} channels became the rows here, "
                    f"and the {x.numel()} elements make exactly one row of in_features = {want}: the batch dim "
                    "is missing",
                    expected=f"[N, {want}]", got=list(x.shape), cause="rank",
                    hint=f"add the batch dim before {call.label}: x.unsqueeze(0) (a single sample is a batch of 1)",
                    fix=FixStep("reshape-input", call.path, "x.unsqueeze(0)", {"arg": 0, "op": "unsqueeze", "dim": 0}),
                    alternatives=[f"set in_features={x.shape[-1]} — only if each of the {rows} channels is a "
                                  "sample of its own"],
                    rule=rule,
                )
        return None
    batch = model_batch(ctx)
    if batch is None or rows == batch or n != batch:
        return None
    return Diagnosis(
        f"{base}; the input holds {x.numel()} = {batch} · {want} elements, exactly {batch} rows of in_features — "
        f"and {batch} is the batch of the model's input — but its dim 0 is {rows}: another axis was put "
        f"before the batch (a stack/cat/permute along the wrong dim?); " + ctx.origins([("the input", x)]),
        expected=f"[{batch}, {want}]", got=list(x.shape), cause="batch-axis",
        hint=f"find where the batch axis (size {batch}) left dim 0 and keep it first (e.g. torch.stack(…, dim=1))",
        alternatives=[f"set in_features={x.shape[-1]} — only if each of the {rows} rows is one sample "
                      f"(the model would then give {rows} outputs for a batch of {batch})"],
        rule=rule,
    )


def permute_redo(ctx, x, axis: int, want: int, base: str, rule: str) -> Optional[Diagnosis]:
    """``x`` is a ``permute`` of the user's code whose *input* holds ``want`` on exactly one axis
    (other than the batch): that permute put the wrong axis at ``axis`` — ``(0, 2, 3, 1)`` where an
    NHWC image needed ``(0, 3, 1, 2)``. The fix redoes that permute (moving the wanted axis to ``axis``,
    the others in their order); moving axes after it instead would swap H and W and still run."""
    record = ctx.producer_op(x)
    if record is None or record.op != "permute" or not record.inputs:
        return None
    source = list(record.inputs[0].shape)
    axes = axes_with(source, want, skip={0})
    if len(axes) != 1 or len(source) != x.dim():
        return None
    dims = move_axis(len(source), axes[0], axis)
    code = f"x.permute({', '.join(map(str, dims))})"
    return Diagnosis(
        f"{base}; the input is `{op_text(record)}` at {record.source} of {source}, where {want} sits on dim "
        f"{axes[0]}: that permute puts dim {axes[0]} elsewhere — {code} puts it on dim {axis} and keeps the "
        "other axes in order",
        expected=want, got=x.shape[axis], cause="layout",
        hint=f"permute with {code} at {record.source} → {permuted(source, dims)}",
        fix=FixStep("replace-op", record.source or "", code, op_site(record, dims=dims)),
        rule=rule,
    )

