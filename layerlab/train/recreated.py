"""Parameters re-created or re-tied inside ``forward`` (``self.w = nn.Parameter(...)`` on every call).

The optimizer holds the parameter objects that existed when it was built; a forward that assigns
a new ``nn.Parameter`` replaces the registered one, so the gradient lands on a tensor no optimizer
holds and the value is reset on every call: it never trains. Seen by comparing the parameter
objects under each name before and after the first forward (identity, not values).

Names are taken with ``named_parameters(remove_duplicate=False)``: the default drops a second name
for an object already listed, so weights *tied* in forward (``self.head.weight = self.emb.weight``)
would make ``head.weight`` vanish rather than change. A name whose object became *another registered
parameter* is tying done in forward: the model then trains as tied (the loss reaches the shared
weight through both uses), but the original ``head.weight`` the optimizer was built with is left
out of the graph and never trains — a warning that says so, and that tying belongs in ``__init__``.
A name whose object is new is a re-created parameter: an error.
"""

from __future__ import annotations

from typing import Dict, List

import torch

from layerlab.errors import Problem

__all__ = ["identities", "findings"]


def identities(model: torch.nn.Module) -> Dict[str, int]:
    return {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}


def findings(model: torch.nn.Module, before: Dict[str, int]) -> List[Problem]:
    owner = {}  # object id → the first name it was registered under before the forward
    for name, ident in before.items():
        owner.setdefault(ident, name)
    swapped, tied = [], []
    for name, p in model.named_parameters(remove_duplicate=False):
        if name not in before or before[name] == id(p):
            continue
        if id(p) in owner and owner[id(p)] != name:
            tied.append((name, owner[id(p)]))
        else:
            swapped.append(name)
    found = []
    if swapped:
        found.append(Problem("recreated-in-forward", f"{', '.join(swapped)}: forward assigns a new parameter under "
                             "this name on every call, so the one the optimizer holds is replaced (and reset) each "
                             "step and never trains", where=swapped[0], severity="error", data={"params": swapped},
                             hint="create the nn.Parameter once in __init__ and only use it in forward"))
    if tied:
        names = [n for n, _ in tied]
        pairs = ", ".join(f"{n} = {o}" for n, o in tied)
        found.append(Problem("recreated-in-forward", f"{pairs}: forward ties these weights on every call, so the "
                             "model trains as tied (the loss reaches the shared weight through both uses), but the "
                             f"original {', '.join(names)} the optimizer was built with is left out of the graph "
                             "and never trains (it only takes memory and optimizer state)", where=names[0],
                             severity="warning", data={"params": names, "tied_to": [o for _, o in tied]},
                             hint="tie the weights once in __init__ (self.head.weight = self.emb.weight), "
                                  "before the optimizer is built, not in forward"))
    return found
