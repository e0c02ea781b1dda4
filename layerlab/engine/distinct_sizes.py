"""Make coincidences impossible: re-run the forward with a distinct size for every free axis.

When the batch is 16 and the features are 16 too, ``x + y.transpose(1, 2)`` runs, a view that
mixes the batch into the sequence looks like one that does not, and a BatchNorm1d(16) normalises
the time axis of (B, T=16, C=16) without a complaint. Here every free axis of the inputs (batch,
sequence, spatial: their roles come from the real run's provenance) gets a size no other axis of
the model has (a prime that no parameter, feature or other free axis uses: a 16 that was T becomes 11, and stays 11 wherever it goes), and the forward is run again on
a copy of the model under the same provenance mode, the inputs cut or repeated along those axes.
Sizes then say where each axis went, and an op that only ran because two sizes were equal raises.

Why not meta tensors: torch's meta kernels for layer norms, linears and RNNs are Python
decompositions (about a millisecond an op, and the first one imports torch._dynamo: seconds), while
small real sizes (a batch of 2, a sequence of 11) cost less than the real forward did. The re-run
costs a forward all the same, so :func:`needs_rerun` asks for it only where the real run's
provenance left a coincidence open: two different axes of equal size paired by an op, or a view
whose input holds two different axes of equal size side by side. A model that does not run at these sizes (a
positional table as long as the sequence, a Linear after Flatten) is left alone: no finding.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from layerlab.engine.provenance import Provenance, ProvenanceMode, named_tensors

__all__ = ["needs_rerun", "distinct_sizes", "rerun"]

_FREE = ("batch", "seq", "spatial")


def needs_rerun(p: Provenance) -> bool:
    """Whether the real run left a coincidence the distinct sizes could settle."""
    from layerlab.engine.silent import coincidences

    if coincidences(p):
        return True
    for r in p.records:
        if not r.user or r.kind != "view":
            continue
        for kind, data in r.events:
            if kind != "view":
                continue
            if any(g.regroups and len({p.cls(a) for a, s in g.parts if a >= 0 and s > 1}) > 1
                   for g in data["groups"]):
                return True  # a clean cut across two axes: only other sizes tell a mistake from a split
            parts = [(a, s) for g in data["groups"] for a, s in g.parts if s > 1]
            # two different axes of one size side by side: a missing transpose between them would
            # give the same shapes (B == T in reshape(T, B, C), H == T in merging heads)
            for (a, s), (b, t) in zip(parts, parts[1:]):
                if s == t and a >= 0 and b >= 0 and p.cls(a) != p.cls(b):
                    return True
    return False


def _primes_from(n: int):
    k = max(n + 1, 2)
    while True:
        if all(k % d for d in range(2, int(k ** 0.5) + 1)):
            yield k
        k += 1


def distinct_sizes(p: Provenance) -> Dict[Tuple[str, int], int]:
    """``(input name, axis) → new size`` for every free input axis of size > 1; axes of one class
    (the same axis of two inputs) get the same size. Batch and sequence axes get small primes (at
    least 2, resp. 11: the re-run is cheap, and a kernel still fits), spatial axes the next prime
    above their own size (a stack of poolings still leaves a map)."""
    taken = {a.size for a in p.atoms if a.kind != "input" or p.role(a.id) not in _FREE}
    chosen: Dict[int, int] = {}
    sizes: Dict[Tuple[str, int], int] = {}
    for a in p.atoms:
        role = p.role(a.id) if a.kind == "input" else None
        if a.kind != "input" or a.size <= 1 or role not in _FREE:
            continue
        c = p.cls(a.id)
        if c not in chosen:
            start = {"batch": 1, "seq": min(a.size, 11) - 1}.get(role, a.size)
            new = next(k for k in _primes_from(start) if k not in taken)
            taken.add(new)
            chosen[c] = new
        sizes[(a.input, a.axis)] = chosen[c]
    return sizes


def rerun(module: torch.nn.Module, inputs: Sequence[Any], kwargs: Dict[str, Any], p: Provenance,
          names: Optional[Sequence[str]] = None) -> Optional[Tuple[Provenance, Dict[Tuple[str, int], int]]]:
    """The provenance of a forward with distinct sizes, and the sizes used (``None`` when there is
    nothing to resize, or the model cannot be copied). It runs on a copy of the model, under
    ``no_grad``, with the inputs cut or repeated along the resized axes (ids stay valid ids)."""
    import copy

    sizes = distinct_sizes(p)
    if not sizes:
        return None
    try:
        twin = copy.deepcopy(module)
    except Exception:
        return None
    named = named_tensors(inputs, kwargs, names)
    fresh: Dict[int, torch.Tensor] = {}
    for name, t in named:
        resized = t.detach()
        for k, s in enumerate(t.shape):
            new = sizes.get((name, k))
            if new is not None and new != s:
                resized = resized.index_select(k, torch.arange(new, device=t.device) % s)
        fresh[id(t)] = resized.requires_grad_(t.requires_grad) if t.is_floating_point() else resized
    new_inputs = [_swap(v, fresh) for v in inputs]
    new_kwargs = {k: _swap(v, fresh) for k, v in kwargs.items()}
    mode = ProvenanceMode(twin, named_tensors(new_inputs, new_kwargs, names))
    output = None
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            with mode:
                output = twin(*new_inputs, **new_kwargs)
        except Exception:
            output = None
    return mode.result(output), sizes


def _swap(value: Any, fresh: Dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fresh.get(id(value), value)
    if isinstance(value, tuple):
        return tuple(_swap(v, fresh) for v in value)
    if isinstance(value, list):
        return [_swap(v, fresh) for v in value]
    return value
