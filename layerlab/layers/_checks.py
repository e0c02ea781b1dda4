"""Argument and input checks shared by the spatial reference layers.

Every check raises :class:`LayerInputError`, which is both a :class:`~layerlab.errors.LayerlabError`
(structured fields ``where``/``expected``/``got``/``hint`` for the CLI and ``--json``) and a
:class:`ValueError` (so plain ``except ValueError`` code and ``pytest.raises(ValueError)`` work).
Messages read ``Layer: argument: expected …, got … → fix``. Checks are ``if``/``raise``, never
``assert``, so they survive ``python -O``; they look only at Python ints (sizes, dims), so
``torch.compile(fullgraph=True)`` sees plain shape guards. Layers run them only when
:func:`checking` says so: not in a ``torch.jit.script`` (which cannot compile them) nor while a
``torch.jit.trace`` records (a check there would only freeze the traced sizes).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from layerlab.errors import LayerInputError

IntOrTuple = Union[int, Sequence[int]]


def layer_error(layer: str, arg: str, *, expected: Any, got: Any, hint: Optional[str] = None) -> LayerInputError:
    """Build the error: ``"Conv2d: in_channels: expected …, got … → hint"``."""
    message = f"{layer}: {arg}: expected {expected}, got {got}"
    if hint:
        message += f" → {hint}"
    return LayerInputError(message, where=f"{layer}.{arg}", expected=expected, got=got, hint=hint)


def positive_int(layer: str, arg: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise layer_error(layer, arg, expected="a positive int", got=repr(value),
                          hint=f"pass {arg}=<int ≥ 1>")
    return value


def ntuple(layer: str, arg: str, value: IntOrTuple, n: int, *, minimum: int = 1,
           broadcast_one: bool = False) -> Tuple[int, ...]:
    """``value`` as an ``n``-tuple of ints ``≥ minimum`` (an int is repeated ``n`` times).

    ``broadcast_one`` also accepts a 1-tuple, as torch's pooling layers do.
    """
    items = (value,) * n if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        items = tuple(items)
    except TypeError:
        items = None
    if items is not None and broadcast_one and len(items) == 1:
        items = items * n
    ok = (
        items is not None and len(items) == n
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in items)
    )
    if not ok:
        raise layer_error(
            layer, arg, expected=f"an int ≥ {minimum} or a tuple of {n} such ints", got=repr(value),
            hint=f"pass one int (used for every dim) or {n} of them, e.g. {arg}={(1,) * n if n > 1 else 1}",
        )
    return items


def checking() -> bool:
    """Run the Python input checks? Not inside ``torch.jit.script`` (TorchScript cannot compile
    them) nor while ``torch.jit.trace`` records (a trace keeps tensor ops only, so a check there
    would just freeze the traced sizes into TracerWarnings); torch's own ops still check there."""
    return not torch.jit.is_scripting() and not torch.jit.is_tracing()


def spatial_names(nd: int) -> str:
    return {1: "L", 2: "H, W", 3: "D, H, W"}[nd]


def check_rank(layer: str, x: Tensor, nd: int) -> bool:
    """Accept ``(N, C, *S)`` or unbatched ``(C, *S)`` with ``nd`` spatial dims; return ``batched``."""
    if not isinstance(x, Tensor):
        raise layer_error(layer, "input", expected="a torch.Tensor", got=type(x).__name__,
                          hint="convert it with torch.as_tensor(x)")
    if x.dim() not in (nd + 1, nd + 2):
        names = spatial_names(nd)
        if x.dim() == nd:
            hint = f"add a channel dim of size 1: x.unsqueeze({-(nd + 1)})"
        elif x.dim() > nd + 2:
            hint = f"merge the leading dims into the batch: x.flatten(0, {x.dim() - nd - 2})"
        else:
            hint = f"reshape the input to (N, C, {names})"
        raise layer_error(
            layer, "input",
            expected=f"a {nd + 2}-D (N, C, {names}) or {nd + 1}-D unbatched (C, {names}) tensor",
            got=f"a {x.dim()}-D tensor of shape {tuple(x.shape)}", hint=hint,
        )
    return x.dim() == nd + 2


