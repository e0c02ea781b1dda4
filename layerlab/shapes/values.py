"""What torch's argument parser makes of the *types* of an op's arguments, before any shape rule.

Three things differ from "an int is an int" (every case below was run on torch 2.13):

* **numpy integers** (``np.int64(3)``) are accepted wherever an int is — they are turned into
  ``int`` here. One exception: ``F.adaptive_*_pool2d/3d`` test ``isinstance(output_size, int)``
  and then call ``len()`` on a scalar numpy int: ``TypeError: object of type 'numpy.int64' has
  no len()``.
* **bools** are ints only where the module feeds them to ``torch.empty`` (a conv's
  ``kernel_size``, ``in_channels``, ``out_channels``: ``Conv2d(1, 1, True)`` is a 1×1 conv).
  Everywhere else the C++ argument parser rejects them with a ``TypeError`` (table below).
* ``divisor_override`` must be an int: ``2.0`` and ``True`` are ``TypeError``.

Values that do not fit a signed 64-bit integer never reach torch's arithmetic (the parser fails
with ``Overflow when unpacking long long``): they are a :class:`UsageError` here, as are
floats where an int is needed.

This module never imports numpy or torch: a numpy integer is recognised by ``__index__``.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Tuple

from layerlab.errors import TorchWouldRaise, UsageError

INT64_MAX = (1 << 63) - 1

#: Parameters whose values are integers (or tuples of them) for every op that has them.
INT_PARAMS = ("kernel_size", "stride", "padding", "dilation", "groups", "in_channels", "out_channels",
              "output_padding", "output_size", "size", "upscale_factor", "downscale_factor", "start_dim",
              "end_dim", "patch_size", "embed_dim", "divisor_override")

#: Where a conv module passes the value to ``torch.empty`` (bools are sizes there).
_BOOL_OK = {"conv": ("kernel_size", "in_channels", "out_channels"),
            "conv_transpose": ("kernel_size", "in_channels", "out_channels"),
            "patch": ("in_channels", "embed_dim")}

#: (function torch's parser names, position) of each argument, per op family (1-based, input = 1).
_POSITIONS = {
    "max_pool": {"kernel_size": 2, "stride": 3, "padding": 4, "dilation": 5},
    "avg_pool": {"kernel_size": 2, "stride": 3, "padding": 4},
    "conv_transpose": {"stride": 4, "padding": 5, "output_padding": 6, "groups": 7, "dilation": 8},
    "unfold": {"kernel_size": 2, "dilation": 3, "padding": 4, "stride": 5},
    "fold": {"output_size": 2, "kernel_size": 3, "dilation": 4, "padding": 5, "stride": 6},
    "adaptive": {"output_size": 2},
    "pixel_shuffle": {"upscale_factor": 2},
    "pixel_unshuffle": {"downscale_factor": 2},
    "flatten": {"start_dim": 1, "end_dim": 2},
}


def _is_numpy_int(v: Any) -> bool:
    return not isinstance(v, (int, float, str, bytes)) and hasattr(type(v), "__index__")


def _type_name(v: Any) -> str:
    t = type(v)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


def _to_int(v: Any, name: str) -> Any:
    """numpy int → int; checks the int64 range; other types are left for the op to judge."""
    if isinstance(v, (list, tuple)):
        return type(v)(_to_int(x, name) for x in v)
    if _is_numpy_int(v):
        v = operator.index(v)
    if isinstance(v, int) and not isinstance(v, bool) and not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise UsageError(f"{name}={v} does not fit in a 64-bit integer: torch cannot take it "
                         "('Overflow when unpacking long long')", where=name, expected="|value| < 2**63", got=str(v))
    if isinstance(v, float) and name not in ("output_size", "size"):
        raise UsageError(f"{name} must be an int, got the float {v!r}", where=name, got=v)
    return v


def _first_bool(v: Any) -> Optional[int]:
    """-1 for a bool scalar, the index of the first bool in a tuple, None if no bool."""
    if isinstance(v, bool):
        return -1
    if isinstance(v, (tuple, list)):
        return next((i for i, x in enumerate(v) if isinstance(x, bool)), None)
    return None


def _parser_fn(spec, params: dict) -> Tuple[str, str]:
    """(the function name torch's parser reports, the family key of :data:`_POSITIONS`)."""
    name, nd = spec.name, spec.nd
    if name.startswith("max_pool"):
        return (f"max_pool{nd}d_with_indices" if params.get("return_indices") else f"max_pool{nd}d"), "max_pool"
    if name.startswith(("avg_pool", "lp_pool")):
        return f"avg_pool{nd}d", "avg_pool"
    if name.startswith("conv_transpose"):
        return name, "conv_transpose"
    if name.startswith("adaptive"):
        return name, "adaptive"
    return {"unfold": ("im2col", "unfold"), "fold": ("col2im", "fold")}.get(name, (name, name))


def _bool_error(spec, params: dict, name: str, at: int) -> TorchWouldRaise:
    fn, family = _parser_fn(spec, params)
    v = params[name]
    if spec.family in ("conv", "patch"):
        # F.convNd has overloads: the parser lists the argument types it got.
        pad = params.get("padding", 0)
        pad_t = "str" if isinstance(pad, str) and params.get("padding_mode", "zeros") == "zeros" else "tuple"
        groups = "bool" if isinstance(params.get("groups", 1), bool) else "int"
        fn = f"conv{spec.nd}d"
        msg = (f"{fn}() received an invalid combination of arguments - got (Tensor, Parameter, Parameter, tuple, "
               f"{pad_t}, tuple, {groups}), but expected one of:")
    else:
        pos = _POSITIONS.get(family, {}).get(name)
        if pos is None:
            raise UsageError(f"{name} must be an int, not a bool", where=name, got=v)
        # Modules that wrap the value in a tuple (_single/_pair, Unfold/Fold, ConvTranspose) or
        # a tuple given by the user: the element form; a bare scalar: "not bool".
        wrapped = family in ("conv_transpose", "unfold", "fold") or spec.name == "avg_pool1d"
        tuple_arg = family not in ("pixel_shuffle", "pixel_unshuffle", "flatten") and not (
            family == "conv_transpose" and name == "groups")
        what = "tuple of ints" if tuple_arg else "int"
        if tuple_arg and (at >= 0 or wrapped):
            msg = f"{fn}(): argument '{name}' (position {pos}) must be {what}, but found element of type bool at pos {max(at, 0)}"
        else:
            msg = f"{fn}(): argument '{name}' (position {pos}) must be {what}, not bool"
    return TorchWouldRaise(f"{name}={v!r}: torch's argument parser does not take a bool here", torch_exception="TypeError",
                           torch_message=msg, rule="§0", where=name, got=repr(v),
                           suggestions=[f"{name}={int(v) if isinstance(v, bool) else tuple(int(x) for x in v)!r}"])


def normalise(spec, params: dict) -> dict:
    """``params`` with numpy ints as ints (and accepted bools as ints); raise where the parser would."""
    out = dict(params)
    for name in INT_PARAMS:
        if name not in out or out[name] is None:
            continue
        v = out[name]
        if (name == "output_size" and spec.family == "adaptive" and spec.nd in (2, 3) and _is_numpy_int(v)):
            raise TorchWouldRaise("output_size is a numpy integer: F.adaptive_*_pool2d/3d only take a Python int "
                                  "or a tuple", torch_exception="TypeError",
                                  torch_message=f"object of type '{_type_name(v)}' has no len()", rule="§6",
                                  where="output_size", got=repr(v), suggestions=[f"output_size={int(v)}"])
        if name == "divisor_override" and (isinstance(v, (bool, float))):
            raise TorchWouldRaise("divisor_override must be an int", torch_exception="TypeError",
                                  torch_message=f"avg_pool{spec.nd}d(): argument 'divisor_override' (position 7) must "
                                                f"be int, not {type(v).__name__}", rule="§4", where="divisor_override",
                                  got=v, suggestions=[f"divisor_override={int(v)}"])
        v = _to_int(v, name)
        at = _first_bool(v)
        if at is not None:
            if name in _BOOL_OK.get(spec.family, ()):
                v = type(v)(int(x) for x in v) if isinstance(v, (tuple, list)) else int(v)
            elif spec.family != "upsample":  # upsample words a bool size itself (upsample.py)
                raise _bool_error(spec, out, name, at)
        out[name] = v
    return out


def input_shape(shape: Any) -> Tuple[int, ...]:
    """The input shape as ints (numpy ints accepted; floats, bools and sizes ≥ 2**63 refused)."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise UsageError("the input shape must be a sequence of ints", where="input", got=repr(shape)) from None
    out = []
    for v in dims:
        if isinstance(v, bool) or not (isinstance(v, int) or _is_numpy_int(v)):
            raise UsageError(f"an input shape holds ints, got {v!r}", where="input", got=repr(shape))
        v = operator.index(v)
        if v > INT64_MAX:
            raise UsageError(f"an input size of {v} does not fit in a 64-bit integer", where="input", got=str(v))
        out.append(v)
    return tuple(out)


def int32_args(*args: Any) -> None:
    """ATen's 2-D/3-D pooling kernels keep kernel, stride, padding and dilation in a C ``int``."""
    for v in args:
        for x in v if isinstance(v, tuple) else (v,):
            if not -(1 << 31) <= x < (1 << 31):
                raise TorchWouldRaise(
                    f"{x} does not fit in a 32-bit int, which torch's pooling kernels use for kernel_size, stride, "
                    "padding and dilation", torch_exception="RuntimeError",
                    torch_message="value cannot be converted to type int without overflow", rule="§3.3",
                    where="kernel_size/stride/padding/dilation", expected="< 2**31", got=x,
                    suggestions=["values below 2**31 (2147483647)"])
