"""Loaded YAML data → a checked :class:`Spec`, before anything is built or run.

Checks, each a :class:`SpecError` (exit 2) with ``file:line:col``: the keys at every level (with
did-you-mean), the layer names (resolved to classes; import paths only with ``allow_import``,
or what :mod:`~layerlab.spec.allowlist` accepts without it, arguments that would make such a
builder load code or files refused),
constructor arguments (names, required ones, plain types), the inputs, and that the inputs fit
the model's ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Union

from layerlab.errors import SpecError, UsageError
from layerlab.spec.args import check_args
from layerlab.spec.inputs import bind, parse_input, parse_inputs
from layerlab.spec.load import Marks
from layerlab.spec.resolve import resolve_layer
from layerlab.spec.limits import ECHO_CHARS, MAX_INT, MAX_LAYERS, MAX_REPEAT, MESSAGE_CHARS, clean_text, has_control
from layerlab.spec.schema import (
    ITEM_KEYS, TOP_KEYS, BlockNode, LayerNode, Spec, check_keys, did_you_mean, type_error,
    want_bool, want_device, want_dtype, want_int, want_mode, want_seed, want_shape, want_str, FLOAT_DTYPES,
)


@dataclass
class Overrides:
    """Command-line values that replace the spec's (``None`` keeps the spec's)."""

    device: Optional[str] = None
    dtype: Optional[str] = None
    seed: Optional[int] = None
    mode: Optional[str] = None
    backward: Optional[bool] = None
    input_shapes: List[Tuple[Optional[str], List[int]]] = field(default_factory=list)
    #: build the model on torch's meta device (``inspect --meta`` of a model bigger than the machine)
    meta: bool = False


def validate(
    data: Any,
    marks: Marks,
    *,
    allow_import: bool = False,
    base_dir: Optional[str] = None,
    overrides: Optional[Overrides] = None,
    other_keys: Sequence[str] = (),
) -> Spec:
    """Check ``data`` (from :func:`~layerlab.spec.load.parse_yaml`) and return the :class:`Spec`.

    ``other_keys``: top-level keys the caller read (and removed) itself, such as the per-command
    sections: a misspelt one is then offered as "did you mean" too."""
    if not isinstance(data, dict):
        raise type_error("a spec", data, "a mapping with layer: or block:", marks(),
                         hint="start the file with `layer: Conv2d` or `block:`")
    check_keys(data, (*TOP_KEYS, *other_keys), marks, (), "the spec")
    data = _build_as_layer(data, marks, ())
    if "layer" in data and "block" in data:
        raise SpecError("a spec has layer: or block:, not both", where=marks("block"),
                        hint="put the layer into the block as one of its items")
    if "layer" in data:
        root: Union[LayerNode, BlockNode] = _layer(data["layer"], data.get("args"), marks, ("layer",), ("args",))
    elif "block" in data:
        if "args" in data:
            raise SpecError("args: belongs to a single layer:, not to a block", where=marks("args"),
                            hint="give each block item its own arguments")
        root = _block(data["block"], marks, ("block",))
    else:
        raise SpecError("the spec names no layer", where=marks(), expected="layer: NAME or block: [...]",
                        got=sorted(map(str, data)), hint="add `layer: Conv2d` (with args:) or a `block:` list")
    if "input" in data and "inputs" in data:
        raise SpecError("use input: (one) or inputs: (several), not both", where=marks("inputs"))
    spec = Spec(root=root, inputs=[], source=marks.filename)
    if "input" in data:
        spec.inputs = [parse_input("input", data["input"], marks, ("input",), base_dir=base_dir)]
    elif "inputs" in data:
        spec.inputs = parse_inputs(data["inputs"], marks, ("inputs",), base_dir=base_dir)
    if "seed" in data:
        spec.seed = want_seed(data["seed"], "seed", marks("seed"))
    if "dtype" in data:
        spec.dtype = want_dtype(data["dtype"], "dtype", marks("dtype"))
        spec.dtype_given = True
        if spec.dtype not in FLOAT_DTYPES:
            raise SpecError("the spec's dtype is the floating dtype of the model", where=marks("dtype"),
                            expected=FLOAT_DTYPES, got=spec.dtype, hint="give integer inputs their own dtype")
    if "device" in data:
        spec.device = want_device(data["device"], "the spec's device", marks("device"))
        spec.device_where = marks("device")
    if "mode" in data:
        spec.mode = want_mode(data["mode"], marks("mode"))
    if "backward" in data:
        spec.backward = want_bool(data["backward"], "backward", marks("backward"))
    if "name" in data:  # echoed as the report's title: no terminal control sequences, no megabytes
        spec.title = clean_text(data["name"], limit=ECHO_CHARS)
    if "description" in data:
        spec.description = clean_text(data["description"], limit=MESSAGE_CHARS)
    _check_layer_count(root, marks)
    resolve_all(spec.root, marks, allow_import=allow_import, base_dir=base_dir)
    _default_inputs(spec)
    if overrides is not None:
        apply_overrides(spec, overrides)
    check_inputs(spec, marks)
    return spec


def _build_as_layer(data: dict, marks: Marks, path: tuple) -> dict:
    """``build: NAME`` is ``layer: NAME`` (a word that reads better for a factory)."""
    if "build" not in data:
        return data
    if "layer" in data:
        raise SpecError("build: and layer: say the same thing; keep one", where=marks(*path, "build"))
    return {("layer" if k == "build" else k): v for k, v in data.items()}


def _layer(name: Any, args: Any, marks: Marks, name_path: tuple, args_path: tuple) -> LayerNode:
    where = marks(*name_path)
    if not isinstance(name, str) or not name.strip():
        raise type_error("a layer name", name, "a string (conv2d, Conv2d, nn.GRU, my_module:MyLayer)", where)
    positional, keyword = [], {}
    if args is None:
        pass
    elif isinstance(args, dict):
        keyword = dict(args)
    elif isinstance(args, list):
        positional = list(args)
    else:
        positional = [args]
    return LayerNode(name=name.strip(), args=positional, kwargs=keyword, where=where, path=args_path,
                     args_given=args is not None)


def _block(items: Any, marks: Marks, path: tuple) -> BlockNode:
    if not isinstance(items, list) or not items:
        raise type_error("block", items, "a non-empty list of layers", marks(*path),
                         hint="block:\n  - Conv2d: {in_channels: 3, out_channels: 8, kernel_size: 3}\n  - ReLU")
    return BlockNode(items=[_item(item, marks, path + (i,)) for i, item in enumerate(items)], where=marks(*path),
                     path=path)


def _item(item: Any, marks: Marks, path: tuple) -> Union[LayerNode, BlockNode]:
    if isinstance(item, str):
        return _layer(item, None, marks, path, path)
    if not isinstance(item, dict) or not item:
        raise type_error("a block item", item, "`- Name: {args}`, `- Name` or `- {layer: Name, args: {…}}`",
                         marks(*path))
    if len(item) == 1 and next(iter(item)) not in ("layer", "block", "build"):
        name, args = next(iter(item.items()))
        return _layer(name, args, marks, path + (name,), path + (name,))
    check_keys(item, ITEM_KEYS, marks, path, "a block item")
    name_key = "build" if "build" in item else "layer"
    item = _build_as_layer(item, marks, path)
    if ("layer" in item) == ("block" in item):
        raise SpecError("a block item has layer: or block: (one of them)", where=marks(*path),
                        got=sorted(map(str, item)))
    if "block" in item:
        if "args" in item:
            raise SpecError("args: belongs to layer:, not block:", where=marks(*path, "args"))
        node: Union[LayerNode, BlockNode] = _block(item["block"], marks, path + ("block",))
    else:
        node = _layer(item["layer"], item.get("args"), marks, path + (name_key,), path + ("args",))
    if "name" in item:
        name = want_str(item["name"], "name", marks(*path, "name"))
        if not name or "." in name or has_control(name):
            raise SpecError(f"a layer name may not be empty or contain '.' or control characters, got {name!r}",
                            where=marks(*path, "name"))
        node.child_name = name
    if "repeat" in item:
        node.repeat = want_int(item["repeat"], "repeat", marks(*path, "repeat"), minimum=1, maximum=MAX_REPEAT,
                               hint="repeat builds that many copies of the layer; a few show what one does")
    return node


def _layers(node: Union[LayerNode, BlockNode]) -> int:
    """How many layers ``node`` builds, ``repeat:`` multiplied through the nesting."""
    inner = 1 if isinstance(node, LayerNode) else sum(_layers(item) for item in node.items)
    return node.repeat * inner


def _check_layer_count(root: Union[LayerNode, BlockNode], marks: Marks) -> None:
    count = _layers(root)
    if count > MAX_LAYERS:
        raise SpecError(
            f"the spec builds {count:,} layers (repeat: multiplies through nested blocks); at most "
            f"{MAX_LAYERS:,} are allowed", where=root.where, expected=f"≤ {MAX_LAYERS:,} layers", got=count,
            hint="lower the repeat: counts — a few copies show what a stack of them does",
        )


def resolve_all(node: Union[LayerNode, BlockNode], marks: Marks, *, allow_import: bool, base_dir: Optional[str]) -> None:
    """Resolve every layer name to its class and check its arguments; check child names."""
    if isinstance(node, BlockNode):
        seen = {}
        for item in node.items:
            resolve_all(item, marks, allow_import=allow_import, base_dir=base_dir)
            if item.child_name is not None:
                if item.child_name in seen:
                    raise SpecError(f"two block items are named {item.child_name!r}", where=item.where)
                seen[item.child_name] = item
        return
    node.resolved = resolve_layer(node.name, where=node.where, allow_import=allow_import, base_dir=base_dir)
    if node.resolved.kind == "registry" and not node.args_given:
        from layerlab import registry

        node.kwargs = dict(registry.get(node.resolved.name).args)  # a registry layer's defaults
    else:
        from layerlab.spec.objects import parse_objects

        if not allow_import:  # data that would make a vetted builder load code or files
            from layerlab.spec.argument_safety import check_arguments

            check_arguments(node.args, node.kwargs, marks, node.path,
                            factory=node.resolved.name if node.resolved.kind == "import" else "")
        node.args = [parse_objects(a, marks, node.path + (i,), allow_import=allow_import, base_dir=base_dir)
                     for i, a in enumerate(node.args)]
        node.kwargs = {k: parse_objects(a, marks, node.path + (k,), allow_import=allow_import, base_dir=base_dir)
                       for k, a in node.kwargs.items()}
    check_args(node, node.resolved.cls, marks, node.resolved.name)


def apply_overrides(spec: Spec, ov: Overrides) -> None:
    if ov.seed is not None and not (0 <= ov.seed <= MAX_INT):
        raise UsageError(f"--seed must be between 0 and {MAX_INT:,} (int64), got {ov.seed}", where="--seed",
                         expected=f"0 … {MAX_INT:,}", got=ov.seed, hint="any smaller seed is as good")
    if ov.device is not None:
        try:
            want_device(ov.device, "--device", "--device")
        except SpecError as exc:
            raise UsageError(exc.message, where="--device", expected=exc.expected, got=exc.got,
                             hint=exc.hint) from None
        spec.device_where = "--device"
    for attr in ("device", "seed", "mode", "backward"):
        value = getattr(ov, attr)
        if value is not None:
            setattr(spec, attr, value)
    if ov.dtype is not None:
        spec.dtype = ov.dtype
        spec.dtype_given = True
    if ov.meta:
        spec.meta = True
    shaped = [s for s in spec.inputs if s.shape is not None]
    for name, shape in ov.input_shapes:
        try:
            shape = want_shape(list(shape), "--input-shape", "--input-shape")
        except SpecError as exc:
            raise UsageError(exc.message, where="--input-shape", expected=exc.expected, got=exc.got,
                             hint=exc.hint) from None
        if name is None:
            if not shaped:
                raise UsageError("--input-shape: the spec has no input with a shape", where="--input-shape")
            shaped[0].shape = list(shape)
            continue
        target = next((s for s in shaped if s.name == name), None)
        if target is None:
            names = [s.name for s in shaped]
            raise UsageError(
                f"--input-shape: no input called {name!r}", where="--input-shape", expected=names, got=name,
                hint=did_you_mean(name, names),
            )
        target.shape = list(shape)


def root_class(spec: Spec) -> Optional[type]:
    """The class of the module the spec builds; ``None`` for a factory (known once it has run)."""
    import torch.nn as nn

    root = spec.root
    if isinstance(root, LayerNode) and root.repeat == 1 and getattr(root.resolved, "factory", False):
        return None
    if isinstance(root, LayerNode) and root.repeat == 1:
        return root.resolved.cls
    return nn.Sequential


def _default_inputs(spec: Spec) -> None:
    """A registry layer without inputs in the spec gets its entry's default inputs."""
    root = spec.root
    if spec.inputs or not isinstance(root, LayerNode) or root.resolved.kind != "registry":
        return
    from layerlab import registry

    entry = registry.find(root.resolved.name)
    if entry is not None and entry.inputs:
        spec.inputs = parse_inputs(dict(entry.inputs), Marks.none(f"registry:{entry.name}"), ())


def check_inputs(spec: Spec, marks: Marks) -> None:
    """Inputs present and fitting the root's ``forward`` (a factory's model: when it is built)."""
    cls = root_class(spec)
    if not spec.inputs:
        raise SpecError(
            f"the spec gives no input for {cls.__name__ if cls is not None else spec.root.name}", where=marks(),
            hint="add input: {shape: [N, …]} (one input) or inputs: {name: {shape: […]}, …}",
        )
    if cls is None:
        return
    where = spec.inputs[0].where if len(spec.inputs) == 1 else marks("inputs")
    bind(cls, [s.name for s in spec.inputs], where, cls.__name__, where_of={s.name: s.where for s in spec.inputs})
