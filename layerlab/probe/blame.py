"""Why did the forward raise? One table of rules, from the failing op or module to a Diagnosis.

:func:`diagnose` takes a :class:`~layerlab.probe.context.FailureContext`: the innermost module call
that was running, its live arguments, the exception, and (when the op trace ran) the op of the
user's own code that raised. The order:

1. the op of the user's code that raised (view, cat, +, matmul, masks …: :mod:`op_rules`);
2. device and dtype mismatches of the module's own tensors (their torch messages are the least
   readable);
3. the module's family rule (:mod:`layer_rules`, :mod:`mask_rules`): layout first, then rank,
   then size;
4. the explain-shape arithmetic for conv/pool-type layers.

``None`` means no rule recognised the failure: torch's own message is then shown alone — better
than a confident wrong answer. A rule that cannot read its inputs has nothing to say (it never
turns into an error of its own).
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch
import torch.nn as nn

from layerlab.probe import layer_rules as R
from layerlab.probe import prefix_token_rules, sequence_target_rules, short_sequence_rules, shortcut_rules, split_axis_rules
from layerlab.probe import batch_axis_rules, dataflow_rules, extra_axis_rules, leaf_input_rules, patch_rules
from layerlab.probe import channel_rules, hf_rules, image_size_rules, loss_rules, loss_shape_rules, order_rules, upstream_rules
from layerlab.probe import ctc_rules, embedding_bag_rules, flat_image_rules, regression_target_rules, sibling_head_rules
from layerlab.probe import window_count_rules
from layerlab.probe.context import FailureContext
from layerlab.probe.hooks import dtype_name
from layerlab.probe.mask_rules import mha, transformer_masks
from layerlab.probe.op_rules import diagnose_op
from layerlab.probe.report import Diagnosis, FixStep


def _device_rule(ctx: FailureContext) -> Optional[Diagnosis]:
    module = ctx.module
    own = [*module.parameters(), *module.buffers()]
    if not own:
        return None
    where = own[0].device
    for t in ctx.tensors():
        if t.device != where:
            key = ctx.locate(t)
            return Diagnosis(
                f"{type(module).__name__}'s parameters are on {where} but an input is on {t.device}",
                expected=f"inputs on {where}", got=f"input {list(t.shape)} on {t.device}", cause="device",
                hint=f"move the input with x.to('{where}'), or the module with module.to('{t.device}') "
                "(--device sets both)",
                fix=FixStep("cast-input", ctx.path, f"x.to('{where}')", {"arg": key, "to": str(where)})
                if key is not None else None,
                rule="every tensor of one op must be on the same device",
            )
    return None


def _dtype_rule(ctx: FailureContext) -> Optional[Diagnosis]:
    module = ctx.module
    floats = [p for p in module.parameters() if p.is_floating_point()]
    if not floats or isinstance(module, nn.Embedding):
        return None
    want, name = floats[0].dtype, type(module).__name__
    for label, t in _named_tensors(ctx):
        # integers only where no integer argument is valid (masks and ids are other rules' business)
        integer = not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool \
            and isinstance(module, (nn.Linear, nn.modules.conv._ConvNd))
        if not integer and not (t.is_floating_point() and t.dtype != want):
            continue
        key = ctx.locate(t)
        fits = not integer or _features_fit(module, t)
        made = ctx.producer_op(t)
        factory = made is not None and made.op in _FACTORIES
        origin = ctx.origin(label, t).text if made is not None else ""
        message = (f"{name}'s parameters are {dtype_name(want)} but an input is {dtype_name(t.dtype)} "
                   f"({label} {list(t.shape)})")
        if integer:
            message += (": it computes in floating point" if fits else
                        f": integer ids? {name} computes in floating point, and ids need an nn.Embedding")
        hint = (f"create it with the input's dtype and device: {made.op}(…, dtype=x.dtype, device=x.device)"
                f"{' at ' + made.source if made.source else ''}" if factory else
                f"convert it with {'x' if key is not None else label}.to(torch.{dtype_name(want)})" + ("" if integer else
                f", or the module with module.to(torch.{dtype_name(t.dtype)}) (--dtype sets both)"))
        if not fits:
            hint = f"look up integer ids with nn.Embedding; if they are counts or features, {hint}"
        return Diagnosis(
            message + (f"; {origin}" if origin else ""),
            expected=f"inputs of dtype {dtype_name(want)}",
            got=f"{label} {list(t.shape)} of dtype {dtype_name(t.dtype)}", cause="dtype", hint=hint,
            fix=FixStep("cast-input", ctx.path, f"x.to(torch.{dtype_name(want)})",
                        {"arg": key, "to": dtype_name(want)}) if key is not None and fits else None,
            rule="an op's inputs and weights must share one floating dtype (outside autocast)",
        )
    return None


#: Ops that create a tensor from nothing: made inside forward, they take the default dtype unless told.
_FACTORIES = ("zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange", "tensor", "eye", "linspace")


def _named_tensors(ctx: FailureContext):
    """``(name, tensor)`` for the call's tensor arguments: ``x``, ``hx[0]`` (names from forward)."""
    from layerlab.probe.hooks import flatten, forward_arg_names

    names = forward_arg_names(type(ctx.module))
    out = []
    for i, a in enumerate(ctx.args):
        out += flatten(a, names[i] if i < len(names) else f"args[{i}]")
    for k, a in ctx.kwargs.items():
        out += flatten(a, k)
    return [(n, t) for n, t in out if isinstance(t, torch.Tensor)]


