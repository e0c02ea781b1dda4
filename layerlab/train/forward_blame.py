"""The model raised during a training step: which module, why, and the fix — from ``layerlab.inspect``.

torch's messages often name no module: a BatchNorm given one sample in training mode says
"Expected more than 1 value per channel when training, got input size torch.Size([1, 16])", and in a
model with three BatchNorms that leaves the user guessing. ``layerlab inspect`` already answers this
for any forward that raises (its hooks keep the stack of module calls, and its per-layer rules in
:mod:`layerlab.probe.layer_rules` explain the failure). So the failing step is re-run once under
``inspect``, on a copy with the weights the step ran with, and its verdict is taken: the module's
qualified path (``head.bn``), its class and, when a rule recognised the failure, its diagnosis.
When inspect cannot reproduce or place the failure, torch's own message is reported alone, as before
— better than a guess.

A BatchNorm that needs more than one value per channel gets the training-side fix as well: inspect's
hint is written for a single forward (``--mode eval``); a training run also needs to know that a
DataLoader's last batch can be 1 sample (``drop_last=True``) and that GroupNorm/LayerNorm do not
normalise over the batch at all.
"""

from __future__ import annotations

from typing import Any, Dict

import torch.nn as nn

from layerlab.errors import CheckFailed, LayerlabError
from layerlab.spec.limits import clean_text
from layerlab.target.copying import copy_model

__all__ = ["forward_failed"]

_BATCH_NORM_HINT = ("train with batches of 2 or more (DataLoader(..., drop_last=True) when the last batch can "
                    "hold 1 sample), call model.eval() for single-sample inference, or use GroupNorm/LayerNorm, "
                    "which do not normalise over the batch")


def forward_failed(model: nn.Module, positional: list, keyword: Dict[str, Any], step: int, exc: Exception,
                   seed: int) -> CheckFailed:
    """The error to raise for ``exc``, which ``model``'s forward raised at ``step``; names the module when
    ``layerlab.inspect`` places the failure."""
    torch_says = f"{type(exc).__name__}: {clean_text(str(exc).splitlines()[0] if str(exc) else '', 300)}"
    failure = _inspect_failure(model, positional, keyword, seed)
    if failure is None or not failure.path:
        return CheckFailed(f"the model raised at step {step}: {torch_says}", where=f"step {step}",
                           hint="layerlab inspect on the same spec runs the forward module by module")
    diagnosis = failure.diagnosis
    why = f" — {diagnosis.message}" if diagnosis is not None and diagnosis.message else ""
    hint = diagnosis.hint if diagnosis is not None and diagnosis.hint else None
    module = _module(model, failure.path)
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and "value per channel" in str(exc):
        hint = _BATCH_NORM_HINT
    return CheckFailed(f"the model raised at step {step} in {failure.path} ({failure.class_name}): "
                       f"{torch_says}{why}", where=failure.path,
                       expected=getattr(diagnosis, "expected", None), got=getattr(diagnosis, "got", None), hint=hint or f"layerlab inspect on the same spec shows {failure.path}'s inputs")


def _inspect_failure(model: nn.Module, positional: list, keyword: Dict[str, Any], seed: int):
    """inspect's ``Failure`` of the same forward on a copy, or ``None`` when it ran or could not be run."""
    from layerlab.probe.run import inspect

    try:
        twin = copy_model(model)
        report = inspect(twin, *positional, seed=seed, mode=None, fix=False, ops=False, forward_kwargs=keyword)
    except LayerlabError:
        return None
    except Exception:  # noqa: BLE001 - a model that cannot be copied: no blame, torch's message stands
        return None
    failure = getattr(report, "failure", None)
    return failure if failure is not None and failure.phase == "forward" else None


def _module(model: nn.Module, path: str):
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None
