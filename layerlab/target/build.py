"""TARGET → :class:`~layerlab.target.core.Target`: a spec file or a registry name, the same for every command.

One spec format serves every command. The keys only some commands read (:data:`SPEC_KEYS`:
``reference:``, ``weight_map:``, ``tags:``, ``causal:``, ``batch_dims:``) are taken off before the
spec is validated, so ``inspect`` accepts a gradcheck spec and simply does not use its reference.
Command-line values (``--device``, ``--dtype``, ``--seed``, ``--mode``, ``--input-shape``) reach
the build as :class:`~layerlab.spec.Overrides`, for registry layers and specs alike.

:func:`resolve` tells a spec path from a registry name and says what to try when it is neither
(:mod:`layerlab.target.discover`); :func:`for_each_entry` runs one command per registry layer (``--all``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from layerlab.errors import UsageError, debug_enabled
from layerlab.target.bind import Arg, input_tensors
from layerlab.target.core import Target

__all__ = ["SPEC_KEYS", "resolve", "from_entry", "from_spec", "is_spec_path", "for_each_entry"]

#: keys of a spec that only some commands read (gradcheck, profile --vs-reference, export-check's batch)
SPEC_KEYS = ("reference", "weight_map", "tags", "causal", "batch_dims")
#: per-command sections of a spec, kept as written (with their YAML marks) in ``Target.sections``
#: for the command that reads them; every other command ignores them
SECTION_KEYS = ("probes", "train", "precision", "ddp")


def is_spec_path(target: str) -> bool:
    """Does TARGET name a spec file rather than a registry layer?"""
    path = Path(target)
    return path.suffix.lower() in (".yaml", ".yml") or path.is_file() or "/" in target or "\\" in target


def resolve(text: str, *, overrides: Any = None, allow_import: bool = False, strict: bool = False,
            reference: bool = True) -> Target:
    """Build TARGET, a spec file or a registry name; a usage error (exit 2) that says what exists otherwise.

    ``strict`` also checks the keys only gradcheck reads (see :func:`from_spec`); ``reference=False``
    skips building the reference (commands that never use it).
    """
    from layerlab.target import discover

    if is_spec_path(text):
        if not Path(text).exists():  # a device or FIFO exists: the spec reader refuses it with the reason
            raise UsageError(f"no such spec file: {text!r}", where="SPEC", got=text, hint=discover.missing_hint(text))
        return from_spec(text, overrides=overrides, allow_import=allow_import, strict=strict, reference=reference)
    from layerlab import registry

    if registry.find(text) is None:
        raise UsageError(f"{text!r} is neither a spec file nor a layerlab registry name", where="NAME|SPEC",
                         expected="a .yaml file or a registry name", got=text, hint=discover.unknown_name_hint(text))
    return from_entry(text, overrides=overrides, reference=reference)


def _overrides(overrides: Any, seed: Optional[int]) -> Any:
    from layerlab.spec import Overrides

    if overrides is None:
        return Overrides(seed=seed) if seed is not None else None
    if seed is not None and overrides.seed is None:
        return dataclasses.replace(overrides, seed=seed)
    return overrides


def from_entry(name: str, *, seed: Optional[int] = None, overrides: Any = None, reference: bool = True) -> Target:
    """The registry layer ``name`` with its default arguments and inputs, and its reference."""
    from layerlab import registry
    from layerlab.spec import build, spec_from_registry
    from layerlab.target.references import entry_output, seeded_reference

    entry = registry.get(name)
    spec = spec_from_registry(entry.name, overrides=_overrides(overrides, 0 if seed is None else seed))
    built = build(spec)
    module = built.module
    module.train(built.mode == "train")
    ref_cls = entry.load_reference() if reference else None
    ref = None if ref_cls is None else seeded_reference(ref_cls, built.seed, module, (), entry.args)
    return Target(name=entry.name, module=module, args=_built_args(built), reference=ref,
                  reference_output=entry_output(entry), tags=frozenset(entry.tags), seed=built.seed,
                  mode=built.mode, backward=built.backward, title=getattr(spec, "title", None))


def from_spec(path: str, *, seed: Optional[int] = None, overrides: Any = None, allow_import: bool = False,
              strict: bool = False, reference: bool = True) -> Target:
    """The layer a YAML spec builds, its inputs and its reference (``reference:`` or the registry's).

    ``strict`` (gradcheck, the command that uses them) also checks the keys only gradcheck reads:
    ``reference: {output: …}`` must parse, ``weight_map:`` must map names to names, and ``tags:``
    must be a list of names (without ``strict`` a malformed ``tags:`` is ignored). ``batch_dims:``
    is always checked against the built inputs. Errors echo the spec's values terminal-safe
    (:func:`~layerlab.spec.limits.clean_errors`).
    """
    from layerlab.spec.limits import clean_errors

    with clean_errors():
        return _from_spec(path, overrides=_overrides(overrides, seed), allow_import=allow_import, strict=strict,
                          with_reference=reference)


def _from_spec(path: str, *, overrides: Any, allow_import: bool, strict: bool, with_reference: bool) -> Target:
    from layerlab.errors import SpecError
    from layerlab.spec import build
    from layerlab.spec.limits import clean_text
    from layerlab.spec.load import read_spec_file
    from layerlab.spec.validate import validate
    from layerlab.target.references import registry_reference, spec_reference

    data, marks = read_spec_file(str(path))
    extra: Dict[str, Any] = {}
    if isinstance(data, dict):
        extra = {k: data.pop(k) for k in (*SPEC_KEYS, *SECTION_KEYS) if k in data}
    base_dir = str(Path(path).resolve().parent)
    spec = validate(data, marks, allow_import=allow_import, base_dir=base_dir, overrides=overrides,
                    other_keys=(*SPEC_KEYS, *SECTION_KEYS))
    built = build(spec)
    module = built.module
    module.train(built.mode == "train")
    ref_spec = extra.get("reference")
    weight_map = extra.get("weight_map")
    transform = ref_spec.get("output") if isinstance(ref_spec, dict) else None
    if strict and transform is not None:
        from layerlab.target.references import parse_output_transform

        try:
            parse_output_transform(str(transform))
        except ValueError as exc:
            raise SpecError(str(exc), where=marks("reference", "output")) from None
    ref = None
    if not with_reference:
        pass
    elif ref_spec is None and not weight_map:
        ref, transform = registry_reference(spec, module, built.seed)
    elif ref_spec is not None:
        ref, ref_map = spec_reference(ref_spec, data, marks, built.seed, module, allow_import, base_dir)
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
    return Target(name=clean_text(str(path)), module=module, args=args, reference=ref,
                  reference_output=transform, tags=frozenset(map(str, tags)), seed=built.seed,
                  batch_dims=dict(batch_dims), weight_map=weight_map, mode=built.mode, backward=built.backward,
                  title=getattr(spec, "title", None),
                  sections={k: extra[k] for k in SECTION_KEYS if k in extra}, marks=marks, base_dir=base_dir)


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


def _built_args(built) -> List[Arg]:
    return [Arg(n, v, n in built.kwargs) for n, v in built.inputs.items()]


def _check_batch_dims(batch_dims: Any, args: List[Arg], marks) -> Dict[str, Optional[int]]:
    """``batch_dims:`` → ``{input: dim or None}``: names that are inputs, dims that the input has
    (a negative dim counts from the end and is stored as its positive index)."""
    import torch

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
