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
    want = floats[0].dtype
    for t in ctx.tensors():
        if t.is_floating_point() and t.dtype != want:
            key = ctx.locate(t)
            return Diagnosis(
                f"{type(module).__name__}'s parameters are {dtype_name(want)} but an input is "
                f"{dtype_name(t.dtype)}",
                expected=f"inputs of dtype {dtype_name(want)}",
                got=f"input {list(t.shape)} of dtype {dtype_name(t.dtype)}", cause="dtype",
                hint=f"convert the input with x.to(torch.{dtype_name(want)}), or the module with "
                f"module.to(torch.{dtype_name(t.dtype)}) (--dtype sets both)",
                fix=FixStep("cast-input", ctx.path, f"x.to(torch.{dtype_name(want)})",
                            {"arg": key, "to": dtype_name(want)}) if key is not None else None,
                rule="an op's inputs and weights must share one dtype (outside autocast)",
            )
    return None


_RULES: List[tuple] = [
    (nn.Linear, R.linear),
    (nn.modules.conv._ConvNd, R.conv),
    (nn.RNNBase, R.rnn),
    (nn.MultiheadAttention, mha),
    ((nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder, nn.TransformerEncoderLayer,
      nn.TransformerDecoderLayer), transformer_masks),
    (nn.LayerNorm, R.layer_norm),
    (nn.modules.batchnorm._BatchNorm, R.batch_norm),
    (nn.GroupNorm, R.group_norm),
    (nn.Embedding, R.embedding),
]


def diagnose(ctx: FailureContext) -> Optional[Diagnosis]:
    """Explain why the failing call raised ``ctx.exc``, or ``None`` when no rule applies."""
    failed = ctx.failed_op
    if failed is not None:
        found = _safe(lambda: diagnose_op(ctx, failed))
        if found is not None:
            return found
    module = ctx.module
    if module is None or (failed is not None and not _library(module)):
        return None  # an op of the user's code raised and no op rule knew it: the module is not to blame
    rules: List[Callable] = [_device_rule, _dtype_rule]
    rules += [rule for cls, rule in _RULES if isinstance(module, cls)]
    rules.append(R.shape_layer)
    for rule in rules:
        found = _safe(lambda: rule(ctx))
        if found is not None:
            return _readable(found)
    return None


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
