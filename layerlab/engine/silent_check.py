"""The silent-bug check as ``layerlab.inspect`` runs it, in two passes, and never in the way.

Pass 1 labels the real forward as it runs (:func:`watch` gives the mode inspect enters around
it: one dict lookup and a frame walk per op, no tensor kept; :func:`seen` reads it once the
forward returned). Pass 2, the meta re-run with a
distinct size for every free axis (:mod:`layerlab.engine.distinct_sizes`), runs only where pass 1
left a coincidence open. :func:`findings` then reads both:

* every rule of :mod:`layerlab.engine.silent` over pass 1, and over pass 2 where it ran (where the
  sizes are distinct, a view that mixes B into T can no longer look like one that does not);
* ``silent/coincident-sizes`` only where pass 2 confirms it: the op that paired two different axes
  of equal size raises once their sizes differ. An op that pass 2 ran through is no coincidence.

A forward that torch would run on a fused inference path (``nn.TransformerEncoderLayer`` in eval
mode under ``no_grad``) is not watched: any torch-function mode turns those paths off, and the
model must run as it does without layerlab. An error of the engine itself never reaches the user's run: it is skipped (``LAYERLAB_DEBUG=1``
re-raises it, so that a bug of ours keeps its traceback).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from layerlab.errors import Problem, debug_enabled

__all__ = ["watch", "seen", "findings"]


def watch(module: Any, inputs: Sequence[Any], kwargs: Dict[str, Any]):
    """The :class:`~layerlab.engine.provenance.ProvenanceMode` to enter around the real forward
    (innermost, so that it sees the model's frames first), or ``None`` if it cannot be made."""
    try:
        from layerlab.engine.provenance import ProvenanceMode, named_tensors

        if _fast_path_possible(module):
            return None
        return ProvenanceMode(module, named_tensors(inputs, kwargs))
    except Exception:
        if debug_enabled():
            raise
        return None


def _fast_path_possible(module: Any) -> bool:
    """torch's fused inference paths (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` in
    eval mode without gradients) are skipped while any torch-function mode is active: with the
    mode on, the model would not run as it does without layerlab. Such a run is not watched."""
    import torch

    if torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()):
        return False
    fused = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)
    return any(isinstance(m, fused) and not m.training for m in module.modules())


def seen(mode: Any, output: Any) -> Any:
    """What ``mode`` saw of a forward that returned ``output`` (a
    :class:`~layerlab.engine.provenance.Provenance`; ``None`` on an error of ours). Call it before
    the output is dropped: the output's labels are read from the live tensors."""
    try:
        return mode.result(output)
    except Exception:
        if debug_enabled():
            raise
        return None


def findings(first: Any, module: Any, inputs: Sequence[Any], kwargs: Dict[str, Any],
             rerun: bool = True) -> List[Problem]:
    """The silent-bug findings of a forward whose provenance is ``first`` (see the module docstring)."""
    if first is None:
        return []
    try:
        return _findings(first, module, inputs, kwargs, rerun)
    except Exception:
        if debug_enabled():
            raise
        return []


def _findings(first, module, inputs, kwargs, rerun) -> List[Problem]:
    from layerlab.engine import silent
    from layerlab.engine.distinct_sizes import needs_rerun, rerun as distinct_rerun

    if first.errors and debug_enabled():
        raise first.errors[0]
    found = [f for f in silent.silent_findings(first) if f.code != "silent/coincident-sizes"]
    second = None
    if rerun and needs_rerun(first):
        done = distinct_rerun(module, inputs, kwargs, first)
        if done is not None:
            second, sizes = done
            found += [f for f in silent.silent_findings(second) if f.code != "silent/coincident-sizes"]
            found += _confirmed(first, second, sizes)
    return _unique(found)


def _confirmed(first, second, sizes) -> List[Problem]:
    """Pass 1's coincidences at the op where pass 2 raised."""
    from layerlab.engine import silent

    if second.failed is None:
        return []
    failed = (second.failed.where, second.failed.op)  # the same op on the same line, not a neighbour
    shown = ", ".join(f"{name} axis {axis} → {size}" for (name, axis), size in sorted(sizes.items()))
    note = f"confirmed: with distinct sizes ({shown}) this op raises"
    return [f for f in silent.coincident_sizes(first, {failed: note})
            if (f.where, f.data["op"]) == failed]


def _unique(found: List[Problem]) -> List[Problem]:
    seen, out = set(), []
    for f in found:
        key = (f.code, f.where)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
