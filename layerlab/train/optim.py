"""The optimizer the check steps with, always built on the *copy* of the model it trains.

``optimizer`` may be:

* a name, :data:`OPTIMIZERS` (``adam``, ``adamw``, ``sgd``), over every parameter that requires grad;
* a ``torch.optim.Optimizer`` subclass (``torch.optim.RMSprop``), built the same way with ``lr``;
* a factory ``f(model) -> Optimizer``, called with the copy (``lambda m: SGD(m[0].parameters(), 0.1)``):
  a factory that leaves parameters out is how the check sees a parameter missing from the optimizer;
* an optimizer *instance* built on the user's own model: its parameters are found in that model by
  identity and a fresh optimizer of the same class and the same group settings is built on the
  copy's counterparts (its state, e.g. Adam's moments, is not carried over: the check starts fresh).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from layerlab.errors import UsageError

__all__ = ["OPTIMIZERS", "DEFAULT_LR", "build_optimizer", "optimizer_names"]

OPTIMIZERS = ("adam", "adamw", "sgd")
#: the default learning rate of each named optimizer (see layerlab/train/run.py for why)
DEFAULT_LR = {"adam": 1e-2, "adamw": 1e-2, "sgd": 1e-1}
_CLASSES = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def build_optimizer(optimizer: Any, lr: Optional[float], copy: torch.nn.Module,
                    original: Optional[torch.nn.Module]) -> Tuple[torch.optim.Optimizer, str, Optional[float]]:
    """``(optimizer on copy, a description for the report, the lr used or None when the user's own)``."""
    params = [p for p in copy.parameters() if p.requires_grad]
    if isinstance(optimizer, str):
        name = optimizer.strip().lower()
        if name not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer {optimizer!r}", where="--optimizer",
                             expected=" | ".join(OPTIMIZERS), got=optimizer)
        rate = DEFAULT_LR[name] if lr is None else lr
        if not params:
            raise UsageError("no parameter of the model requires grad: there is nothing to train",
                             where="optimizer", hint="set requires_grad=True on the parameters to train")
        return _CLASSES[name](params, lr=rate), f"{name} (lr {rate:g})", rate
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        opt = optimizer(params, lr=lr) if lr is not None else optimizer(params)
        return opt, f"{optimizer.__name__} (lr {opt.param_groups[0].get('lr')})", opt.param_groups[0].get("lr")
    if isinstance(optimizer, torch.optim.Optimizer):
        return _rebuild(optimizer, copy, original)
    if callable(optimizer):
        opt = optimizer(copy)
        if not isinstance(opt, torch.optim.Optimizer):
            raise UsageError("an optimizer factory must return a torch.optim.Optimizer", where="optimizer",
                             got=type(opt).__name__, hint="optimizer=lambda model: torch.optim.Adam(model.parameters())")
        _check_owned(opt, copy, "the optimizer factory")
        return opt, f"{type(opt).__name__} (yours, lr {opt.param_groups[0].get('lr')})", None
    raise UsageError("optimizer is a name, an Optimizer class, a factory f(model) or an Optimizer",
                     where="optimizer", expected=" | ".join(OPTIMIZERS), got=type(optimizer).__name__)


def _rebuild(opt: torch.optim.Optimizer, copy: torch.nn.Module,
             original: Optional[torch.nn.Module]) -> Tuple[torch.optim.Optimizer, str, Optional[float]]:
    """The same optimizer class and group settings, on the copy's parameters."""
    if original is None:
        raise UsageError("an optimizer instance needs the model it was built on", where="optimizer",
                         hint="pass the model itself (not a spec), or a factory: optimizer=lambda m: …")
    names = {id(p): n for n, p in original.named_parameters(remove_duplicate=False)}
    copied = dict(copy.named_parameters(remove_duplicate=False))
    groups: List[Dict[str, Any]] = []
    for group in opt.param_groups:
        mapped = []
        for p in group["params"]:
            if id(p) not in names:
                raise UsageError("the optimizer holds a tensor that is not a parameter of this model",
                                 where="optimizer", got=f"a tensor of shape {list(p.shape)}",
                                 hint="build the optimizer on model.parameters() (or a subset of them)")
            mapped.append(copied[names[id(p)]])
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mapped})
    rebuilt = type(opt)(groups, **opt.defaults)
    return rebuilt, f"{type(opt).__name__} (yours, lr {opt.param_groups[0].get('lr')})", None


def _check_owned(opt: torch.optim.Optimizer, copy: torch.nn.Module, who: str) -> None:
    owned = {id(p) for p in copy.parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            if id(p) not in owned:
                raise UsageError(f"{who} returned an optimizer over tensors that are not the model's parameters",
                                 where="optimizer", hint="build it on the model it is given: lambda m: "
                                 "torch.optim.Adam(m.parameters())")


def optimizer_names(opt: torch.optim.Optimizer) -> set:
    """ids of the parameters the optimizer updates."""
    return {id(p) for group in opt.param_groups for p in group["params"]}