def _features_fit(module: nn.Module, t: torch.Tensor) -> bool:
    """An integer input already shaped as the layer's features (counts, one-hot): a cast is the fix.
    Anything else may be ids meant for an Embedding."""
    if isinstance(module, nn.Linear):
        return t.dim() >= 1 and t.shape[-1] == module.in_features
    if isinstance(module, nn.modules.conv._ConvNd):
        return t.dim() >= 2 and t.shape[1] == module.in_channels
    return False


#: Stock modules that return a tuple whose first element is *the* output.
_TUPLE_RETURNS = {"LSTM": "(output, (h_n, c_n))", "GRU": "(output, h_n)", "RNN": "(output, h_n)",
                  "MultiheadAttention": "(attn_output, attn_weights)"}


def _tuple_rule(ctx: FailureContext) -> Optional[Diagnosis]:
    """A layer fed an RNN's or attention's whole return value (``self.fc(self.lstm(x))``)."""
    value = ctx.args[0] if ctx.args else None
    if not isinstance(value, tuple) or not value or not isinstance(value[0], torch.Tensor):
        return None
    call = ctx.producer(value[0])
    if call is None or call.class_name not in _TUPLE_RETURNS:
        return None
    returns = _TUPLE_RETURNS[call.class_name]
    return Diagnosis(
        f"{type(ctx.module).__name__} got a tuple where it takes a tensor: the whole return value of "
        f"{call.label} ({call.class_name}), which is {returns}",
        expected="a tensor", got=f"tuple of {len(value)}", cause="tuple",
        hint=f"unpack it: out, _ = {call.label}(…) and pass out" + (
            " (or h_n[-1] for the last hidden state)" if call.class_name != "MultiheadAttention" else ""),
        fix=FixStep("reshape-input", ctx.path, "x[0]", {"arg": 0, "op": "first"}),
        rule=f"{call.class_name} returns {returns}",
    )


_RULES: List[tuple] = [
    (nn.Linear, R.linear),
    (nn.Conv3d, channel_rules.video_frames_first),
    (nn.modules.conv._ConvNd, R.conv),
    (nn.RNNBase, extra_axis_rules.trailing_one_ids),
    (nn.RNNBase, R.rnn),
    (nn.MultiheadAttention, batch_axis_rules.mixed_layouts),
    (nn.MultiheadAttention, mha),
    ((nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder, nn.TransformerEncoderLayer,
      nn.TransformerDecoderLayer), transformer_masks),
    (nn.LayerNorm, R.layer_norm),
    (nn.modules.batchnorm._BatchNorm, R.batch_norm),
    (nn.GroupNorm, R.group_norm),
    (nn.Embedding, R.embedding),
    (nn.EmbeddingBag, embedding_bag_rules.lengths_as_offsets),
    (nn.PixelShuffle, upstream_rules.pixel_shuffle),
    (nn.Unflatten, upstream_rules.unflatten),
    ((nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd), upstream_rules.pool_too_small),
    loss_rules.MODULES,
    loss_shape_rules.MODULES,
    ((nn.CrossEntropyLoss, nn.NLLLoss), sequence_target_rules.per_step_logits_module),
]


