"""Layers that LayerDrop skipped in this run: their parameters got no gradient by chance, not by a bug.

LayerDrop (Fan et al. 2019) skips each layer of a stack with probability ``layerdrop`` in train
mode. Hugging Face's Wav2Vec2, HuBERT, BART, Whisper and others read the rate from
``self.config.layerdrop`` in the encoder's loop (``torch.rand([]) < layerdrop``: skip the layer), so
a seeded train-mode run may skip a whole layer and every parameter in it gets no gradient. "Remove
it, use it, or freeze it" is the wrong advice there: the layer is used, in other draws and in eval.

:func:`layer_dropped` takes those ``no-grad`` warnings out (only for layers that never ran, inside a
module in train mode whose own ``layerdrop`` or ``config.layerdrop`` is > 0) and says them as one
note that names the rate, the module that draws it and the layers it skipped.
"""

from __future__ import annotations

from typing import List, Optional, Set, Tuple

from torch import nn

from layerlab.errors import Problem
from layerlab.probe.report import CallRecord

__all__ = ["layer_dropped"]


def _rate(module: nn.Module) -> Optional[float]:
    """The module's LayerDrop rate in train mode (its attribute, else its config's), when > 0."""
    if not module.training:
        return None
    for owner in (module, getattr(module, "config", None)):
        rate = getattr(owner, "layerdrop", None)
        if isinstance(rate, float) and rate > 0:
            return rate
    return None


def _dropper(root: nn.Module, stacks: List[str], path: str) -> Optional[Tuple[str, nn.Module, float, str]]:
    """For the module at ``path``: the innermost ``nn.ModuleList`` holding it whose owner draws LayerDrop,
    as ``(the owner's path, the owner, the rate, the skipped layer's path)``."""
    for stack in sorted((s for s in stacks if path.startswith(s + ".")), key=len, reverse=True):
        owner_path = stack.rpartition(".")[0]
        owner = root.get_submodule(owner_path)
        rate = _rate(owner)
        if rate is not None:
            index = path[len(stack) + 1:].split(".")[0]
            return owner_path, owner, rate, f"{stack}.{index}"
    return None


def layer_dropped(problems: List[Problem], root: nn.Module,
                  calls: List[CallRecord]) -> Tuple[List[Problem], List[Problem]]:
    """``(problems kept, notes)``: the ``no-grad`` warnings of parameters whose module never ran inside a
    train-mode LayerDrop stack become one note."""
    ran: Set[str] = {c.path for c in calls}
    stacks = [p for p, m in root.named_modules() if p and isinstance(m, nn.ModuleList)]
    kept, skipped, params = [], [], []
    found = None
    for p in problems:
        owner = (p.where or "").rpartition(".")[0]
        hit = _dropper(root, stacks, owner) if p.code == "no-grad" and owner and owner not in ran else None
        if hit is None or hit[3] in ran:  # the layer itself ran: a part of it unused is another matter
            kept.append(p)
            continue
        found = found or hit
        params.append(p.where)
        if hit[3] not in skipped:
            skipped.append(hit[3])
    if found is None:
        return problems, []
    where, module, rate, _ = found
    note = Problem(
        "layer-dropped", f"{len(params)} trainable parameter(s) got no gradient because their layers never ran: in "
        f"train mode {where or '(root)'} ({type(module).__name__}) skips each layer with probability "
        f"layerdrop={rate:g} (LayerDrop), and this run's draws skipped {', '.join(skipped)}; eval mode runs every "
        "layer (--mode eval), another --seed draws again", where=skipped[0], severity="info",
        data={"params": params, "layers": skipped, "layerdrop": rate})
    return kept, [note]
