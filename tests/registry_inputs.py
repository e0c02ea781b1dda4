"""Registry layers built for tests without the spec loader: the layer, seeded, and its default inputs.

The registry's ``inputs`` use three forms (``shape``, ``same_as``, ``causal``); this builds them with
torch directly, so these tests depend on the registry and the layers only. ``shapes`` overrides
the shape of named inputs (a causal mask follows the length of the input it was made for).
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from layerlab import registry


def build(name: str, shapes: Optional[Dict[str, Sequence[int]]] = None,
          seed: int = 0) -> Tuple[Any, List[Any], Dict[str, Any]]:
    """``(module, args, kwargs)`` for the registry layer ``name``, in eval mode: ``forward``'s
    parameters up to the first one the registry leaves out by position, the rest by name."""
    entry = registry.get(name)
    torch.manual_seed(seed)
    module = entry.load()(**entry.args).eval()
    return (module, *inputs(entry, shapes, seed, module))


def inputs(entry, shapes: Optional[Dict[str, Sequence[int]]], seed: int, module) -> Tuple[List[Any], Dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    shapes = shapes or {}
    values: Dict[str, Any] = {}
    lengths: Dict[int, int] = {}  # original size → overridden size, for the causal masks
    for key, spec in entry.inputs.items():
        if "shape" in spec:
            shape = list(shapes.get(key, spec["shape"]))
            lengths.update({old: new for old, new in zip(spec["shape"], shape) if old != new})
            values[key] = torch.randn(*shape, generator=g)
        elif "same_as" in spec:
            values[key] = values[spec["same_as"]]
        elif "causal" in spec:
            T = lengths.get(spec["causal"], spec["causal"])
            values[key] = torch.full((T, T), float("-inf")).triu(1)  # 0 on and below the diagonal
        else:
            raise ValueError(f"{entry.name}: input form {spec} is not built here")
    bound = inspect.signature(module.forward).bind(**values)
    return list(bound.args), dict(bound.kwargs)
