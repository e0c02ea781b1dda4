"""TARGET → (module, inputs, reference): the one resolution behind gradcheck, export-check and profile.

TARGET is a registry name, a YAML spec, or ``--all``. A registry layer is built from its entry
(seeded) with its torch.nn reference; a spec is validated with the gradcheck keys
(:data:`SPEC_KEYS`: ``reference:``, ``weight_map:``, ``tags:``, …) taken off first, and its
reference is the spec's ``reference:`` or, for a registry layer, the registry's.
:func:`for_each_entry` runs one command per registry layer for ``--all``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from layerlab.errors import debug_enabled

__all__ = ["Resolved", "resolve_entry", "resolve_spec", "is_spec_path", "to_device", "for_each_entry", "SPEC_KEYS",
           "REFERENCE_OUTPUT"]

#: keys a gradcheck spec may have on top of the inspect spec's
SPEC_KEYS = ("reference", "weight_map", "tags", "causal", "batch_dims")

#: registry layers whose output is the reference's in another layout (until LayerEntry carries it)
REFERENCE_OUTPUT = {"patch_embedding": "flatten(2).transpose(1, 2)"}


@dataclass
class Resolved:
    """A target ready to run.

    Attributes:
        target: what the user named (registry name or spec path).
        module: the built layer, in the mode the spec asks for (registry layers: train).
        args: forward arguments (:class:`~layerlab.checks.case.Arg`: name, value, by keyword or not).
        reference: the torch.nn counterpart (an instance), or ``None``.
        reference_output: how the reference's output maps onto the layer's (``flatten(2).transpose(1, 2)``).
        tags: claims from the registry entry or the spec (``causal``, ``recurrent``, …).
        seed: the seed the module and inputs were built with.
        batch_dims: input name → batch dim, where the spec says so.
        weight_map: the spec's ``{our_name: their_name}`` for the reference's weights, or ``None``.
    """

    target: str
    module: Any
    args: List[Any]
    reference: Any = None
    reference_output: Optional[str] = None
    tags: frozenset = frozenset()
    seed: int = 0
    batch_dims: Dict[str, Optional[int]] = field(default_factory=dict)
    weight_map: Optional[Dict[str, str]] = None


def is_spec_path(target: str) -> bool:
    """Does TARGET name a spec file rather than a registry layer?"""
    path = Path(target)
    return path.suffix.lower() in (".yaml", ".yml") or path.is_file() or "/" in target or "\\" in target


def resolve_entry(name: str, *, seed: int = 0) -> Resolved:
    """The registry layer ``name`` with its default arguments and inputs, and its reference."""
    from layerlab import registry
    from layerlab.spec import build, spec_from_registry
    from layerlab.spec.validate import Overrides

    entry = registry.get(name)
    built = build(spec_from_registry(entry.name, overrides=Overrides(seed=seed)))
    module = built.module
    module.train(built.mode == "train")
    ref_cls = entry.load_reference()
    reference = None if ref_cls is None else _seeded_reference(ref_cls, seed, module, (), entry.args)
    return Resolved(target=entry.name, module=module, args=_built_args(built), reference=reference,
                    reference_output=_entry_output(entry), tags=frozenset(entry.tags), seed=seed)


def resolve_spec(path: str, *, seed: Optional[int] = None, allow_import: bool = False,
                 strict: bool = False) -> Resolved:
    """The layer a YAML spec builds, its inputs and its reference (``reference:`` or the registry's).

    ``strict`` (gradcheck, the command that uses them) also checks the keys only gradcheck reads:
    ``reference: {output: …}`` must parse, ``weight_map:`` must map names to names, and ``tags:``
    must be a list of names (without ``strict`` a malformed ``tags:`` is ignored). ``batch_dims:``
    is always checked against the built inputs. Errors echo the spec's values terminal-safe
    (:func:`~layerlab.spec.limits.clean_errors`).
    """
    from layerlab.spec.limits import clean_errors

    with clean_errors():
        return _resolve_spec(path, seed=seed, allow_import=allow_import, strict=strict)


def _resolve_spec(path: str, *, seed: Optional[int], allow_import: bool, strict: bool) -> Resolved:
    from layerlab.errors import SpecError
    from layerlab.spec import build
    from layerlab.spec.load import read_spec_file
    from layerlab.spec.limits import clean_text
    from layerlab.spec.validate import Overrides, validate

    data, marks = read_spec_file(str(path))
    extra: Dict[str, Any] = {}
    if isinstance(data, dict):
        extra = {k: data.pop(k) for k in SPEC_KEYS if k in data}
    base_dir = str(Path(path).resolve().parent)
    spec = validate(data, marks, allow_import=allow_import, base_dir=base_dir,
                    overrides=Overrides(seed=seed) if seed is not None else None)
    built = build(spec)
    module = built.module
    module.train(built.mode == "train")
    ref_spec = extra.get("reference")
    weight_map = extra.get("weight_map")
    transform = ref_spec.get("output") if isinstance(ref_spec, dict) else None
    if strict and transform is not None:
        from layerlab.checks.reference import parse_output_transform

        try:
            parse_output_transform(str(transform))
        except ValueError as exc:
            raise SpecError(str(exc), where=marks("reference", "output")) from None
    reference = None
    if ref_spec is None and not weight_map:
        reference, transform = _registry_reference(spec, module, built.seed)
    elif ref_spec is not None:
        reference, ref_map = _spec_reference(ref_spec, data, marks, built.seed, module, allow_import, base_dir)
        weight_map = ref_map if ref_map is not None else weight_map
    if strict and weight_map is not None and not (isinstance(weight_map, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
        raise SpecError("weight_map must map our parameter names to the reference's", where=marks("weight_map"),
                        expected="{our_name: their_name}", got=weight_map)
    tags = extra.get("tags") or []
    if isinstance(tags, str):
        tags = [tags]
    if strict and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise SpecError("tags: is a list of claims", where=marks("tags"), expected="[causal, recurrent, mixes_batch, "
                        "stochastic]", got=tags)
    tags = list(tags) if isinstance(tags, list) else []
    if extra.get("causal") is True:
        tags.append("causal")
    args = _built_args(built)
    batch_dims = _check_batch_dims(extra.get("batch_dims") or {}, args, marks)
    return Resolved(target=clean_text(str(path)), module=module, args=args, reference=reference,
                    reference_output=transform, tags=frozenset(map(str, tags)), seed=built.seed,
                    batch_dims=dict(batch_dims), weight_map=weight_map)


def to_device(module, args, dev):
    """The module and its inputs (:class:`~layerlab.checks.case.Arg`) on ``dev`` (unchanged when ``dev``
    is ``None``)."""
    if dev is None:
        return module, args
    from layerlab.checks.case import map_args

    return module.to(dev), map_args(args, lambda t: t.detach().to(dev).requires_grad_(t.requires_grad))


_R = TypeVar("_R")


def for_each_entry(names: Optional[Sequence[str]], run: Callable[[str], _R], failed: Callable[[str, Exception], _R],
                   progress: Optional[Callable[[str, int, int], None]] = None) -> Tuple[List[_R], float]:
    """``run(name)`` for every registry layer (or ``names``): ``(results, seconds)``.

    ``progress(name, i, n)`` is called before each layer and ``progress("", n, n)`` at the end. A
    layer whose ``run`` raises gets ``failed(name, exc)`` instead, so it cannot hide the others
    (``LAYERLAB_DEBUG=1`` lets the exception through).
    """
    from layerlab import registry

    todo = list(names) if names is not None else registry.names()
    t0 = time.perf_counter()
    results = []
    for i, name in enumerate(todo):
        if progress is not None:
            progress(name, i, len(todo))
        try:
            results.append(run(name))
        except Exception as exc:
            if debug_enabled():
                raise
            results.append(failed(name, exc))
    if progress is not None:
        progress("", len(todo), len(todo))
    return results, time.perf_counter() - t0


# -- building blocks ---------------------------------------------------------------------------------

def _check_batch_dims(batch_dims: Any, args: list, marks) -> Dict[str, Optional[int]]:
    """``batch_dims:`` → ``{input: dim or None}``: names that are inputs, dims that the input has
    (a negative dim counts from the end and is stored as its positive index)."""
    import torch

    from layerlab.checks.case import input_tensors
    from layerlab.errors import SpecError
    from layerlab.spec.schema import did_you_mean

    if not isinstance(batch_dims, dict):
        raise SpecError("batch_dims: maps input names to their batch dim", where=marks("batch_dims"),
                        expected="{name: dim}", got=batch_dims)
    tensors = {**{a.name: a.value for a in args}, **dict(input_tensors(args))}
    out: Dict[str, Optional[int]] = {}
    for name, dim in batch_dims.items():
        where = marks("batch_dims", name)
        if name not in tensors:
            names = list(tensors)
            raise SpecError(f"batch_dims: {name!r} is not an input", where=where, expected=names, got=name,
                            hint=did_you_mean(name, names) or "use the names under inputs:")
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
            raise SpecError(f"batch_dims: {name} must be a dim (an integer) or null (no batch dim)", where=where,
                            expected="an integer or null", got=dim)
        value = tensors[name]
        if dim is not None and isinstance(value, torch.Tensor):
            ndim = value.dim()
            if not -ndim <= dim < ndim:
                raise SpecError(
                    f"batch_dims: {name} is {dim}, but input {name!r} has {ndim} dim(s) (shape {list(value.shape)})",
                    where=where,
                    expected=f"a dim in {-ndim}…{ndim - 1}" if ndim else "null (a 0-d input has no batch dim)",
                    got=dim, hint="give the index of the batch dim in the input's shape, or null if it has none",
                )
            dim %= ndim
        out[str(name)] = dim
    return out


def _built_args(built) -> list:
    from layerlab.checks.case import Arg

    return [Arg(n, v, n in built.kwargs) for n, v in built.inputs.items()]


def _entry_output(entry) -> Optional[str]:
    return getattr(entry, "reference_output", None) or REFERENCE_OUTPUT.get(entry.name)


def _float_dtype(module) -> Any:
    """The dtype of the module's first floating parameter (``None`` if it has none)."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


def _seeded_reference(ref_cls: Any, seed: int, module, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """``ref_cls(*args, **kwargs)`` built under ``seed``, in ``module``'s float dtype; ``ref_cls``
    itself when it rejects the arguments (the weights are then aligned through the layer's ``to_torch()``)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            reference = ref_cls(*args, **kwargs)
        except Exception:  # arguments the reference does not take: align through the layer's to_torch()
            reference = ref_cls
    if isinstance(reference, torch.nn.Module):
        dtype = _float_dtype(module)
        if dtype is not None:
            reference = reference.to(dtype)
    return reference


def _registry_reference(spec, module, seed: int) -> Tuple[Any, Optional[str]]:
    """A spec whose layer is a registry layer is compared with that entry's reference by default."""
    from layerlab import registry
    from layerlab.spec.schema import LayerNode

    root = spec.root
    if not isinstance(root, LayerNode) or root.repeat != 1 or getattr(root.resolved, "kind", None) != "registry":
        return None, None
    entry = registry.find(root.resolved.name)
    if entry is None:
        return None, None
    ref_cls = entry.load_reference()
    if ref_cls is None:
        return None, None
    return _seeded_reference(ref_cls, seed, module, root.args, root.kwargs), _entry_output(entry)


def _spec_reference(ref_spec: Any, data: Dict[str, Any], marks, seed: int, module, allow_import: bool,
                    base_dir: str) -> Tuple[Any, Optional[Dict[str, str]]]:
    """The spec's ``reference:`` built with its ``args:`` (or the spec's), and its ``weight_map:``."""
    import torch

    from layerlab.errors import SpecError
    from layerlab.spec.resolve import resolve_layer

    weight_map = None
    if isinstance(ref_spec, str):
        name, args = ref_spec, data.get("args")
    elif isinstance(ref_spec, dict) and "layer" in ref_spec:
        unknown = [k for k in ref_spec if k not in ("layer", "args", "weight_map", "output")]
        if unknown:
            raise SpecError(f"unknown key {unknown[0]!r} in reference:", where=marks("reference", unknown[0]),
                            expected="layer, args, weight_map, output", got=unknown[0])
        name, args = ref_spec["layer"], ref_spec.get("args", data.get("args"))
        weight_map = ref_spec.get("weight_map")
    else:
        raise SpecError("reference: names the layer this one should equal", where=marks("reference"),
                        expected="a layer name (nn.LSTM) or {layer: …, args: {…}, weight_map: {…}}", got=ref_spec)
    resolved = resolve_layer(str(name), where=marks("reference"), allow_import=allow_import, base_dir=base_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            if isinstance(args, dict):
                ref = resolved.cls(**args)
            elif isinstance(args, list):
                ref = resolved.cls(*args)
            else:
                ref = resolved.cls() if args is None else resolved.cls(args)
        except Exception as exc:
            raise SpecError(f"the reference {resolved.name}(…) rejected its arguments: {exc}",
                            where=marks("reference"), hint="give the reference its own args: under reference:") from None
    dtype = _float_dtype(module)
    return (ref.to(dtype) if dtype is not None else ref), weight_map
