"""What ``layerlab gradcheck`` verifies: a registry layer, a YAML spec, or every registry layer.

Each builds the module, its inputs and its reference, then calls :func:`layerlab.checks.run.verify`'s
machinery. A registry layer is built by the spec package from its entry (seeded) and compared with
the entry's torch.nn reference; a spec is the inspect spec plus the keys in :data:`SPEC_KEYS`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from layerlab.checks.report import CheckResult, MatrixReport, Status, VerifyReport
from layerlab.checks.run import VerifyOptions, verify_args

__all__ = ["verify_entry", "verify_spec", "verify_all", "SPEC_KEYS", "REFERENCE_OUTPUT"]


def verify_entry(name: str, *, deep: bool = False, seed: int = 0, only: Optional[Sequence[str]] = None,
                 slow_cap: int = 1_000_000, compile_backend: str = "inductor") -> VerifyReport:
    """Verify the registry layer ``name`` with its default arguments and inputs against its reference."""
    from layerlab import registry

    entry = registry.get(name)
    module, args, reference = _build_entry(entry, seed)
    opts = VerifyOptions(deep=deep, seed=seed, only=only, slow_cap=slow_cap, compile_backend=compile_backend)
    transform = getattr(entry, "reference_output", None) or REFERENCE_OUTPUT.get(entry.name)
    return verify_args(module, args, reference, None, frozenset(entry.tags), opts, entry.name, {}, transform)


#: registry layers whose output is the reference's in another layout (until LayerEntry carries it)
REFERENCE_OUTPUT = {"patch_embedding": "flatten(2).transpose(1, 2)"}


def _build_entry(entry, seed: int):
    import torch

    from layerlab.spec import build, spec_from_registry
    from layerlab.spec.validate import Overrides

    built = build(spec_from_registry(entry.name, overrides=Overrides(seed=seed)))
    module = built.module
    module.train(built.mode == "train")
    reference = None
    ref_cls = entry.load_reference()
    if ref_cls is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                reference = ref_cls(**entry.args)
            except Exception:  # arguments the reference does not take: align through the layer's to_torch()
                reference = ref_cls
        if isinstance(reference, torch.nn.Module):
            dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
            if dtype is not None:
                reference = reference.to(dtype)
    return module, _built_args(built), reference


def _built_args(built) -> list:
    from layerlab.checks.case import Arg

    return [Arg(n, v, n in built.kwargs) for n, v in built.inputs.items()]


#: keys a gradcheck spec may have on top of the inspect spec's
SPEC_KEYS = ("reference", "weight_map", "tags", "causal", "batch_dims")


def verify_spec(path: str, *, deep: bool = False, seed: Optional[int] = None, only: Optional[Sequence[str]] = None,
                slow_cap: int = 1_000_000, allow_import: bool = False,
                compile_backend: str = "inductor") -> VerifyReport:
    """Verify the layer a YAML spec builds; ``reference:`` names what it should equal.

    ``reference:`` is a layer name as ``layer:`` takes it (``nn.LSTM``, ``LSTM``, a registry name,
    an import path with ``allow_import``) built with the spec's ``args:``, or a mapping
    ``{layer: …, args: {…}, weight_map: {ours: theirs}, output: "flatten(2).transpose(1, 2)"}``.
    ``weight_map:`` may also stand at the top level; ``tags: [causal, …]`` (or ``causal: true``) states
    claims; ``batch_dims: {name: dim}`` fixes a batch-dim guess. Without ``reference:``, a registry
    layer (``layer: lstm``) is compared with its registry reference.
    """
    from pathlib import Path

    from layerlab.errors import SpecError
    from layerlab.spec import build
    from layerlab.spec.load import read_spec_file
    from layerlab.spec.validate import Overrides, validate

    data, marks = read_spec_file(str(path))
    extra: Dict[str, Any] = {}
    if isinstance(data, dict):
        extra = {k: data.pop(k) for k in SPEC_KEYS if k in data}
    overrides = Overrides(seed=seed) if seed is not None else None
    spec = validate(data, marks, allow_import=allow_import, base_dir=str(Path(path).resolve().parent),
                    overrides=overrides)
    built = build(spec)
    module = built.module
    module.train(built.mode == "train")
    ref_spec = extra.get("reference")
    weight_map = extra.get("weight_map")
    transform = ref_spec.get("output") if isinstance(ref_spec, dict) else None
    if transform is not None:
        from layerlab.checks.reference import parse_output_transform

        try:
            parse_output_transform(str(transform))
        except ValueError as exc:
            raise SpecError(str(exc), where=marks("reference", "output")) from None
    reference = None
    if ref_spec is None and not weight_map:
        reference, transform = _registry_reference(spec, module, built.seed)
    if ref_spec is not None:
        reference, ref_map = _spec_reference(ref_spec, data, marks, built.seed, module, allow_import,
                                             str(Path(path).resolve().parent))
        weight_map = ref_map if ref_map is not None else weight_map
    if weight_map is not None and not (isinstance(weight_map, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
        raise SpecError("weight_map must map our parameter names to the reference's", where=marks("weight_map"),
                        expected="{our_name: their_name}", got=weight_map)
    tags = extra.get("tags") or []
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise SpecError("tags: is a list of claims", where=marks("tags"), expected="[causal, recurrent, mixes_batch, "
                        "stochastic]", got=tags)
    if extra.get("causal") is True:
        tags = list(tags) + ["causal"]
    batch_dims = extra.get("batch_dims") or {}
    opts = VerifyOptions(deep=deep, seed=built.seed, only=only, slow_cap=slow_cap, compile_backend=compile_backend)
    return verify_args(module, _built_args(built), reference, weight_map, frozenset(map(str, tags)), opts,
                        str(path), dict(batch_dims), transform)


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
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            ref = ref_cls(*root.args, **root.kwargs)
        except Exception:  # arguments the reference does not take: align through the layer's to_torch()
            ref = ref_cls
    if isinstance(ref, torch.nn.Module):
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
        ref = ref.to(dtype) if dtype is not None else ref
    return ref, getattr(entry, "reference_output", None) or REFERENCE_OUTPUT.get(entry.name)


def _spec_reference(ref_spec: Any, data: Dict[str, Any], marks, seed: int, module, allow_import: bool,
                    base_dir: str) -> Tuple[Any, Optional[Dict[str, str]]]:
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
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    return (ref.to(dtype) if dtype is not None else ref), weight_map


def verify_all(names: Optional[Sequence[str]] = None, *, deep: bool = False, seed: int = 0,
               only: Optional[Sequence[str]] = None, slow_cap: int = 1_000_000,
               progress: Optional[Callable[[str, int, int], None]] = None,
               compile_backend: str = "inductor") -> MatrixReport:
    """Verify every registry layer (or ``names``); ``progress(name, i, n)`` is called before each."""
    from layerlab import registry

    todo = list(names) if names is not None else registry.names()
    t0 = time.perf_counter()
    reports = []
    for i, name in enumerate(todo):
        if progress is not None:
            progress(name, i, len(todo))
        try:
            reports.append(verify_entry(name, deep=deep, seed=seed, only=only, slow_cap=slow_cap,
                                        compile_backend=compile_backend))
        except Exception as exc:  # one layer that cannot even be built must not hide the others
            if os.environ.get("LAYERLAB_DEBUG", "") not in ("", "0", "false", "no"):
                raise
            reports.append(_unbuildable(name, exc))
    if progress is not None:
        progress("", len(todo), len(todo))
    opts = VerifyOptions(deep=deep, only=only)
    return MatrixReport(reports=reports, check_names=opts.selected(), seconds=time.perf_counter() - t0)


def _unbuildable(name: str, exc: Exception) -> VerifyReport:
    from layerlab import registry

    entry = registry.find(name)
    text = str(exc).strip()
    message = getattr(exc, "message", None) or (text.splitlines()[0] if text else "")
    check = CheckResult("runs", Status.FAIL, f"the layer could not be built: {type(exc).__name__}: {message}",
                        where=getattr(exc, "where", None) or name, hint=getattr(exc, "hint", None),
                        details={"exception": type(exc).__name__, "message": str(exc)[:2000]})
    return VerifyReport(target=name, module=entry.target if entry else name,
                        reference=entry.reference if entry else None, checks=[check])
