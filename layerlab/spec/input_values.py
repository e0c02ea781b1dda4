"""Inputs that are not generated from a shape: literal tensors, files, padding masks, containers.

* ``{value: [[1, 0], [1, 1]]}`` — a literal tensor (a list of numbers, or nested lists of equal
  lengths). Its dtype: ``dtype:`` if given, else ``int64`` for integers, ``bool`` for true/false
  and the spec's float dtype as soon as one number has a point. ``{value: 3, dtype: int64}`` is a
  0-d tensor; ``{value: 3}`` or ``{value: false}`` alone is passed as the Python value (as before).
* ``{file: ids.npy}`` — a tensor loaded from a ``.npy`` (``numpy.load(allow_pickle=False)``) or a
  ``.pt``/``.pth`` file holding one tensor (``torch.load(weights_only=True)``): neither can run code.
  A relative path is relative to the spec file's directory. Floating data takes the spec's float
  dtype (or the input's ``dtype:``); integers and booleans keep theirs.
* ``{padding_mask: {lengths: [7, 5], size: 8, convention: keep}}`` — a ``(N, S)`` mask of real
  tokens and padding, in the convention named (no default — the two are opposites):
  ``keep`` is Hugging Face's ``attention_mask`` (1 = token, 0 = pad; ``int64``), ``ignore`` is
  torch's ``key_padding_mask`` (``True`` = pad, ignore this key; ``bool``; a float dtype gives
  ``−inf`` there). ``size`` defaults to the longest length.
* ``{tuple: [a, b]}``, ``{list: [a, b]}``, ``{dict: {k: a}}`` — a container whose entries are
  inputs again (any kind above or a shape): an LSTM's ``hx: {tuple: [{shape: [2, 4, 64]},
  {shape: [2, 4, 64]}]}`` is ``(h0, c0)``.

As for generated tensors, a floating tensor requires grad unless ``requires_grad: false``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, List, Optional

from layerlab.errors import SpecError
from layerlab.spec import limits
from layerlab.spec.limits import MAX_INT
from layerlab.spec.schema import InputSpec, type_error, want_int, want_shape

CONTAINERS = ("tuple", "list", "dict")
CONVENTIONS = ("keep", "ignore")
FILE_SUFFIXES = (".npy", ".pt", ".pth")


def tensor_shape(value: Any, what: str, where: str) -> List[int]:
    """The shape of nested lists of numbers; :class:`SpecError` for ragged lists or non-numbers."""
    if isinstance(value, list):
        shapes = [tensor_shape(v, what, where) for v in value]
        if any(s != shapes[0] for s in shapes[1:]):
            raise SpecError(f"{what}: the rows have different lengths ({', '.join(str(s) for s in shapes[:4])})",
                            where=where, hint="a tensor's rows all have the same length")
        return [len(value)] + (shapes[0] if shapes else [])
    if isinstance(value, int) and not -MAX_INT - 1 <= value <= MAX_INT:
        raise SpecError(f"{what}: {value} does not fit int64", where=where, expected="an int64 value",
                        got=value, hint="torch's integers are int64 at most")
    if isinstance(value, (int, float)):  # bool is an int
        return []
    raise type_error(what, value, "numbers, true/false, or nested lists of them", where)


def infer_dtype(value: Any) -> Optional[str]:
    """``int64`` / ``bool`` / ``None`` (= the spec's float dtype) for a literal's numbers."""
    flat: List[Any] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        else:
            flat.append(v)
    if flat and all(isinstance(v, bool) for v in flat):
        return "bool"
    if all(isinstance(v, int) for v in flat):
        return "int64"
    return None


def parse_file(spec: InputSpec, raw: Any, where: str, base_dir: Optional[str]) -> None:
    """Check ``file:``: a ``.npy``/``.pt`` regular file that exists (relative to the spec's directory)."""
    if not isinstance(raw, str) or not raw.strip():
        raise type_error(f"input {spec.name!r} file", raw, "a path to a .npy or .pt file", where)
    path = Path(raw.strip())
    if not path.is_absolute():
        path = Path(base_dir or os.getcwd()) / path
    shown = limits.clean_text(str(path))
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise SpecError(f"input {spec.name!r}: {shown} is not a .npy or .pt file", where=where,
                        expected=", ".join(FILE_SUFFIXES), got=path.suffix or "(no suffix)",
                        hint="save the tensor with numpy.save(...) or torch.save(...)")
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        raise SpecError(f"input {spec.name!r}: no such file {shown}", where=where,
                        hint="a relative path is relative to the spec file's directory") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"input {spec.name!r}: {shown} is not a regular file", where=where)
    spec.file = str(path)


def parse_padding(spec: InputSpec, raw: Any, where: str) -> None:
    """Check ``padding_mask: {lengths: […], size: S, convention: keep | ignore}``."""
    name = spec.name
    if not isinstance(raw, dict) or "lengths" not in raw or "convention" not in raw:
        raise type_error(f"input {name!r} padding_mask", raw, "{lengths: [...], convention: keep | ignore}", where,
                         hint="convention: keep is Hugging Face's attention_mask (1 = token, 0 = pad); "
                              "ignore is torch's key_padding_mask (True = pad)")
    unknown = [k for k in raw if k not in ("lengths", "size", "convention")]
    if unknown:
        raise SpecError(f"input {name!r} padding_mask: unknown key {unknown[0]!r}", where=where,
                        expected="lengths, size, convention", got=unknown[0])
    convention = raw["convention"]
    if convention not in CONVENTIONS:
        raise SpecError(
            f"input {name!r} padding_mask convention must be keep or ignore, got {convention!r}", where=where,
            expected="keep (1 = token, 0 = pad: Hugging Face attention_mask) | ignore (True = pad: torch "
                     "key_padding_mask)", got=convention,
        )
    lengths = want_shape(raw["lengths"], f"input {name!r} padding_mask lengths", where)
    size = want_int(raw.get("size", max(lengths or [0])), f"input {name!r} padding_mask size", where, 1,
                    maximum=MAX_INT)
    if max(lengths or [0]) > size:
        raise SpecError(f"input {name!r}: a length exceeds size {size}", where=where, got=lengths)
    if spec.dtype is not None and spec.dtype not in ("bool", "int64", "int32", "float32", "float64", "float16",
                                                      "bfloat16"):
        raise SpecError(f"input {name!r}: a padding mask is bool, int64/int32 or floating", where=where,
                        got=spec.dtype)
    spec.padding = {"lengths": lengths, "size": size, "convention": convention}
    spec.requires_grad = False


def make_padding(spec: InputSpec, device: str):
    import torch

    p = spec.padding
    pad = torch.arange(p["size"])[None, :] >= torch.tensor(p["lengths"], dtype=torch.int64)[:, None]  # (N, S)
    if p["convention"] == "keep":
        return (~pad).to(getattr(torch, spec.dtype or "int64")).to(device)
    name = spec.dtype or "bool"
    if name == "bool":
        return pad.to(device)
    dt = getattr(torch, name)
    if dt.is_floating_point:
        return torch.zeros(pad.shape, dtype=dt).masked_fill(pad, float("-inf")).to(device)
    return pad.to(dt).to(device)


def make_literal(spec: InputSpec, default_dtype: str, device: str):
    import torch

    name = spec.dtype or infer_dtype(spec.value) or default_dtype
    t = torch.tensor(spec.value, dtype=getattr(torch, name)).to(device)
    return _grad(t, spec)


def load_file(spec: InputSpec, default_dtype: str, device: str):
    """The tensor in ``spec.file``; a file that is not one tensor, or would need pickle, is refused."""
    import torch

    shown = limits.clean_text(spec.file)
    size = os.stat(spec.file).st_size
    free = limits.available_memory()
    if free is not None and size > free:
        raise SpecError(f"input {spec.name!r}: {shown} is {limits.format_bytes(size)}; "
                        f"{limits.format_bytes(free)} of memory is free", where=spec.where)
    if spec.file.lower().endswith(".npy"):
        t = _load_npy(spec, shown)
    else:
        try:
            t = torch.load(spec.file, map_location="cpu", weights_only=True)
        except Exception as exc:  # UnpicklingError for objects, RuntimeError for a damaged file
            refused = "weights_only" in str(exc) or "Unsupported global" in str(exc)
            raise SpecError(
                f"input {spec.name!r}: cannot load {shown}: " + (
                    "it holds Python objects besides tensors, and loading them would run code "
                    "(refused: torch.load(weights_only=True))" if refused else limits.first_line(exc)),
                where=spec.where, hint="save one tensor: torch.save(tensor, path)",
            ) from None
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"input {spec.name!r}: {shown} holds a {type(t).__name__}, not a tensor",
                            where=spec.where, expected="one tensor", got=type(t).__name__,
                            hint="save one tensor per file: torch.save(tensor, path); several inputs → "
                                 "{tuple: [{file: a.pt}, {file: b.pt}]}")
    if spec.dtype is not None:
        t = t.to(getattr(torch, spec.dtype))
    elif t.is_floating_point():
        t = t.to(getattr(torch, default_dtype))
    return _grad(t.to(device), spec)


