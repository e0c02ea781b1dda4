"""When "equals eager" proves nothing: the eager output is constant.

Every export path is judged by comparing its outputs with eager's. If eager's output is one
repeated value (a model whose last ``Linear`` is zero-initialised returns ≡ 0 — AdaLN-Zero, ReZero,
zero-init residual branches, a freshly built head), any program that returns that value "equals
eager", including one that dropped or garbled every layer before it. Such a pass is vacuous.

What export-check does about it (:func:`layerlab.deploy.run.export_check_args` uses these):

1. The layer's all-zero floating parameters are re-initialised, on a copy, with small seeded
   random values (normal, std ``REINIT_STD``, the usual transformer init); if the copy's output is
   no longer constant, every path is checked on the copy instead, and the report says so.
2. Otherwise (no all-zero parameter, or the copy is still constant) every cell that passed only
   because its outputs matched becomes a WARN that says why.

Constant means: all floating output elements (more than one in all) are the same value; a single
scalar output says nothing either way and is not flagged.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
from torch import nn

from layerlab.target.bind import flatten
from layerlab.checks.report import Status

__all__ = ["REINIT_STD", "constant_output", "zero_parameters", "reinitialised", "mark_vacuous", "mark_reinitialised",
           "describe_params"]

#: std of the values given to all-zero parameters of the copy (GPT-2's / BERT's init)
REINIT_STD = 0.02


def constant_output(out: Any) -> Optional[str]:
    """``"≡ 0"`` (the value) when every floating output element is the same, else ``None``."""
    floats = [t for _, t in flatten(out) if t.is_floating_point() or t.is_complex()]
    if sum(t.numel() for t in floats) < 2:
        return None
    values = torch.cat([t.detach().reshape(-1).to(torch.complex128 if t.is_complex() else torch.float64).cpu()
                        for t in floats])
    first = values[0]
    if torch.isnan(first):
        return "≡ nan" if bool(torch.isnan(values).all()) else None
    if not bool((values == first).all()):
        return None
    value = first.item()
    return f"≡ {value:g}" if not isinstance(value, complex) else f"≡ {value}"


def zero_parameters(module: nn.Module) -> List[str]:
    """Names of the floating parameters whose every element is 0."""
    return [name for name, p in module.named_parameters()
            if p.is_floating_point() and p.numel() and not bool(p.detach().any())]


def reinitialised(module: nn.Module, names: List[str], seed: int) -> nn.Module:
    """A deep copy of ``module`` whose parameters ``names`` are drawn from N(0, REINIT_STD²), seeded."""
    from layerlab.target.copying import copy_model

    twin = copy_model(module)
    params = dict(twin.named_parameters())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in names:
            p = params[name]
            p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float64) * REINIT_STD).to(p.dtype))
    return twin


def mark_vacuous(results: List[Any], constant: str) -> None:
    """Turn every PASS that rests on "outputs equal eager" into a WARN that says the comparison
    proves nothing; note it on a WARN that also claims equality."""
    why = f"eager's output is constant ({constant}), so equal outputs prove nothing"
    hint = ("run the check with weights and inputs for which the output varies (trained weights, or a last "
            "layer that is not zero-initialised)")
    for r in results:
        if not r.matches_eager:
            continue
        r.details["vacuous"] = why
        if r.status == Status.PASS:
            r.status = Status.WARN
            r.reason = f"{r.reason}, but {why}"
            r.hint = r.hint or hint
        elif r.status == Status.WARN:
            r.reason = f"{r.reason}; and {why}"


def mark_reinitialised(results: List[Any], names: List[str]) -> None:
    """Say on every cell that compared outputs that it compared the re-initialised copy's."""
    for r in results:
        if r.matches_eager is None:
            continue
        r.details["reinitialised"] = list(names)
        r.reason = f"{r.reason} (weights re-initialised: see the note)"


def describe_params(names: List[str], limit: int = 4) -> str:
    """``2.weight, 2.bias`` (the first ``limit``, then how many more)."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
