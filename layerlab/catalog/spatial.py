"""Registry entries of the spatial reference layers (static data; importing this never imports torch)."""

from __future__ import annotations

from typing import List

from layerlab.registry_types import LayerEntry

ENTRIES: List[LayerEntry] = []
