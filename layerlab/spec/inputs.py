"""A spec's ``inputs:``: check each entry, generate the tensors, bind them to ``forward``.

An entry is one of (see the README's "The YAML spec"):

* ``{shape: [2, 3, 32, 32]}`` (or just ``[2, 3, 32, 32]``): seeded ``randn`` in the spec's float
  dtype, ``requires_grad: true``; ``init: rand | zeros | ones | arange`` for other values;
* ``{shape: [2, 10], low: 0, high: 1000}``: integer ids in ``[low, high)`` (``int64``);
* ``{same_as: query}``: the very same tensor as another input (self-attention);
* ``{causal: 10}`` or ``{causal: [L, S]}``: torch's causal mask, float ``−inf`` above the diagonal
  (as ``nn.Transformer.generate_square_subsequent_mask``), or ``True`` there with ``dtype: bool``;
* ``{key_padding: [10, 7]}`` (lengths; or ``{lengths: [...], size: S}``): ``(N, S)`` bool mask,
  ``True`` at padding positions (torch's ``key_padding_mask`` meaning: ignore this key);
* a plain scalar (``need_weights: false``) or ``{value: …}`` with a scalar: passed as it is;
* ``{value: [[1, 0]]}`` (a literal tensor), ``{file: x.npy}`` (``.npy``/``.pt``, loaded without
  pickle), ``{padding_mask: {lengths: [7, 5], convention: keep | ignore}}`` and the containers
  ``{tuple: […]}``, ``{list: […]}``, ``{dict: {…}}`` (an LSTM's ``hx: {tuple: [h0, c0]}``): see
  :mod:`layerlab.spec.input_values`.

Binding: an input whose name is a parameter of ``forward`` is passed by that name; the others, in
the order written, fill the parameters no input named, in ``forward``'s order.
"""

from __future__ import annotations

import inspect as pyinspect
import difflib
from typing import Any, Dict, List, Optional, Tuple

from layerlab.errors import SpecError
from layerlab.spec.input_values import (
    CONTAINERS, infer_dtype, load_file, make_literal, make_padding, pack, parse_file, parse_padding, tensor_shape,
)
from layerlab.spec.binding import bind, forward_params  # noqa: F401  (re-exported: where they always were)
from layerlab.spec.limits import MAX_INT, first_line, has_control
from layerlab.spec.load import Marks
from layerlab.spec.schema import (
    INITS, INPUT_KEYS, InputSpec, check_keys, did_you_mean, type_error, want_bool, want_device, want_dtype,
    want_int, want_shape, want_str,
)


def parse_inputs(data: Any, marks: Marks, path: tuple, *, base_dir: Optional[str] = None) -> List[InputSpec]:
    """Check an ``inputs:`` mapping (``path`` is where it sits in the file; files are relative to ``base_dir``)."""
    if not isinstance(data, dict) or not data:
        raise type_error("inputs", data, "a mapping of input name → {shape: […], …}", marks(*path),
                         hint="inputs: {x: {shape: [2, 3, 32, 32]}}")
    for name in data:
        if not isinstance(name, str) or not name.strip() or has_control(name):
            raise SpecError(f"input names are plain names like x or attn_mask, got {name!r}",
                            where=marks(*path, name), hint="name the input after forward's parameter")
    specs = [parse_input(str(name), value, marks, path + (name,), base_dir=base_dir) for name, value in data.items()]
    names = [s.name for s in specs]
    for spec in specs:
        if spec.same_as is not None and spec.same_as not in names:
            raise SpecError(
                f"input {spec.name!r} is same_as {spec.same_as!r}, which is not an input", where=spec.where,
                expected=names, got=spec.same_as, hint=did_you_mean(spec.same_as, names),
            )
    by_name = {s.name: s for s in specs}
    _check_padding_against_ids(specs)
    for spec in specs:
        seen = {spec.name}
        target = spec
        while target.same_as is not None:
            if target.same_as in seen:
                raise SpecError(f"input {spec.name!r}: same_as goes round in a circle", where=spec.where,
                                got=sorted(seen))
            seen.add(target.same_as)
            target = by_name[target.same_as]
    return specs


