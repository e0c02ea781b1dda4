"""Deep-copying the user's model, also when ``copy.deepcopy`` alone refuses it.

Every command that must leave the user's model untouched (train-check, precision-check,
export-check) works on a copy. ``copy.deepcopy`` refuses a module that keeps a tensor *computed
with autograd* as a plain attribute: "Only Tensors created explicitly by the user (graph leaves)
support the deepcopy protocol". The common case is the deprecated hook API
``torch.nn.utils.weight_norm`` (audio models: WaveNet, HiFi-GAN, EnCodec): it stores ``weight``
computed from the parameters ``weight_g`` and ``weight_v`` and recomputes it in a forward-pre-hook
before every call. ``torch.nn.utils.spectral_norm`` (also the old hook API) does the same after
a forward with grad.

:func:`copy_model` takes each such derived attribute off the original for the length of the copy
(the very same tensor object is put back afterwards: the original is not changed), and gives the
copy its own, recomputed from the copy's parameters by the hook's own ``compute_weight``, so the
copy computes exactly what the original does. A derived tensor no known hook recomputes is a
:class:`~layerlab.errors.UsageError` naming the module and the attribute, with the fix.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Tuple

import torch
from torch import nn

from layerlab.errors import UsageError

__all__ = ["copy_model", "picklable_copy"]

_FIX = ("use the parametrization API, torch.nn.utils.parametrizations.weight_norm (or "
        ".spectral_norm), which copies; or compute the tensor inside forward instead of keeping it "
        "as an attribute")


def copy_model(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` that computes what ``module`` computes (see the module docstring).

    Raises:
        UsageError: a submodule keeps a tensor computed with autograd as a plain attribute and no
            known hook recomputes it.
    """
    from layerlab.faults import watch_model

    twin = _copy_model(module)
    watch_model(twin)  # a --timeout names the copy's submodules by their paths too
    return twin


def _copy_model(module: nn.Module) -> nn.Module:
    derived = _derived_attributes(module)
    if not derived:
        return _deepcopy(module)
    unknown = [(path, name) for path, _, name, hook in derived if hook is None]
    if unknown:
        path, name = unknown[0]
        where = f"{path}.{name}" if path else name
        raise UsageError(f"cannot copy the model: {where} is a tensor computed with autograd and kept as a plain "
                         f"attribute, which copy.deepcopy refuses (it copies graph leaves only)", where=where,
                         expected="parameters, buffers, or tensors computed in forward", got="a non-leaf tensor",
                         hint=_FIX)
    stashed = [(sub, name, sub.__dict__.pop(name)) for _, sub, name, _ in derived]
    try:
        twin = _deepcopy(module)
    finally:
        for sub, name, value in stashed:  # the very same tensors back: the original is unchanged
            sub.__dict__[name] = value
    subs = dict(twin.named_modules())
    for (path, _, name, hook), (_, _, value) in zip(derived, stashed):
        twin_sub = subs[path]
        twin_hook = _find_hook(twin_sub, name)  # deepcopy copied the hook object with the module
        with torch.set_grad_enabled(value.requires_grad):  # as the original's was computed
            setattr(twin_sub, name, twin_hook(twin_sub))
    return twin


def _deepcopy(module: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(module)
    except RuntimeError as exc:
        if "deepcopy protocol" not in str(exc):
            raise
        raise UsageError(f"cannot copy the model: copy.deepcopy refuses a tensor computed with autograd that it "
                         f"holds somewhere (a list, a dict, a closure): {str(exc).splitlines()[0]}",
                         where=type(module).__name__, hint=_FIX) from None


def _derived_attributes(module: nn.Module) -> List[Tuple[str, nn.Module, str, Any]]:
    """``(module path, submodule, attribute name, recompute or None)`` for each non-leaf tensor kept
    as a plain attribute (parameters and buffers live in their own dicts, not in ``__dict__``)."""
    found = []
    for path, sub in module.named_modules():
        for name, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                found.append((path, sub, name, _find_hook(sub, name)))
    return found


def _find_hook(sub: nn.Module, name: str) -> Callable[[nn.Module], torch.Tensor] | None:
    """How the old hook APIs compute attribute ``name`` of ``sub``: weight_norm's ``compute_weight``,
    or spectral_norm's without a power iteration (the copy must not advance the u, v estimates)."""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    for hook in sub._forward_pre_hooks.values():
        if isinstance(hook, WeightNorm) and hook.name == name:
            return hook.compute_weight
        if isinstance(hook, SpectralNorm) and hook.name == name:
            return lambda m, h=hook: h.compute_weight(m, do_power_iteration=False)
    return None


def picklable_copy(module: nn.Module) -> nn.Module:
    """:func:`copy_model` for sending to another process (ddp-check's ranks): pickle refuses a tensor
    that requires grad and is not a leaf ("autograd does not support crossing process boundaries").
    The old hooks' derived weights are detached on the copy: their forward-pre-hook computes them
    again from the parameters before every call, so nothing the copy computes changes."""
    twin = copy_model(module)
    for _, sub, name, _ in _derived_attributes(twin):
        sub.__dict__[name] = sub.__dict__[name].detach()
    return twin
