"""Input checks and weight copying shared by the sequence layers (cells, recurrent, attention).

Every check raises :class:`~layerlab.layers._checks.LayerInputError` — a ``ValueError`` and a
:class:`~layerlab.errors.LayerlabError` with ``where``/``expected``/``got``/``hint`` fields —
never ``assert`` (asserts vanish under ``python -O``). One message shape for all layers::

    LSTM: input_size: expected 10, got 12 (input shape [5, 3, 12]) → give the input 10 features …

that is: the layer, what was checked, ``expected …, got …`` with its context, then the fix.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable, Dict, Sequence, Tuple, TypeVar

import torch
from torch import Tensor, nn

from layerlab.layers._checks import LayerInputError, layer_error, positive_int  # noqa: F401 - one positive_int for all layers


_F = TypeVar("_F", bound=Callable[..., Any])


def quiet_when_tracing(check: _F) -> _F:
    """Run an input check without ``TracerWarning`` noise under ``torch.jit.trace``.

    While tracing, sizes are traced values, so every size comparison in a check warns that the
    trace "might not generalize". A trace is specialised to its input shapes anyway, so these
    guards are harmless; the warnings are silenced for the check only (eager calls pay one
    ``is_tracing()`` call).
    """
    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not torch.jit.is_tracing():
            return check(*args, **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return check(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def shape_str(shape: Sequence[int]) -> str:
    """``torch.Size([2, 4, 20])`` → ``"[2, 4, 20]"`` (how the messages write shapes)."""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def input_error(layer: str, what: str, expected: Any, got: Any, fix: str, context: str = "") -> LayerInputError:
    """Build (not raise) the project's expected/got/fix error; ``context`` is appended to ``got``."""
    return layer_error(layer, what, expected=expected, got=f"{got} ({context})" if context else got, hint=fix)


def probability(layer: str, arg: str, value: Any) -> float:
    """A dropout probability in ``[0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise input_error(layer, arg, "a probability in [0, 1]", repr(value), f"pass 0.0 ≤ {arg} ≤ 1.0")
    return float(value)


def one_of(layer: str, arg: str, value: Any, options: Sequence[Any]) -> Any:
    """A choice from a closed set (``nonlinearity``, ``activation``)."""
    if value not in options:
        shown = " or ".join(repr(o) for o in options)
        raise input_error(layer, arg, shown, repr(value), f"pass {arg}={options[0]!r}")
    return value


def check_tensor(layer: str, name: str, value: Any) -> None:
    """``value`` must be a tensor (a ``PackedSequence`` or a list gets a pointed message)."""
    if isinstance(value, Tensor):
        return
    got = type(value).__name__
    fix = f"pass {name} as a torch.Tensor"
    if got == "PackedSequence":
        fix = "unpack it with torch.nn.utils.rnn.pad_packed_sequence(...) and pass the padded tensor"
    raise input_error(layer, name, "a torch.Tensor", got, fix)


def check_dim(layer: str, name: str, t: Tensor, allowed: Sequence[int], layout: str) -> None:
    """``t.dim()`` must be one of ``allowed``; ``layout`` spells the accepted shapes."""
    if t.dim() not in allowed:
        raise input_error(
            layer, f"{name} rank", layout, f"{t.dim()}-D {shape_str(t.shape)}",
            f"reshape {name} to one of those layouts",
        )


def check_features(layer: str, input: Tensor, size: int) -> None:
    """The last dim of ``input`` must hold ``input_size`` = ``size`` features."""
    if input.shape[-1] != size:
        raise input_error(
            layer, "input_size", size, input.shape[-1],
            f"give the input {size} features in its last dim, or build {layer}(input_size={input.shape[-1]}, ...)",
            context=f"input shape {shape_str(input.shape)}",
        )


def check_float_dtype(layer: str, name: str, t: Tensor, expected: torch.dtype) -> None:
    """``t`` must have the parameters' dtype (torch would fail later, deep in a matmul)."""
    if t.dtype != expected:
        raise input_error(
            layer, f"{name} dtype", f"{expected} (the parameters' dtype)", t.dtype,
            f"convert the input with {name}.to({expected}), or the layer with layer.to({t.dtype})",
        )