def _check_padding_against_ids(specs: List[InputSpec]) -> None:
    """A padding mask (``padding_mask:``/``key_padding:``) must have one length per sample of the
    token ids it pads, and no length beyond their sequence: ``attention_mask`` lengths [9, 5] for
    ``input_ids`` [3, 8] would build a (2, 9) mask that fails deep inside the model. The ids a mask
    pads are the ones with its prefix (``decoder_attention_mask`` → ``decoder_input_ids``)."""
    ids = [s for s in specs if s.shape is not None and len(s.shape) == 2 and s.dtype is not None
           and s.dtype.startswith(("int", "uint"))]
    for spec in specs:
        pad = spec.padding or spec.key_padding
        if pad is None or not ids:
            continue
        prefix = spec.name
        for suffix in ("attention_mask", "key_padding_mask", "padding_mask", "mask"):
            if prefix.endswith(suffix):
                prefix = prefix[: -len(suffix)]
                break
        pairs = [s for s in ids if s.name.startswith(prefix) and (prefix or "_" not in s.name.replace("input_ids", ""))]
        paired = pairs[0] if len(pairs) == 1 else None
        lengths, size = pad["lengths"], pad["size"]
        B = ids[0].shape[0]
        T = paired.shape[1] if paired is not None else None
        if len(lengths) != B or (T is not None and size != T):
            other = paired or ids[0]
            raise SpecError(
                f"input {spec.name!r}: the padding mask is ({len(lengths)}, {size}) but {other.name!r} is "
                f"{list(other.shape)}: give one length per sample" + (f", each ≤ {T}" if T is not None else ""),
                where=spec.where, expected=f"{B} lengths" + (f", size {T}" if T is not None else ""),
                got={"lengths": lengths, "size": size},
                hint=f"e.g. lengths: {[T or size] + [max(1, (T or size) - 2)] * (B - 1)}"
                     + (f", size: {T}" if T is not None and size != T else ""))


def parse_input(name: str, value: Any, marks: Marks, path: tuple, *, base_dir: Optional[str] = None,
                nested: bool = False) -> InputSpec:
    where = marks(*path)
    spec = InputSpec(name=name, where=where)
    if isinstance(value, list):
        spec.shape = want_shape(value, f"input {name!r}", where)
        return spec
    if not isinstance(value, dict):
        spec.value, spec.literal = value, True
        return spec
    check_keys(value, INPUT_KEYS, marks, path, f"input {name!r}")
    at = lambda key: marks(*path, key)  # noqa: E731
    container = [k for k in CONTAINERS if k in value]
    if container:
        return _parse_container(spec, value, container[0], marks, path, base_dir)
    if "value" in value:
        return _parse_value(spec, value, at)
    if "same_as" in value and nested:
        raise SpecError(f"input {name!r}: same_as names a top-level input; inside a tuple/list/dict, write the "
                        "entry itself", where=at("same_as"))
    if "same_as" in value:
        extra = [k for k in value if k != "same_as"]
        if extra:
            raise SpecError(f"input {name!r}: same_as takes the other input as it is; remove {extra[0]!r}",
                            where=at(extra[0]))
        spec.same_as = want_str(value["same_as"], f"input {name!r} same_as", at("same_as"))
        return spec
    _common_keys(spec, value, name, at)
    if "causal" in value or "key_padding" in value or "padding_mask" in value:
        _parse_mask(spec, value, at)
        return spec
    if "file" in value:
        other = [k for k in value if k not in ("file", "dtype", "device", "requires_grad")]
        if other:
            raise SpecError(f"input {name!r}: a file input takes only dtype, device and requires_grad; remove "
                            f"{other[0]!r}", where=at(other[0]))
        parse_file(spec, value["file"], at("file"), base_dir)
        return spec
    if "shape" not in value:
        raise SpecError(
            f"input {name!r} needs a shape", where=where,
            hint="add shape: [N, …], or use same_as / causal / key_padding / value",
        )
    spec.shape = want_shape(value["shape"], f"input {name!r} shape", at("shape"))
    if "init" in value:
        if value["init"] not in INITS:
            raise SpecError(
                f"input {name!r}: unknown init {value['init']!r}", where=at("init"),
                expected="one of " + ", ".join(INITS), got=value["init"], hint=did_you_mean(value["init"], INITS),
            )
        spec.init = value["init"]
    if "low" in value or "high" in value:
        if "high" not in value:
            raise SpecError(f"input {name!r}: integer ids need high (exclusive)", where=at("low"),
                            hint="e.g. low: 0, high: 1000 for a vocabulary of 1000")
        spec.high = want_int(value["high"], f"input {name!r} high", at("high"), minimum=-MAX_INT, maximum=MAX_INT)
        spec.low = want_int(value.get("low", 0), f"input {name!r} low", at("low"), minimum=-MAX_INT, maximum=MAX_INT)
        if spec.low >= spec.high:
            raise SpecError(f"input {name!r}: low must be < high", where=at("high"), got=[spec.low, spec.high])
        spec.dtype = spec.dtype or "int64"
    if spec.dtype in ("int64", "int32", "int16", "int8", "uint8") and spec.high is None and spec.init in ("randn", "rand"):
        raise SpecError(f"input {name!r} is an integer tensor: give its range with high (and low)",
                        where=at("dtype"), hint="e.g. low: 0, high: 1000")
    if spec.requires_grad and spec.dtype is not None and not spec.dtype.startswith(("float", "bfloat")):
        raise SpecError(f"input {name!r}: only floating tensors can require grad", where=at("requires_grad"),
                        got=spec.dtype)
    return spec


