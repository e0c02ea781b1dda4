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

from layerlab.errors import LayerlabError, Problem, UsageError
from layerlab.spec.limits import clean_text

__all__ = ["OPTIMIZERS", "DEFAULT_LR", "build_optimizer", "optimizer_names", "decay_finding"]

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
            from layerlab.train.unregistered import attributes

            held = sorted({root for root, _, _ in attributes(copy).values()})
            hint = (f"{', '.join(held[:4])} hold(s) tensors or layers outside the model's registry (a plain "
                    "tensor, a Python list of layers): use nn.Parameter / nn.ModuleList" if held else
                    "set requires_grad=True on the parameters to train")
            raise UsageError("no parameter of the model requires grad: there is nothing to train",
                             where="optimizer", hint=hint)
        return _CLASSES[name](params, lr=rate), f"{name} (lr {rate:g})", rate
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        opt = _called(lambda: optimizer(params, lr=lr) if lr is not None else optimizer(params), optimizer.__name__)
        return opt, f"{optimizer.__name__} (lr {opt.param_groups[0].get('lr')})", opt.param_groups[0].get("lr")
    if isinstance(optimizer, torch.optim.Optimizer):
        return _rebuild(optimizer, copy, original)
    if callable(optimizer):
        opt = _called(lambda: optimizer(copy), "the optimizer factory")
        if not isinstance(opt, torch.optim.Optimizer):
            raise UsageError("an optimizer factory must return a torch.optim.Optimizer", where="optimizer",
                             got=type(opt).__name__, hint="optimizer=lambda model: torch.optim.Adam(model.parameters())")
        _check_owned(opt, copy, "the optimizer factory")
        return opt, f"{type(opt).__name__} (yours, lr {opt.param_groups[0].get('lr')})", None
    raise UsageError("optimizer is a name, an Optimizer class, a factory f(model) or an Optimizer",
                     where="optimizer", expected=" | ".join(OPTIMIZERS), got=type(optimizer).__name__)


def _called(make: Any, who: str) -> torch.optim.Optimizer:
    """``make()``, with an exception from the user's optimizer code turned into one clear line."""
    try:
        return make()
    except LayerlabError:
        raise
    except Exception as exc:  # noqa: BLE001 — the user's code: say what it raised, not a traceback
        text = str(exc).splitlines()[0] if str(exc) else ""
        hint = ("model.parameters() is a generator: once iterated (counted, filtered, logged) it yields nothing; "
                "build the optimizer on list(model.parameters()) or call model.parameters() again"
                if "empty parameter list" in text else "the optimizer is built on the model copy this check trains")
        raise UsageError(f"{who} raised {type(exc).__name__}: {clean_text(text, 300)}", where="optimizer",
                         hint=hint) from None


def _rebuild(opt: torch.optim.Optimizer, copy: torch.nn.Module,
             original: Optional[torch.nn.Module]) -> Tuple[torch.optim.Optimizer, str, Optional[float]]:
    """The same optimizer class and group settings, on the copy's parameters."""
    if original is None:
        raise UsageError("an optimizer instance needs the model it was built on", where="optimizer",
                         hint="pass the model itself (not a spec), or a factory: optimizer=lambda m: …")
    names = {id(p): n for n, p in original.named_parameters(remove_duplicate=False)}
    copied = dict(copy.named_parameters(remove_duplicate=False))
    groups: List[Dict[str, Any]] = []
    stray = [p for group in opt.param_groups for p in group["params"] if id(p) not in names]
    if stray:
        # the usual cause: a layer replaced (model.fc = nn.Linear(…)) after the optimizer was built on the
        # old one, which the optimizer still holds while the new one is in no optimizer
        held = {id(p) for group in opt.param_groups for p in group["params"]}
        missing = [n for n, p in original.named_parameters() if id(p) not in held and p.requires_grad]
        shown = ", ".join(missing[:4]) + (" …" if len(missing) > 4 else "")
        held_all = sum(len(group["params"]) for group in opt.param_groups)
        cause = ("it was built on another instance of the model (re-created, deep-copied or loaded after the "
                 "optimizer was built)" if len(stray) == held_all else "a layer replaced after the optimizer was built?")
        raise UsageError(f"the optimizer holds {len(stray)} tensor(s) that are not parameters of this model"
                         + (f", and none of the model's {shown}: {cause}" if missing else ""), where="optimizer",
                         got=", ".join(f"a tensor of shape {list(p.shape)}" for p in stray[:4]),
                         hint="build the optimizer after the model is final, on model.parameters()")
    for group in opt.param_groups:
        mapped = [copied[names[id(p)]] for p in group["params"]]
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