def check_mask_dtype(layer: str, name: str, mask: Tensor) -> None:
    """A mask is ``bool`` or floating (what torch accepts); integer masks are ambiguous."""
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise input_error(
            layer, f"{name} dtype", "torch.bool or a floating dtype", mask.dtype,
            f"pass {name}.bool() (a boolean mask) or {name}.float() (an additive mask)",
        )


def module_dtype_device(module: nn.Module) -> dict:
    """``{"dtype": ..., "device": ...}`` of the module's first parameter (or buffer), for factories."""
    for t in list(module.parameters()) + list(module.buffers()):
        return {"dtype": t.dtype, "device": t.device}
    return {}


def copy_state(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Copy ``src``'s state_dict into ``dst`` (identical names by construction) and return ``dst``.

    Sequence layers name their parameters exactly as torch.nn does (``weight_ih_l0_reverse``,
    ``in_proj_weight``, ``out_proj.bias``, …), so copying is a strict ``load_state_dict``.
    A mismatch means the two were built with different settings; say which keys differ.
    """
    want = set(dst.state_dict())
    have = set(src.state_dict())
    if want != have:
        raise input_error(
            type(dst).__name__, "weights", f"the state_dict keys of {type(dst).__name__}",
            f"missing {sorted(want - have)}, unexpected {sorted(have - want)} in {type(src).__name__}",
            "build both with the same settings",
        )
    dst.load_state_dict(src.state_dict())
    dst.train(src.training)
    return dst


def uniform_init(module: nn.Module, hidden_size: int) -> None:
    """Every parameter ~ U(−1/√H, 1/√H), as torch.nn initialises all recurrent layers."""
    bound = 1.0 / math.sqrt(hidden_size)
    for p in module.parameters():
        nn.init.uniform_(p, -bound, bound)


def non_defaults(module: nn.Module, defaults: Dict[str, Any]) -> str:
    """``", key=value"`` for each attribute that differs from its default (for ``extra_repr``)."""
    return "".join(f", {key}={getattr(module, key, default)!r}" for key, default in defaults.items()
                   if getattr(module, key, default) != default)


class TorchTwin:
    """``from_torch`` / ``to_torch`` for a layer with a torch.nn twin ``_torch_cls``: the same
    constructor arguments, read from either layer by :meth:`_config_of`, and the same parameter
    names, so the weights copy with :func:`copy_state`. Mixed into RNN, LSTM and GRU, the cells,
    MultiheadAttention and TransformerEncoderLayer.

    No annotations in this class body: ``torch.jit.script`` takes a module's attribute types from
    the first class in its bases that has annotations, which must stay ``nn.Module`` (or the layer's).
    """

    #: the torch.nn twin (set by each layer)
    _torch_cls = None
    #: build the copy with UserWarnings silenced (the RNNs: both sides warn about dropout with one
    #: layer, and the layer copied from has already warned)
    _quiet_copy = False

    @classmethod
    def _config_keys(cls) -> Tuple[str, ...]:
        """Constructor arguments, which are also attribute names on ours and on torch's layer."""
        raise NotImplementedError

    @classmethod
    def _config_of(cls, m: nn.Module) -> Dict[str, Any]:
        """Constructor arguments read from ours or from torch's layer."""
        return {key: getattr(m, key) for key in cls._config_keys()}

    @classmethod
    def from_torch(cls, module: nn.Module):
        """Build this layer from the matching torch.nn layer, copying its weights (same names)."""
        if not isinstance(module, cls._torch_cls):
            raise TypeError(f"{cls.__name__}.from_torch: expected a torch.nn.{cls._torch_cls.__name__}, "
                            f"got {type(module).__name__}")
        return copy_state(module, cls._build(cls, module))

    def to_torch(self) -> nn.Module:
        """The matching torch.nn layer carrying a copy of these weights."""
        return copy_state(self, self._build(self._torch_cls, self))

    @classmethod
    def _build(cls, factory: Callable[..., nn.Module], like: nn.Module) -> nn.Module:
        """``factory`` called with ``like``'s constructor arguments, dtype and device."""
        kwargs = {**cls._config_of(like), **module_dtype_device(like)}
        if not cls._quiet_copy:
            return factory(**kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return factory(**kwargs)
