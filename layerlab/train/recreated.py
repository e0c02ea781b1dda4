"""Parameters re-created inside ``forward`` (``self.w = nn.Parameter(...)`` on every call).

The optimizer holds the parameter objects that existed when it was built; a forward that assigns
a new ``nn.Parameter`` replaces the registered one, so the gradient lands on a tensor no optimizer
holds and the value is reset on every call: it never trains. Seen by comparing the parameter
objects under each name before and after the first forward (identity, not values).
"""

from __future__ import annotations

from typing import Dict, List

import torch

from layerlab.errors import Problem

__all__ = ["identities", "findings"]


def identities(model: torch.nn.Module) -> Dict[str, int]:
    return {name: id(p) for name, p in model.named_parameters()}


def findings(model: torch.nn.Module, before: Dict[str, int]) -> List[Problem]:
    swapped = [name for name, p in model.named_parameters() if name in before and before[name] != id(p)]
    if not swapped:
        return []
    return [Problem("recreated-in-forward", f"{', '.join(swapped)}: forward assigns a new parameter under this name "
                    "on every call, so the one the optimizer holds is replaced (and reset) each step and never trains",
                    where=swapped[0], severity="error", data={"params": swapped},
                    hint="create the nn.Parameter once in __init__ and only use it in forward")]