def check_channels(layer: str, x: Tensor, nd: int, expected: int, arg: str = "in_channels") -> None:
    got = x.shape[-nd - 1]
    if got != expected:
        raise layer_error(
            layer, "input",
            expected=f"{expected} channels at dim {x.dim() - nd - 1} ({arg}={expected})",
            got=f"{got} channels in input of shape {tuple(x.shape)}",
            hint=f"set {arg}={got}, or make the previous layer output {expected} channels",
        )


def check_floating(layer: str, x: Tensor) -> None:
    if not x.is_floating_point():
        raise layer_error(layer, "input", expected="a floating-point tensor", got=f"dtype {x.dtype}",
                          hint="convert it: x.float()")


def default_init(weight: Tensor, bias: Optional[Tensor], fan_in: int) -> None:
    """torch's default init of ``nn.Linear`` / ``nn.ConvNd``, written out with the same RNG calls in
    the same order: ``kaiming_uniform_(weight, a=√5)``, i.e. ``U(−b, b)`` with ``b = √3 · gain / √fan_in``
    and ``gain = √(2 / (1 + a²)) = √(1/3)``, so ``b = 1/√fan_in``; the bias ``U(−1/√fan_in, 1/√fan_in)``."""
    a = math.sqrt(5.0)
    gain = math.sqrt(2.0 / (1 + a**2))  # leaky_relu gain for slope a: √(1/3)
    bound = math.sqrt(3.0) * (gain / math.sqrt(fan_in))  # uniform bound for that std: 1/√fan_in up to rounding
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        if bias is not None:
            bias_bound = 1 / math.sqrt(fan_in)
            bias.uniform_(-bias_bound, bias_bound)


def check_matches(layer: str, x: Tensor, param: Tensor) -> None:
    """The input's dtype and device must be the parameters' (torch would raise a terser message)."""
    if x.dtype != param.dtype:
        raise layer_error(layer, "input", expected=f"dtype {param.dtype} (the layer's parameters)",
                          got=f"dtype {x.dtype}",
                          hint=f"convert the input with x.to({param.dtype}) or the layer with layer.to({x.dtype})")
    if x.device != param.device:
        raise layer_error(layer, "input", expected=f"a tensor on {param.device} (the layer's parameters)",
                          got=f"a tensor on {x.device}",
                          hint=f"move the input with x.to('{param.device}') or the layer with layer.to('{x.device}')")


def check_type(layer: str, module: Any, *types: type) -> None:
    """``from_torch`` guard: a :class:`TypeError` naming the accepted classes."""
    if not isinstance(module, types):
        names = " or ".join(
            f"torch.nn.{t.__name__}" if t.__module__.startswith("torch.nn") else f"{t.__module__}.{t.__qualname__}"
            for t in types
        )
        raise TypeError(f"{layer}.from_torch: expected {names}, got {type(module).__name__}")


def copy_params(dst: torch.nn.Module, src: torch.nn.Module, pairs: Sequence[Tuple[str, str]]) -> None:
    """Copy ``src``'s parameters into ``dst`` (``(dst_name, src_name)`` pairs), keeping requires_grad."""
    dst_params = dict(dst.named_parameters())
    src_params = dict(src.named_parameters())
    with torch.no_grad():
        for dst_name, src_name in pairs:
            d, s = dst_params[dst_name], src_params[src_name]
            if d.shape != s.shape:
                raise layer_error(type(dst).__name__, dst_name, expected=f"shape {tuple(d.shape)}",
                                  got=f"shape {tuple(s.shape)} from {type(src).__name__}.{src_name}")
            d.copy_(s)
            d.requires_grad_(s.requires_grad)
    dst.train(src.training)
