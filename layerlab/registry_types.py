"""The registry's record type, apart from the table so catalogs can import it cheaply."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple


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
