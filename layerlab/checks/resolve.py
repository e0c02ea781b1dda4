"""TARGET → (module, inputs, reference) for the commands that take what ``layerlab gradcheck`` takes.

``layerlab export-check`` and ``layerlab profile`` accept the same TARGET as gradcheck: a registry
name, a YAML spec, or ``--all``. This module resolves one without running any check, by the same
steps :mod:`layerlab.checks.targets` takes (its helpers are called, not copied): a registry layer is
built from its entry (seeded) with its torch.nn reference; a spec is validated with the gradcheck
keys (``reference:``, ``weight_map:``, ``tags:``, …) taken off first, and its reference is the spec's
``reference:`` or, for a registry layer, the registry's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["Resolved", "resolve_entry", "resolve_spec", "is_spec_path"]


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
    """

    target: str
    module: Any
    args: List[Any]
    reference: Any = None
    reference_output: Optional[str] = None
    tags: frozenset = frozenset()
    seed: int = 0
    batch_dims: Dict[str, Optional[int]] = field(default_factory=dict)


def is_spec_path(target: str) -> bool:
    """Does TARGET name a spec file rather than a registry layer? (gradcheck's rule)"""
    path = Path(target)
    return path.suffix.lower() in (".yaml", ".yml") or path.is_file() or "/" in target or "\\" in target


def resolve_entry(name: str, *, seed: int = 0) -> Resolved:
    """The registry layer ``name`` with its default arguments and inputs, and its reference."""
    from layerlab import registry
    from layerlab.checks import targets

    entry = registry.get(name)
    module, args, reference = targets._build_entry(entry, seed)
    transform = getattr(entry, "reference_output", None) or targets.REFERENCE_OUTPUT.get(entry.name)
    return Resolved(target=entry.name, module=module, args=args, reference=reference, reference_output=transform,
                    tags=frozenset(entry.tags), seed=seed)


def resolve_spec(path: str, *, seed: Optional[int] = None, allow_import: bool = False) -> Resolved:
    """The layer a YAML spec builds, its inputs and its reference (``reference:`` or the registry's)."""
    from layerlab.checks import targets
    from layerlab.errors import SpecError
    from layerlab.spec import build
    from layerlab.spec.load import read_spec_file
    from layerlab.spec.validate import Overrides, validate

    data, marks = read_spec_file(str(path))
    extra: Dict[str, Any] = {}
    if isinstance(data, dict):
        extra = {k: data.pop(k) for k in targets.SPEC_KEYS if k in data}
    base_dir = str(Path(path).resolve().parent)
    spec = validate(data, marks, allow_import=allow_import, base_dir=base_dir,
                    overrides=Overrides(seed=seed) if seed is not None else None)
    built = build(spec)
    module = built.module
    module.train(built.mode == "train")
    ref_spec = extra.get("reference")
    transform = ref_spec.get("output") if isinstance(ref_spec, dict) else None
    reference = None
    if ref_spec is None and not extra.get("weight_map"):
        reference, transform = targets._registry_reference(spec, module, built.seed)
    elif ref_spec is not None:
        reference, _ = targets._spec_reference(ref_spec, data, marks, built.seed, module, allow_import, base_dir)
    tags = extra.get("tags") or []
    tags = [tags] if isinstance(tags, str) else list(tags) if isinstance(tags, list) else []
    if extra.get("causal") is True:
        tags.append("causal")
    batch_dims = extra.get("batch_dims") or {}
    if not isinstance(batch_dims, dict):
        raise SpecError("batch_dims: maps input names to their batch dim", where=marks("batch_dims"),
                        expected="{name: dim}", got=batch_dims)
    return Resolved(target=str(path), module=module, args=targets._built_args(built), reference=reference,
                    reference_output=transform, tags=frozenset(map(str, tags)), seed=built.seed,
                    batch_dims=dict(batch_dims))