def _pull(opt: torch.optim.Optimizer, group: Dict[str, Any]) -> Optional[float]:
    """The fraction by which weight decay alone shrinks the weights each step, where it is exact: lr ·
    weight_decay for SGD and for decoupled decay (AdamW, Adam(decoupled_weight_decay=True)); Adam's
    coupled decay goes through its normalisation, so its pull has no such closed form (None)."""
    lr, wd = group.get("lr"), group.get("weight_decay") or 0.0
    if not isinstance(lr, (int, float)) or not isinstance(wd, (int, float)) or wd <= 0:
        return None
    if isinstance(opt, (torch.optim.SGD, torch.optim.AdamW)) or group.get("decoupled_weight_decay"):
        return float(lr) * float(wd)
    return None


def decay_finding(opt: torch.optim.Optimizer, steps: int, fit: str,
                  model: Optional[torch.nn.Module] = None) -> Optional[Problem]:
    """Weight decay that alone would shrink the weights below half their size within this run, when the
    loss did not overfit: the decay pulls the weights towards 0 faster than the gradient can move them.
    ``model``: names the group's parameters (a group of norm weights and biases gets the usual fix)."""
    if fit == "overfits":
        return None
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    for i, group in enumerate(opt.param_groups):
        pull = _pull(opt, group)
        if pull is None:
            continue
        left = max(0.0, 1.0 - pull) ** steps
        if left < 0.5:
            held = [names[id(p)] for p in group["params"] if id(p) in names]
            where, what, hint = _decayed(held, model)
            return Problem("weight-decay", f"param group {i}{what}: weight_decay {group['weight_decay']:g} at lr "
                           f"{group['lr']:g} shrinks the weights by lr·weight_decay = {pull:.3g} of their size "
                           f"every step, to {left:.2g} of it over {steps} steps from the decay alone: it pulls the "
                           "weights to 0 faster than the gradient moves them", where=where, severity="error",
                           hint="weight decay is usually 1e-4 … 0.1 (lr·weight_decay ≪ 1e-2 per step); lower it"
                           + hint, data={"group": i, "weight_decay": group["weight_decay"], "lr": group["lr"],
                                         "pull": pull, "params": held})
    return None


_NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._NormBase)


def _decayed(held: List[str], model: Optional[torch.nn.Module]) -> Tuple[str, str, str]:
    """``(where, " (its parameters)", extra hint)`` for a decayed group: the module when they share one."""
    if not held or model is None:
        return "optimizer", "", ""
    owners = sorted({n.rpartition(".")[0] or "(root)" for n in held})
    shown = ", ".join(held[:5]) + (f" … ({len(held)} in all)" if len(held) > 5 else "")
    modules = dict(model.named_modules())
    norm_or_bias = all(n.endswith("bias") or isinstance(modules.get(n.rpartition(".")[0]), _NORMS) for n in held)
    hint = ("; this group holds only norm weights and biases, which are usually not decayed at all "
            "(weight_decay=0 for them)" if norm_or_bias else "")
    return (owners[0] if len(owners) == 1 else "optimizer"), f" ({shown})", hint
