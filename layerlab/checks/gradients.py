"""Check 5: every trainable parameter gets a gradient that is present, finite and not all zero.

One forward and one backward with a random ``grad_output`` in the user's dtype. A parameter with
no gradient sits behind a ``.detach()``, ``.data``, ``torch.no_grad()`` or an unused branch; a
non-finite gradient is an overflow or a division by zero; an all-zero gradient is a dead path (a
ReLU that never opens, a gate stuck shut). When a reference exists and its counterpart gets no
gradient either, that is the layer's design and passes with a note.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    Case, call, cast_args, float_leaves, generator, module_copy, mode_name, parity_mode, randn_like, short_dtype,
    trainable, user_dtype,
)
from layerlab.checks.report import CheckResult, Status


def _backward(module: Any, case: Case, dtype: torch.dtype, train: Optional[bool]) -> Optional[Dict[str, Optional[Tensor]]]:
    m = module_copy(module, dtype, train) if isinstance(module, nn.Module) else module
    args = cast_args(case.args, dtype)
    out = call(m, args)
    gen = generator(case.seed, 5)
    loss = 0
    for _, y in float_leaves(out):
        if y.requires_grad:
            loss = loss + (y * randn_like(y, gen)).sum()
    params = trainable(m)
    if not isinstance(loss, Tensor):
        return {n: None for n, _ in params}
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True) if params else []
    return {n: g for (n, _), g in zip(params, grads)}


def param_grads(case: Case, opts: Any = None) -> CheckResult:
    """Each trainable parameter's gradient: present, finite, not all zero."""
    if not trainable(case.module):
        return CheckResult("param_grads", Status.SKIP, "the layer has no trainable parameter")
    dtype = user_dtype(case)
    if not dtype.is_floating_point:
        dtype = torch.float32
    train = parity_mode(case)
    grads = _backward(case.module, case, dtype, train)
    ref_grads = None
    rows: List[Dict[str, Any]] = []
    problems: List[Dict[str, Any]] = []
    for name, g in grads.items():
        row: Dict[str, Any] = {"name": name, "present": g is not None}
        if g is not None:
            finite = bool(torch.isfinite(g).all())
            row.update(shape=list(g.shape), finite=finite, norm=float(g.double().norm()) if finite else None,
                       zero=bool((g == 0).all()), nonfinite=int((~torch.isfinite(g)).sum()))
        rows.append(row)
        if g is None or not row["finite"] or row["zero"]:
            problems.append(row)
    details: Dict[str, Any] = {"dtype": short_dtype(dtype), "mode": mode_name(case, train), "params": rows}
    if problems and isinstance(case.reference, nn.Module):
        try:
            ref_grads = _backward(case.reference, case, dtype, train)
        except Exception:  # the reference's own trouble is not this check's business
            ref_grads = None
    excused = []
    if ref_grads is not None:
        for row in list(problems):
            theirs = case.param_map.get(row["name"], "").removesuffix(".T")
            rg = ref_grads.get(theirs) if theirs else None
            if theirs in ref_grads and (rg is None or bool((rg == 0).all())) and row.get("finite", True):
                excused.append(row["name"])
                problems.remove(row)
        if excused:
            details["same_in_reference"] = excused
    if not problems:
        summary = f"all {len(rows)} trainable parameter(s) get finite, non-zero gradients ({short_dtype(dtype)})"
        if excused:
            summary += f"; {', '.join(excused)} get none in the reference either"
        return CheckResult("param_grads", Status.PASS, summary, details=details)
    missing = [r["name"] for r in problems if not r["present"]]
    nonfinite = [r["name"] for r in problems if r["present"] and not r["finite"]]
    zero = [r["name"] for r in problems if r["present"] and r["finite"] and r["zero"]]
    parts, hint = [], ""
    if missing:
        parts.append(f"no gradient reaches {', '.join(missing)}")
        hint = ("a .detach(), .data, torch.no_grad() or an unused branch cuts it off the output; "
                "if it is unused by design, set requires_grad=False or remove it")
    if nonfinite:
        parts.append(f"non-finite gradient for {', '.join(nonfinite)}")
        hint = hint or "an overflow, a division by zero or log(0) on this parameter's path"
    if zero:
        parts.append(f"all-zero gradient for {', '.join(zero)}")
        hint = hint or "a dead path: a ReLU/mask/gate that never lets the signal through"
    return CheckResult("param_grads", Status.FAIL, "; ".join(parts), where=", ".join(missing + nonfinite + zero),
                       hint=hint, details=details)
