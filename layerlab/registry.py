"""Names → layers: layerlab's reference layers, each with its torch.nn reference and defaults.

The table is static data with import paths as strings, so listing or resolving names never
imports torch; :meth:`LayerEntry.load` imports the class when it is really needed.

An entry's ``default_inputs`` use the same mapping as a YAML spec's ``inputs:`` (see README,
"The YAML spec"): ``{"input": {"shape": [2, 3, 16, 16]}}``; several entries for several forward
arguments, in order. Keys: ``shape``, ``dtype``, ``requires_grad``, ``kind`` (``randn`` default,
``randint`` with ``low``/``high``, ``causal_mask``, ``padding_mask``), ``same_as``.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from layerlab.errors import UsageError


@dataclass(frozen=True)
class LayerEntry:
    """One registry layer.

    Attributes:
        name: the registry name (``conv2d``, ``lstm``, ``multihead_attention``).
        target: ``"module.path:ClassName"`` of layerlab's implementation.
        reference: ``"torch.nn:ClassName"`` of its torch counterpart (``None`` if there is none).
        args: default constructor arguments (used when the layer is run by name, no spec).
        inputs: default inputs, as a spec's ``inputs:`` mapping.
        summary: one line shown in listings.
        tags: claims checks can rely on: ``recurrent``, ``causal``, ``mixes_batch``, ``stochastic``.
    """

    name: str
    target: str
    reference: Optional[str]
    args: Dict[str, Any]
    inputs: Dict[str, Dict[str, Any]]
    summary: str = ""
    tags: Tuple[str, ...] = field(default_factory=tuple)

    def load(self):
        """Import and return layerlab's class."""
        return import_target(self.target)

    def load_reference(self):
        """Import and return the torch.nn reference class (or ``None``)."""
        return import_target(self.reference) if self.reference else None


def import_target(target: str):
    """Import ``"package.module:Name"`` (or ``"package.module.Name"``) and return the object."""
    module_name, _, attr = target.partition(":") if ":" in target else target.rpartition(".")
    module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


_ENTRIES: List[LayerEntry] = [
    # Filled by the reference layer library (layerlab/layers/), one entry per layer.
]

REGISTRY: Dict[str, LayerEntry] = {e.name: e for e in _ENTRIES}


def names() -> List[str]:
    return sorted(REGISTRY)


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def find(name: str) -> Optional[LayerEntry]:
    """The entry called ``name`` (case and ``-``/``_`` insensitive), or ``None``."""
    key = _key(name)
    for entry in REGISTRY.values():
        if _key(entry.name) == key or _key(entry.name).replace("_", "") == key.replace("_", ""):
            return entry
    return None


def get(name: str) -> LayerEntry:
    """The entry called ``name``; a :class:`UsageError` with did-you-mean otherwise."""
    entry = find(name)
    if entry is None:
        close = difflib.get_close_matches(_key(name), names(), n=3, cutoff=0.5)
        raise UsageError(
            f"no layer called {name!r} in layerlab's registry",
            expected="one of " + ", ".join(names()) if REGISTRY else "a registry name",
            got=name,
            hint=("did you mean " + " or ".join(map(repr, close)) + "?") if close else None,
        )
    return entry
