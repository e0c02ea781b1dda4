"""The spec's data model (plain dataclasses) and the checks on YAML values (only device names need torch).

See :mod:`layerlab.spec` for the format. Every check raises :class:`SpecError` with the
``file:line:col`` of the offending value, what was expected and, for names, a did-you-mean.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from layerlab.errors import SpecError
from layerlab.spec.limits import MAX_INT
from layerlab.spec.load import Marks

TOP_KEYS = ("layer", "build", "args", "block", "input", "inputs", "seed", "dtype", "device", "mode", "backward",
            "name", "description")
ITEM_KEYS = ("layer", "build", "args", "block", "name", "repeat")
INPUT_KEYS = ("shape", "dtype", "device", "requires_grad", "init", "low", "high", "same_as", "causal",
              "key_padding", "padding_mask", "value", "file", "tuple", "list", "dict")
OBJECT_KEYS = ("class", "args")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
DTYPE_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int64",
                 "fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16"}
INITS = ("randn", "rand", "zeros", "ones", "arange")


@dataclass
class LayerNode:
    """One layer: ``name`` as written, its constructor ``args`` (positional) and ``kwargs``."""

    name: str
    args: List[Any]
    kwargs: Dict[str, Any]
    where: str
    path: tuple
    child_name: Optional[str] = None
    repeat: int = 1
    resolved: Any = None
    args_given: bool = True


@dataclass
class ObjectArg:
    """A constructor argument written ``{class: NAME, args: {…}}``: built (recursively) before the call."""

    name: str
    resolved: Any
    args: List[Any]
    kwargs: Dict[str, Any]
    where: str


@dataclass
class BlockNode:
    """Layers run in sequence (an ``nn.Sequential``); items may be blocks again."""

    items: List[Union["LayerNode", "BlockNode"]]
    where: str
    path: tuple
    child_name: Optional[str] = None
    repeat: int = 1


@dataclass
class InputSpec:
    """One forward argument: generated tensor, same tensor as another input, mask, or literal."""

    name: str
    where: str
    shape: Optional[List[int]] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    requires_grad: Optional[bool] = None
    init: str = "randn"
    low: Optional[int] = None
    high: Optional[int] = None
    same_as: Optional[str] = None
    causal: Optional[List[int]] = None
    key_padding: Optional[Dict[str, Any]] = None
    value: Any = None
    literal: bool = False
    device_where: Optional[str] = None
    #: ``{padding_mask: …}``: ``{"lengths", "size", "convention"}`` (``keep``: 1 = token; ``ignore``: True = pad)
    padding: Optional[Dict[str, Any]] = None
    #: ``{value: [[1, 0]]}``: ``value`` (nested lists of numbers) becomes a tensor
    tensor: bool = False
    #: ``{file: ids.npy}``: the file's absolute path (``.pt``/``.pth`` or ``.npy``)
    file: Optional[str] = None
    #: ``{tuple: […]}``, ``{list: […]}`` or ``{dict: {…}}``: the container and its entries (each an input)
    container: Optional[str] = None
    items: Optional[List["InputSpec"]] = None


@dataclass
class Spec:
    """A validated spec: what to build, what to feed it, and how to run it."""

    root: Union[LayerNode, BlockNode]
    inputs: List[InputSpec]
    source: str
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "train"
    backward: bool = True
    title: Optional[str] = None
    description: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)
    #: where the device was chosen (``file:line:col`` of ``device:``, or ``--device``)
    device_where: Optional[str] = None
    #: the spec (``dtype:``) or ``--dtype`` asked for a dtype: only then is the model cast to it
    dtype_given: bool = False
    #: build on torch's meta device (shapes only, no storage): see :func:`layerlab.spec.build`
    meta: bool = False


def did_you_mean(name: Any, options: Sequence[str]) -> Optional[str]:
    close = difflib.get_close_matches(str(name), list(options), n=3, cutoff=0.6)
    return ("did you mean " + " or ".join(map(repr, close)) + "?") if close else None


def check_keys(mapping: Dict, known: Sequence[str], marks: Marks, path: tuple, what: str) -> None:
    for key in mapping:
        if key not in known:
            raise SpecError(
                f"unknown key {key!r} in {what}", where=marks(*path, key),
                expected="one of " + ", ".join(known), got=key,
                hint=did_you_mean(key, known),
            )


def type_error(what: str, value: Any, expected: str, where: str, hint: Optional[str] = None) -> SpecError:
    return SpecError(
        f"{what} must be {expected}, got {type(value).__name__} {value!r}", where=where,
        expected=expected, got=value, hint=hint,
    )


def want_int(value: Any, what: str, where: str, minimum: Optional[int] = None, maximum: Optional[int] = None,
             hint: Optional[str] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise type_error(what, value, "an integer", where)
    if minimum is not None and value < minimum:
        raise SpecError(f"{what} must be ≥ {minimum}, got {value}", where=where, expected=f"≥ {minimum}", got=value)
    if maximum is not None and value > maximum:
        raise SpecError(f"{what} must be ≤ {maximum:,}, got {value:,}", where=where, expected=f"≤ {maximum:,}",
                        got=value, hint=hint)
    return value


def want_seed(value: Any, what: str, where: str) -> int:
    """A seed torch takes everywhere: 0 ≤ seed ≤ 2**63 − 1 (int64)."""
    return want_int(value, what, where, minimum=0, maximum=MAX_INT,
                    hint="seeds are int64: pick a smaller number (any one is as good)")


def want_bool(value: Any, what: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise type_error(what, value, "true or false", where)
    return value


def want_str(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise type_error(what, value, "a string", where)
    return value


def want_device(value: Any, what: str, where: str) -> str:
    """A device name torch parses (``cpu``, ``cuda:1``, ``mps``); whether this machine has it is
    judged when the model is moved there (the error then points back to ``where``)."""
    text = want_str(value, what, where).strip()
    import torch  # the one check here that needs torch: its own parser of device names

    try:
        torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise SpecError(f"unknown device {text!r} in {what}", where=where, expected="cpu, cuda, cuda:1, mps",
                        got=text, hint=did_you_mean(text, ("cpu", "cuda", "mps"))) from None
    return text


def want_dtype(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise type_error(what, value, "a dtype name", where, hint="e.g. float32, float64, int64, bool")
    name = value.strip().replace("torch.", "")
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise SpecError(
            f"unknown dtype {value!r} in {what}", where=where, expected="one of " + ", ".join(DTYPES), got=value,
            hint=did_you_mean(name, DTYPES),
        )
    return name


def want_shape(value: Any, what: str, where: str) -> List[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise type_error(what, value, "a list of integers like [2, 3, 32, 32]", where)
    if any(v < 0 for v in value):
        raise SpecError(f"{what} has a negative size: {value}", where=where, got=value)
    numel = 1
    for v in value:
        numel *= v
    if numel > MAX_INT:
        raise SpecError(
            f"{what} {value} has {numel:.3g} elements; torch counts elements in int64 (at most {MAX_INT:.3g})",
            where=where, expected=f"a product of sizes ≤ {MAX_INT:,}", got=value,
            hint="use the smallest shape that shows what you want to see (e.g. batch 2)",
        )
    return list(value)


def want_mode(value: Any, where: str) -> str:
    if value not in ("train", "eval"):
        raise SpecError(
            f"mode must be 'train' or 'eval', got {value!r}", where=where, expected="train | eval", got=value,
            hint=did_you_mean(value, ("train", "eval")),
        )
    return value
