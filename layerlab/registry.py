"""Names → layers: layerlab's reference layers, each with its torch.nn reference and defaults.

The table is static data with import paths as strings, so listing or resolving names never
imports torch; :meth:`LayerEntry.load` imports the class when it is really needed.

An entry's ``inputs`` use the same mapping as a YAML spec's ``inputs:`` (see README, "The YAML
spec"), one item per forward argument, in order::

    {"input": {"shape": [2, 3, 16, 16]}}                              # seeded randn, float32
    {"ids": {"shape": [2, 10], "dtype": "int64", "low": 0, "high": 100}}   # random integer ids
    {"query": {"shape": [2, 10, 64]}, "key": {"same_as": "query"},         # the same tensor
     "value": {"same_as": "query"}, "attn_mask": {"causal": 10}}          # float −inf causal mask
"""

from __future__ import annotations

import difflib
from typing import Dict, List, Optional

from layerlab.errors import UsageError
from layerlab.registry_types import LayerEntry, import_target

__all__ = ["LayerEntry", "REGISTRY", "find", "get", "import_target", "names"]


def _load_entries() -> List[LayerEntry]:
    from layerlab.catalog import sequence, spatial

    return [*spatial.ENTRIES, *sequence.ENTRIES]


REGISTRY: Dict[str, LayerEntry] = {e.name: e for e in _load_entries()}


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