def _common_keys(spec: InputSpec, value: Dict, name: str, at) -> None:
    """``dtype:``, ``device:`` and ``requires_grad:``, which every kind of tensor input takes."""
    if "dtype" in value:
        spec.dtype = want_dtype(value["dtype"], f"input {name!r} dtype", at("dtype"))
    if "device" in value:
        spec.device = want_device(value["device"], f"input {name!r} device", at("device"))
        spec.device_where = at("device")
    if "requires_grad" in value:
        spec.requires_grad = want_bool(value["requires_grad"], f"input {name!r} requires_grad", at("requires_grad"))


def _parse_mask(spec: InputSpec, value: Dict, at) -> None:
    name = spec.name
    if sum(k in value for k in ("causal", "key_padding", "padding_mask")) > 1:
        raise SpecError(f"input {name!r}: one mask per input (causal, key_padding or padding_mask)", where=at("causal"))
    if "padding_mask" in value:
        parse_padding(spec, value["padding_mask"], at("padding_mask"))
    elif "causal" in value:
        size = value["causal"]
        shape = want_shape(size, f"input {name!r} causal", at("causal"))
        if len(shape) == 1:
            shape = shape * 2
        if len(shape) != 2:
            raise SpecError(f"input {name!r}: causal is L or [L, S]", where=at("causal"), got=size)
        spec.causal = shape
    else:
        kp = value["key_padding"]
        if isinstance(kp, list):
            kp = {"lengths": kp}
        if not isinstance(kp, dict) or "lengths" not in kp:
            raise type_error(f"input {name!r} key_padding", kp, "a list of lengths or {lengths: […], size: S}",
                             at("key_padding"))
        lengths = want_shape(kp["lengths"], f"input {name!r} key_padding lengths", at("key_padding"))
        size = want_int(kp.get("size", max(lengths or [0])), f"input {name!r} key_padding size", at("key_padding"), 1,
                        maximum=MAX_INT)
        if max(lengths or [0]) > size:
            raise SpecError(f"input {name!r}: a length exceeds size {size}", where=at("key_padding"), got=lengths)
        spec.key_padding = {"lengths": lengths, "size": size}
    other = [k for k in value if k not in ("causal", "key_padding", "padding_mask", "dtype", "device")]
    if other:
        raise SpecError(f"input {name!r}: a generated mask takes only dtype and device; remove {other[0]!r}",
                        where=at(other[0]))
    if spec.padding is None and spec.dtype is not None and spec.dtype not in ("bool", "float32", "float64", "float16",
                                                                              "bfloat16"):
        raise SpecError(f"input {name!r}: a mask is bool or floating", where=at("dtype"), got=spec.dtype)
    spec.requires_grad = False


def _parse_container(spec: InputSpec, value: Dict, kind: str, marks: Marks, path: tuple,
                     base_dir: Optional[str]) -> InputSpec:
    """``{tuple: [...]}`` / ``{list: [...]}`` / ``{dict: {...}}``: each entry an input of its own."""
    name = spec.name
    other = [k for k in value if k != kind]
    if other:
        raise SpecError(f"input {name!r}: {kind}: holds the entries; put {other[0]!r} on an entry",
                        where=marks(*path, other[0]))
    entries = value[kind]
    at = path + (kind,)
    if kind == "dict":
        if not isinstance(entries, dict) or not all(isinstance(k, str) for k in entries):
            raise type_error(f"input {name!r} dict", entries, "a mapping of name → input", marks(*at))
        pairs = list(entries.items())
    else:
        if not isinstance(entries, list):
            raise type_error(f"input {name!r} {kind}", entries, "a list of inputs", marks(*at),
                             hint=f"{kind}: [{{shape: [2, 4, 64]}}, {{shape: [2, 4, 64]}}]")
        pairs = list(enumerate(entries))
    spec.container = kind
    spec.items = [parse_input(f"{name}.{k}" if kind == "dict" else f"{name}[{k}]", v, marks, at + (k,),
                              base_dir=base_dir, nested=True) for k, v in pairs]
    spec.value = [str(k) for k, _ in pairs]  # the keys of a dict (positions otherwise)
    return spec


