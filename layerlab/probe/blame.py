"""Why did the forward raise? The registered rules whose trigger matches the failure, in order.

:func:`diagnose` takes a :class:`~layerlab.probe.context.FailureContext`: the innermost module call
that was running, its live arguments, the exception, and (when the op trace ran) the op of the
user's own code that raised. The rules live in one registry (:mod:`layerlab.engine.rule_registry`),
each with an id, a stage, a trigger and an order; the stages run in this order:

1. ``input`` — the model's inputs read against the model (a Hugging Face config, a flag on an input);
2. ``op`` — the rules triggered by the op of the user's code that raised (view, cat, +, matmul,
   masks …): first those that see the cause upstream through the op trace, then the per-op ones;
3. ``module`` — the rules triggered by the failing module's class: the call's arguments as a whole
   (a tuple, devices, dtypes: their torch messages are the least readable), then the module's
   family rule (layout first, then rank, then size), then the explain-shape arithmetic — only
   when no op of the user's code raised, or the module is torch's own;
4. ``refine`` — a module rule's Diagnosis made precise by what the op trace saw upstream (the
   split, the CLS cat, the short ids …).

The first Diagnosis wins. ``None`` means no rule recognised the failure: torch's own message is then
shown alone — better than a confident wrong answer. A rule that cannot read its inputs has nothing
to say (it never turns into an error of its own; ``LAYERLAB_DEBUG=1`` prints its traceback).
"""

from __future__ import annotations

from typing import Optional

import torch

from layerlab.engine.rule_registry import first_diagnosis, rules_for
# the rule modules register their rules when imported: every one of them is imported here
from layerlab.probe import argument_rules, batch_axis_rules, channel_rules, ctc_rules, dataflow_rules  # noqa: F401
from layerlab.probe import embedding_bag_rules, embedding_rules, extra_axis_rules, flat_image_rules  # noqa: F401
from layerlab.probe import hf_rules  # noqa: F401
from layerlab.probe import image_size_rules, join_rules, layer_rules, leaf_input_rules, loss_rules  # noqa: F401
from layerlab.probe import loss_shape_rules, mask_rules, op_rules, order_rules, patch_rules  # noqa: F401
from layerlab.probe import prefix_token_rules, regression_target_rules, rnn_state_rules  # noqa: F401
from layerlab.probe import sequence_target_rules  # noqa: F401
from layerlab.probe import short_sequence_rules, shortcut_rules, sibling_head_rules, split_axis_rules  # noqa: F401
from layerlab.probe import einsum_rules, upstream_rules, window_count_rules, window_rules  # noqa: F401
from layerlab.probe.context import FailureContext
from layerlab.probe.ops import library_class
from layerlab.probe.report import Diagnosis, FixStep


def diagnose(ctx: FailureContext) -> Optional[Diagnosis]:
    """Explain why the failing call raised ``ctx.exc``, or ``None`` when no rule applies."""
    failed = ctx.failed_op
    found = first_diagnosis(rules_for("input"), ctx)
    if found is None and failed is not None:
        found = first_diagnosis(rules_for("op", op=failed.func), ctx)
    if found is not None:
        return _readable(found)
    module = ctx.module
    if module is None or (failed is not None and not library_class(type(module))):
        return None  # an op of the user's code raised and no op rule knew it: the module is not to blame
    found = first_diagnosis(rules_for("module", module=module), ctx)
    if found is None:
        return None
    ctx.found = found  # a resize that a wrong loop index would need is not the fix
    try:
        found = first_diagnosis(rules_for("refine", module=module), ctx) or found
    finally:
        ctx.found = None
    return _at_model_input(ctx, _readable(found))


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
