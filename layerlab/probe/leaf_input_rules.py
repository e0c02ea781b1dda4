"""A model that sets ``requires_grad`` on a tensor made from its input, given an input that requires grad.

Hugging Face's audio models (Wav2Vec2, HuBERT, WavLM …) do ``hidden_states.requires_grad = True``
on ``input_values[:, None]`` in training, so that gradient checkpointing has something to start
from. torch allows that flag only on a leaf: when the input itself requires grad, the slice is not
a leaf and torch raises "you can only change requires_grad flags of leaf variables". In training
the waveform never requires grad; here it does because a floating spec input requires grad by
default (so that inspect can show its gradient). The fix is the input's flag, not the model: the
model's own inputs that require grad are detached on a copy and the forward re-run.
"""

from __future__ import annotations

from typing import Optional

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis, FixStep

_MESSAGE = "can only change requires_grad flags of leaf variables"


@register_rule("autograd/input-requires-grad", stage="input", order=40)
def input_requires_grad(ctx) -> Optional[Diagnosis]:
    """A model sets ``requires_grad`` on a tensor made from its input, and the input itself requires grad."""
    if _MESSAGE not in str(ctx.exc) or not ctx.outer:
        return None
    _, args, kwargs = ctx.outer[0]  # the model's own call: its inputs
    keys = [i for i, a in enumerate(args) if _grad_leaf(a)] + [k for k, v in kwargs.items() if _grad_leaf(v)]
    if not keys:
        return None
    reached = _leaves_behind(ctx)  # only when the flagged tensor is computed from those inputs
    inputs = {id(args[k] if isinstance(k, int) else kwargs[k]): k for k in keys}
    keys = [k for i, k in inputs.items() if i in reached]
    if not keys:
        return None
    names = [k if isinstance(k, str) else ctx.passed_at(args[k], f"input {k}", k, unnamed=f"input {k}")[2]
             for k in keys]
    shown = ", ".join(names)
    return Diagnosis(
        f"the model sets requires_grad on a tensor it makes from {shown}, and torch allows that only on a "
        f"tensor that is not computed from one requiring grad: {shown} requires grad here",
        expected=f"{shown} without requires_grad (as in training)", got="requires_grad=True",
        cause="input-requires-grad",
        hint=f"give {shown} without requires_grad: in a spec, requires_grad: false on the input (a floating spec "
             "input requires grad by default, so that its gradient can be shown); in Python, x.detach()",
        fix=FixStep("cast-input", "", f"{names[0]}.detach()" if len(names) == 1 else "detach the inputs",
                    {"arg": keys if len(keys) > 1 else keys[0], "to": "detach"}),
        rule="only a leaf tensor's requires_grad can be set (Hugging Face audio models set it on their input's slice "
             "in training)",
    )


def _leaves_behind(ctx, limit: int = 10_000) -> set:
    """``id`` of every leaf tensor the failing op's operands were computed from (their autograd graph)."""
    from layerlab.probe.context import op_tensors

    from layerlab.target.graph import graph_nodes

    failed = ctx.failed_op
    roots = [t.grad_fn for t in (op_tensors(failed) if failed is not None else ctx.tensors())
             if isinstance(t, torch.Tensor)]
    variables = (getattr(fn, "variable", None) for fn in graph_nodes(roots, limit))  # AccumulateGrad: a leaf
    return {id(v) for v in variables if isinstance(v, torch.Tensor)}


def _grad_leaf(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad and value.is_leaf