def diagnose(ctx: FailureContext) -> Optional[Diagnosis]:
    """Explain why the failing call raised ``ctx.exc``, or ``None`` when no rule applies."""
    failed = ctx.failed_op
    found = _safe(lambda: hf_rules.diagnose(ctx, failed)) \
        or _safe(lambda: leaf_input_rules.input_requires_grad(ctx))  # the inputs read against the model
    if found is not None:
        return found
    if failed is not None:
        found = _safe(lambda: upstream_rules.cat_after_upsample(ctx, failed)) \
            or _safe(lambda: shortcut_rules.strided_shortcut(ctx, failed)) \
            or _safe(lambda: dataflow_rules.diagnose(ctx, failed)) \
            or _safe(lambda: sibling_head_rules.sibling_heads(ctx, failed)) or _safe(lambda: ctc_rules.ctc_batch_first(ctx, failed)) \
            or _safe(lambda: regression_target_rules.trailing_axis(ctx, failed)) or _safe(lambda: diagnose_op(ctx, failed)) \
            or _safe(lambda: sequence_target_rules.per_step_logits(ctx, failed))
        if found is not None:
            return found
    module = ctx.module
    if module is None or (failed is not None and not _library(module)):
        return None  # an op of the user's code raised and no op rule knew it: the module is not to blame
    rules: List[Callable] = [_tuple_rule, _device_rule, _dtype_rule]
    rules += [rule for cls, rule in _RULES if isinstance(module, cls)]
    if not _library(module):  # a model's own module that checks its pixels' channels (HF vision embeddings)
        rules += [channel_rules.channels_last, channel_rules.gray_pixels]
    rules.append(R.shape_layer)
    for rule in rules:
        found = _safe(lambda: rule(ctx))
        if found is not None:  # a resize that a wrong loop index would need is not the fix
            found = _safe(lambda: order_rules.call_order(ctx, found)) \
                or _safe(lambda: image_size_rules.built_for_other_size(ctx, found)) \
                or _safe(lambda: _refined(ctx, found)) or found
            return _at_model_input(ctx, _readable(found))
    return None


def _refined(ctx: FailureContext, found: Diagnosis) -> Optional[Diagnosis]:
    """A module rule's diagnosis made precise by what the op trace saw upstream (the split, the CLS cat,
    the short ids) — or ``None`` to keep it."""
    for refine in (split_axis_rules.chunked_batch, prefix_token_rules.mask_before_prefix,
                   short_sequence_rules.pad_short_ids, patch_rules.unfold_features,
                   window_count_rules.overlapping_windows, flat_image_rules.flat_image):
        better = _safe(lambda: refine(ctx, found))
        if better is not None:
            return better
    return None


def _at_model_input(ctx: FailureContext, found: Diagnosis) -> Diagnosis:
    """A cast of a nested module's input that the model was *given* (the same tensor) is moved to where
    the user passes it: ``input_ids.long()`` at the model, not ``x.long()`` inside
    ``embeddings.word_embeddings`` (code a user of a library model cannot edit). The same cast of the
    same tensor, so the verified run is unchanged; only where the fix is written moves."""
    fix = found.fix
    if fix is None or fix.kind != "cast-input" or not fix.where or not fix.code.startswith("x.") or not ctx.outer:
        return found
    key = fix.params.get("arg")
    if isinstance(key, str):
        tensor = ctx.kwargs.get(key)
    else:
        tensor = ctx.args[key] if isinstance(key, int) and key < len(ctx.args) else None
    if not isinstance(tensor, torch.Tensor):
        return found
    path, outer_key, name = ctx.passed_at(tensor, "x", 0)
    if path == ctx.path:
        return found
    if isinstance(outer_key, int) and _from_torch(ctx, path):
        name = "x"  # nn.Sequential's `input` is not what the caller calls it
    code = name + fix.code[1:]
    found.fix = FixStep(fix.kind, path, code, {**fix.params, "arg": outer_key})
    if found.hint:
        found.hint = found.hint.replace(fix.code, code)
    return found


def _from_torch(ctx: FailureContext, path: str) -> bool:
    try:
        module = ctx.recorder.root.get_submodule(path) if path else ctx.recorder.root
    except Exception:  # noqa: BLE001 - a path the recorder cannot resolve: keep the name read
        return False
    return type(module).__module__.startswith("torch.")


def _readable(found: Diagnosis) -> Diagnosis:
    """No internal references (``shape_rules §3.2``) in what a user reads."""
    if found.rule and "§" in found.rule:
        found.rule = None
    return found


def _library(module: nn.Module) -> bool:
    from layerlab.probe.ops import library_class

    return library_class(type(module))


def _safe(rule: Callable[[], Optional[Diagnosis]]) -> Optional[Diagnosis]:
    from layerlab.errors import debug_enabled

    try:
        return rule()
    except Exception:  # a rule that cannot read these inputs has nothing to say
        if debug_enabled():
            raise
        return None