def _load_npy(spec: InputSpec, shown: str):
    import torch

    try:
        import numpy as np
    except ImportError:
        raise SpecError(f"input {spec.name!r}: reading {shown} needs numpy, which is not installed",
                        where=spec.where, hint="pip install numpy, or save the tensor with torch.save as .pt") from None
    try:
        array = np.load(spec.file, allow_pickle=False)
    except ValueError as exc:
        pickled = "allow_pickle" in str(exc)
        raise SpecError(
            f"input {spec.name!r}: cannot load {shown}: " + (
                "it holds Python objects (pickled), and loading them would run code (refused: allow_pickle=False)"
                if pickled else limits.first_line(exc)),
            where=spec.where, hint="save a numeric array: numpy.save(path, array.astype('float32'))",
        ) from None
    except Exception as exc:
        raise SpecError(f"input {spec.name!r}: cannot load {shown}: {limits.first_line(exc)}",
                        where=spec.where) from None
    if not isinstance(array, np.ndarray):  # an .npz renamed .npy
        raise SpecError(f"input {spec.name!r}: {shown} is not one array", where=spec.where)
    try:
        return torch.from_numpy(np.ascontiguousarray(array).copy())
    except TypeError as exc:
        raise SpecError(f"input {spec.name!r}: {shown} holds {array.dtype} data, which torch has no dtype for",
                        where=spec.where, got=str(array.dtype), hint=limits.first_line(exc)) from None


def _grad(t, spec: InputSpec):
    wants = spec.requires_grad if spec.requires_grad is not None else t.is_floating_point()
    if wants and t.is_floating_point():
        t.requires_grad_(True)
    return t


def pack(container: str, names: List[str], values: List[Any]) -> Any:
    if container == "dict":
        return dict(zip(names, values))
    return tuple(values) if container == "tuple" else list(values)


__all__: List[str] = ["CONTAINERS", "CONVENTIONS", "infer_dtype", "load_file", "make_literal",
                      "make_padding", "pack", "parse_file", "parse_padding", "tensor_shape"]
