"""What a train-mode layer does differently in train mode, said where a check ran it in eval mode.

The batch checks run in eval mode. "∂output[i]/∂input[j] = 0" is then true of a BatchNorm model
only in eval mode: in train mode BatchNorm normalises with the batch's own statistics, so every
sample's output depends on every other sample. A summary that leaves the mode out states
something false about the layer as the user trains it. This module names what differs:

* torch's BatchNorm (``_BatchNorm`` with running statistics): in train mode samples interact
  through the batch statistics — torch documents it, so it is said plainly;
* a hand-written BatchNorm, recognised only by its ``running_mean``/``running_var`` buffers: what
  its train-mode forward does is not seen, so the note says it is likely, not that it is so;
* dropout (:func:`~layerlab.checks.case.is_stochastic`): eval mode has it off.

InstanceNorm keeps running statistics too but normalises each sample alone: it is left out.
"""

from __future__ import annotations

from typing import List

from torch import nn

from layerlab.checks.case import Case, is_stochastic

#: buffers a hand-written BatchNorm keeps (torch's names, which hand-written ones copy)
RUNNING_BUFFERS = ("running_mean", "running_var")


def batch_statistics(module: nn.Module) -> List[str]:
    """Qualified names of torch BatchNorm submodules that keep running statistics."""
    return [name or type(m).__name__ for name, m in module.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


def batchnorm_like(module: nn.Module) -> List[str]:
    """Qualified names of submodules that are not torch's norms but hold ``running_mean`` and
    ``running_var`` buffers of their own (a hand-written BatchNorm)."""
    found = []
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._NormBase):  # torch's: BatchNorm above, InstanceNorm per sample
            continue
        own = {n for n, _ in m.named_buffers(recurse=False)}
        if all(b in own for b in RUNNING_BUFFERS):
            found.append(name or type(m).__name__)
    return found


def train_differences(case: Case) -> List[str]:
    """One note, "in eval mode (…); in train mode …", for a layer that behaves differently in train
    mode (empty when nothing is known to differ)."""
    torch_bn, own_bn = batch_statistics(case.module), batchnorm_like(case.module)
    dropout = is_stochastic(case.module, case.tags, case.reference)
    if not (torch_bn or own_bn or dropout):
        return []
    off = (["running statistics"] if torch_bn or own_bn else []) + (["dropout off"] if dropout else [])
    train = []
    if torch_bn:
        train.append(f"samples interact through the batch statistics of {_listed(torch_bn)}")
    if own_bn:
        train.append(f"{_listed(own_bn)} (running_mean/running_var buffers, like BatchNorm) likely normalises with "
                     "the batch statistics, through which samples would interact: not checked")
    if dropout:
        train.append("dropout draws random masks")
    return [f"in eval mode ({', '.join(off)}); in train mode " + "; ".join(train)]


def _listed(names: List[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