def _parse_value(spec: InputSpec, value: Dict, at) -> InputSpec:
    """``{value: …}``: a scalar alone as it is; nested lists (or a scalar with ``dtype:``) a tensor."""
    name = spec.name
    other = [k for k in value if k not in ("value", "dtype", "device", "requires_grad")]
    if other:
        raise SpecError(f"input {name!r}: value takes only dtype, device and requires_grad; remove {other[0]!r}",
                        where=at(other[0]))
    spec.value = value["value"]
    if not isinstance(spec.value, list) and len(value) == 1:
        spec.literal = True  # a Python value: need_weights: {value: false}
        return spec
    tensor_shape(spec.value, f"input {name!r} value", at("value"))
    spec.tensor = True
    _common_keys(spec, value, name, at)
    if "requires_grad" in value:
        dtype = spec.dtype or infer_dtype(spec.value)
        if spec.requires_grad and dtype is not None and not dtype.startswith(("float", "bfloat")):
            raise SpecError(f"input {name!r}: only floating tensors can require grad", where=at("requires_grad"),
                            got=dtype)
    return spec


def make_inputs(specs: List[InputSpec], *, seed: int, dtype: str, device: str,
                device_where: Optional[str] = None) -> Dict[str, Any]:
    """Generate every input (in order, from one seeded generator) → ``{name: value}``.

    An input torch cannot make (a device this machine lacks) is a :class:`SpecError` at the
    ``device:`` that chose it (the input's own, else ``device_where``), else at the input.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    values: Dict[str, Any] = {}
    for spec in specs:
        if spec.same_as is None:
            try:
                values[spec.name] = _make_value(spec, gen, dtype, device)
            except (RuntimeError, AssertionError, ValueError) as exc:
                at = spec.device_where if spec.device is not None else device_where
                raise SpecError(
                    f"cannot create input {spec.name!r} on device {spec.device or device!r}: {first_line(exc)}",
                    where=at or spec.where, hint="use --device cpu, or a device this machine has",
                ) from None
    by_name = {s.name: s for s in specs}
    for spec in specs:
        target = spec
        while target.same_as is not None:  # parse_inputs rules out circles
            target = by_name[target.same_as]
        values[spec.name] = values[target.name]
    return {s.name: values[s.name] for s in specs}


def _make_value(spec: InputSpec, gen, default_dtype: str, default_device: str) -> Any:
    """One input's value: literal, container (entries in order from the same generator) or tensor."""
    if spec.literal:
        return spec.value
    if spec.items is not None:
        return pack(spec.container, spec.value, [_make_value(s, gen, default_dtype, default_device) for s in spec.items])
    device = spec.device or default_device
    if spec.tensor:
        return make_literal(spec, default_dtype, device)
    if spec.file is not None:
        return load_file(spec, default_dtype, device)
    if spec.padding is not None:
        return make_padding(spec, device)
    return _make_tensor(spec, gen, default_dtype, default_device)


def _make_tensor(spec: InputSpec, gen, default_dtype: str, default_device: str):
    import torch

    device = spec.device or default_device
    if spec.causal is not None:
        L, S = spec.causal
        upper = torch.ones(L, S, dtype=torch.bool).triu(diagonal=1)
        name = spec.dtype or default_dtype
        t = upper if name == "bool" else torch.zeros(L, S, dtype=getattr(torch, name)).masked_fill(upper, float("-inf"))
        return t.to(device)
    if spec.key_padding is not None:
        lengths, size = spec.key_padding["lengths"], spec.key_padding["size"]
        pad = torch.arange(size)[None, :] >= torch.tensor(lengths)[:, None]
        name = spec.dtype or "bool"
        t = pad if name == "bool" else torch.zeros(pad.shape, dtype=getattr(torch, name)).masked_fill(pad, float("-inf"))
        return t.to(device)
    name = spec.dtype or default_dtype
    dt = getattr(torch, name)
    shape = tuple(spec.shape)
    if spec.high is not None:
        t = torch.randint(spec.low, spec.high, shape, generator=gen, dtype=torch.int64).to(dt)
    elif spec.init == "zeros":
        t = torch.zeros(shape, dtype=dt)
    elif spec.init == "ones":
        t = torch.ones(shape, dtype=dt)
    elif spec.init == "arange":
        t = torch.arange(int(torch.Size(shape).numel())).reshape(shape).to(dt)
    elif name == "bool":
        t = torch.rand(shape, generator=gen) < 0.5
    elif not dt.is_floating_point:
        raise SpecError(f"input {spec.name!r}: integer inputs need low/high", where=spec.where)
    elif spec.init == "rand":
        t = torch.rand(shape, generator=gen, dtype=torch.float32).to(dt)
    else:
        t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
    t = t.to(device)
    wants_grad = spec.requires_grad if spec.requires_grad is not None else (dt.is_floating_point and spec.init != "arange")
    if wants_grad and dt.is_floating_point:
        t.requires_grad_(True)
    return t
