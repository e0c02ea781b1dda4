"""Rules about a module call's arguments as a whole: a tuple where a tensor goes, devices, dtypes.

They run first among the module rules (their torch messages are the least readable), for every
module: a layer fed an LSTM's whole ``(output, (h_n, c_n))``, an input on another device than the
module's parameters, or of another floating dtype (float64 from numpy; a tensor made inside forward
with the default dtype), or integer ids fed to a Linear/conv.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.context import FailureContext
from layerlab.probe.hooks import dtype_name
from layerlab.probe.report import Diagnosis, FixStep


@register_rule("device/module-input", stage="module", on=(nn.Module,), order=20)
def device(ctx: FailureContext) -> Optional[Diagnosis]:
    """A module's parameters on one device and an input on another: move the input (or the module)."""
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


@register_rule("dtype/module-input", stage="module", on=(nn.Module,), order=30)
def dtype(ctx: FailureContext) -> Optional[Diagnosis]:
    """A module's floating parameters and an input of another dtype (or integer ids fed to a Linear/conv)."""
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


@register_rule("input/tuple-return-value", stage="module", on=(nn.Module,), order=10)
def tuple_return(ctx: FailureContext) -> Optional[Diagnosis]:
    """A layer fed an RNN's or attention's whole return value (``self.fc(self.lstm(x))``): unpack it."""
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
