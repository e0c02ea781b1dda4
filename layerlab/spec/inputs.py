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
* a plain scalar (``need_weights: false``) or ``{value: …}``: passed as it is.

Binding: an input whose name is a parameter of ``forward`` is passed by that name; the others, in
the order written, fill the parameters no input named, in ``forward``'s order.
"""

from __future__ import annotations

import inspect as pyinspect
import difflib
from typing import Any, Dict, List, Optional, Tuple

from layerlab.errors import SpecError
from layerlab.spec.limits import MAX_INT, first_line, has_control
from layerlab.spec.load import Marks
from layerlab.spec.schema import (
    INITS, INPUT_KEYS, InputSpec, check_keys, did_you_mean, type_error, want_bool, want_device, want_dtype,
    want_int, want_shape, want_str,
)


def parse_inputs(data: Any, marks: Marks, path: tuple) -> List[InputSpec]:
    """Check an ``inputs:`` mapping (``path`` is where it sits in the file)."""
    if not isinstance(data, dict) or not data:
        raise type_error("inputs", data, "a mapping of input name → {shape: […], …}", marks(*path),
                         hint="inputs: {x: {shape: [2, 3, 32, 32]}}")
    for name in data:
        if not isinstance(name, str) or not name.strip() or has_control(name):
            raise SpecError(f"input names are plain names like x or attn_mask, got {name!r}",
                            where=marks(*path, name), hint="name the input after forward's parameter")
    specs = [parse_input(str(name), value, marks, path + (name,)) for name, value in data.items()]
    names = [s.name for s in specs]
    for spec in specs:
        if spec.same_as is not None and spec.same_as not in names:
            raise SpecError(
                f"input {spec.name!r} is same_as {spec.same_as!r}, which is not an input", where=spec.where,
                expected=names, got=spec.same_as, hint=did_you_mean(spec.same_as, names),
            )
    by_name = {s.name: s for s in specs}
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


def parse_input(name: str, value: Any, marks: Marks, path: tuple) -> InputSpec:
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
    if "value" in value:
        if len(value) > 1:
            raise SpecError(f"input {name!r}: value cannot be combined with other keys", where=where)
        spec.value, spec.literal = value["value"], True
        return spec
    if "same_as" in value:
        extra = [k for k in value if k != "same_as"]
        if extra:
            raise SpecError(f"input {name!r}: same_as takes the other input as it is; remove {extra[0]!r}",
                            where=at(extra[0]))
        spec.same_as = want_str(value["same_as"], f"input {name!r} same_as", at("same_as"))
        return spec
    if "dtype" in value:
        spec.dtype = want_dtype(value["dtype"], f"input {name!r} dtype", at("dtype"))
    if "device" in value:
        spec.device = want_device(value["device"], f"input {name!r} device", at("device"))
        spec.device_where = at("device")
    if "requires_grad" in value:
        spec.requires_grad = want_bool(value["requires_grad"], f"input {name!r} requires_grad", at("requires_grad"))
    if "causal" in value or "key_padding" in value:
        _parse_mask(spec, value, at)
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


def _parse_mask(spec: InputSpec, value: Dict, at) -> None:
    name = spec.name
    if "causal" in value:
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
    other = [k for k in value if k not in ("causal", "key_padding", "dtype", "device")]
    if other:
        raise SpecError(f"input {name!r}: a generated mask takes only dtype and device; remove {other[0]!r}",
                        where=at(other[0]))
    if spec.dtype is not None and spec.dtype not in ("bool", "float32", "float64", "float16", "bfloat16"):
        raise SpecError(f"input {name!r}: a mask is bool or floating", where=at("dtype"), got=spec.dtype)
    spec.requires_grad = False


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
        if spec.literal:
            values[spec.name] = spec.value
        elif spec.same_as is None:
            try:
                values[spec.name] = _make_tensor(spec, gen, dtype, device)
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


def forward_params(cls: type) -> Tuple[List[pyinspect.Parameter], bool]:
    """``forward``'s parameters (without ``self``) and whether it takes ``*args``."""
    try:
        params = list(pyinspect.signature(cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return [], True
    return params, any(p.kind is pyinspect.Parameter.VAR_POSITIONAL for p in params)


def bind(cls: type, names: List[str], where: str, display: str,
         where_of: Optional[Dict[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """Match input names to ``cls.forward``'s parameters.

    A name that is a parameter is passed by that name; the other inputs, in the order written,
    take the parameters no input named, in ``forward``'s order (then ``*args``). Returns the
    positional input names and ``{parameter: input name}`` for the keyword ones. Raises
    :class:`SpecError` for an input ``forward`` cannot take, a required parameter left empty, and
    an input whose name is a near-miss of another parameter than the one its position gives it
    (``atn_mask`` would silently become ``key_padding_mask``). ``where_of`` places that error at
    the input's own line.
    """
    params, var_pos = forward_params(cls)
    P = pyinspect.Parameter
    signature = _signature_text(params)
    named = {p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    keyword = {n: n for n in names if n in named}
    positional: List[str] = []
    unnamed = [n for n in names if n not in named]
    # Unnamed inputs fill forward's free parameters in order. They go by position while no
    # named input sits before them (so a reference whose forward names its parameters
    # differently takes them too); after such a gap, by the parameter's name.
    gap = False
    by_position = set()
    bound_to: Dict[str, str] = {}
    for param in (p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)):
        if param.name in keyword:
            gap = True
            continue
        if not unnamed:
            break
        name = unnamed.pop(0)
        bound_to[name] = param.name
        if gap and param.kind is not P.POSITIONAL_ONLY:
            keyword[param.name] = name
        else:
            positional.append(name)
            by_position.add(param.name)
    for name in unnamed:
        if var_pos and not gap:
            positional.append(name)
            bound_to[name] = "*" + next(p.name for p in params if p.kind is P.VAR_POSITIONAL)
        else:
            raise SpecError(
                f"{display}.forward{signature} takes no input named {name!r}", where=where,
                expected=[p.name for p in params], got=names,
                hint=did_you_mean(name, [p.name for p in params]) or "name inputs after forward's parameters",
            )
    for name, param_name in bound_to.items():
        _check_near_miss(name, param_name, [p.name for p in params], (where_of or {}).get(name, where),
                         display, signature)
    filled = set(keyword) | by_position
    missing = [p.name for p in params if p.default is P.empty and p.name not in filled
               and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
    if missing:
        raise SpecError(
            f"missing input {missing[0]!r} for {display}.forward{signature}", where=where,
            expected=[p.name for p in params if p.default is P.empty], got=names,
            hint=f"add it under inputs:, e.g. {missing[0]}: {{shape: […]}} (or same_as: another input)",
        )
    return positional, keyword


def _check_near_miss(name: str, bound: str, params: List[str], where: str, display: str, signature: str) -> None:
    """An input bound by position whose name looks like a typo of *another* parameter is refused."""
    if difflib.SequenceMatcher(None, name, bound.lstrip("*")).ratio() >= _NEAR:
        return
    close = difflib.get_close_matches(name, [p for p in params if p != bound], n=1, cutoff=_NEAR)
    if close:
        raise SpecError(
            f"input {name!r} is not a parameter of {display}.forward{signature}; by position it would be "
            f"passed as {bound!r}", where=where, expected=params, got=name,
            hint=f"did you mean {close[0]!r}? (name the input after the parameter it is for)",
        )


#: how alike an input name and a parameter name must be to count as a typo (atn_mask ~ attn_mask: 0.94)
_NEAR = 0.75


def _signature_text(params: List[pyinspect.Parameter]) -> str:
    shown = [p.name if p.default is pyinspect.Parameter.empty else f"{p.name}=…" for p in params[:6]]
    return "(" + ", ".join(shown) + (", …" if len(params) > 6 else "") + ")"
