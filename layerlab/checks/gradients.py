"""Check 5: every trainable parameter gets a gradient that is present, finite and not all zero.

One forward and one backward with a random ``grad_output`` in the user's dtype. A parameter with
no gradient sits behind a ``.detach()``, ``.data``, ``torch.no_grad()`` or an unused branch; a
non-finite gradient is an overflow or a division by zero; an all-zero gradient is a dead path (a
ReLU that never opens, a gate stuck shut). When a reference exists and its counterpart gets no
gradient either, that is the layer's design and passes with a note.

One all-zero gradient is exactly right and passes with a note: a hidden-to-hidden weight
(``weight_hh``) that only ever multiplies a zero state (``nn.RNNCell``/``LSTMCell``/``GRUCell``
without ``hx``, a one-step sequence without ``h0``, dead ReLU units): its gradient is
``Σ δ · hᵀ`` with every ``h = 0`` (see :mod:`layerlab.checks.zero_state`).

Any other all-zero gradient is tested against the forward: the parameter is nudged (float64,
relative 1e-6) and the outputs compared. If they move, the zero gradient is wrong: FAIL. If they do
not, the values make the output flat in that parameter here (dead units, a gate shut, a loss whose
every target is ignored): a warning that says so, since the code is not what is at fault.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    Case, call, cast_args, float_leaves, generator, module_copy, mode_name, parity_mode, randn_like, short_dtype,
    trainable, user_dtype,
)
from layerlab.checks.grad_patterns import custom_function_inputs
from layerlab.checks.report import CheckResult, Status
from layerlab.checks.zero_state import DEAD_RELU, ZeroStateWatch


def _backward(module: Any, case: Case, dtype: torch.dtype,
              train: Optional[bool]) -> Tuple[Dict[str, Optional[Tensor]], Optional[ZeroStateWatch]]:
    """Each trainable parameter's gradient, and what the recurrent submodules were called with."""
    m = module_copy(module, dtype, train) if isinstance(module, nn.Module) else module
    args = cast_args(case.args, dtype)
    watch = ZeroStateWatch(m) if isinstance(m, nn.Module) else None
    if watch is None:
        out = call(m, args)
    else:
        with watch:
            out = call(m, args)
    gen = generator(case.seed, 5)
    loss = 0
    for _, y in float_leaves(out):
        if y.requires_grad:
            loss = loss + (y * randn_like(y, gen)).sum()
    params = trainable(m)
    if not isinstance(loss, Tensor):
        return {n: None for n, _ in params}, watch
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True) if params else []
    return {n: g for (n, _), g in zip(params, grads)}, watch


FLAT = ("the outputs do not change when it is nudged (float64): on these inputs the layer is flat in it "
        "(dead units, a gate shut, every target ignored)")


def _flat(case: Case, names: List[str], train: Optional[bool]) -> List[str]:
    """The parameters among ``names`` whose nudge leaves every floating output unchanged."""
    m = module_copy(case.module, torch.float64, train)
    args = cast_args(case.args, torch.float64)
    params = dict(m.named_parameters())
    gen = generator(case.seed, 12)

    def outputs() -> Tensor:
        with torch.no_grad():
            leaves = [y.reshape(-1) for _, y in float_leaves(call(m, args))]
        return torch.cat(leaves) if leaves else torch.zeros(0, dtype=torch.float64)

    base = outputs()
    tol = 1e-10 * (1 + float(base.abs().max())) if base.numel() else 0.0
    flat = []
    for name in names:
        p = params[name]
        keep = p.detach().clone()
        with torch.no_grad():
            p.add_(1e-6 * (1 + float(keep.abs().max())) * randn_like(p, gen))
        moved = outputs()
        with torch.no_grad():
            p.copy_(keep)
        if moved.shape == base.shape and not bool(((moved - base).abs() > tol).any()):
            flat.append(name)
    return flat


def param_grads(case: Case, opts: Any = None) -> CheckResult:
    """Each trainable parameter's gradient: present, finite, not all zero."""
    if not trainable(case.module):
        return CheckResult("param_grads", Status.SKIP, "the layer has no trainable parameter")
    dtype = user_dtype(case)
    if not dtype.is_floating_point:
        dtype = torch.float32
    train = parity_mode(case)
    grads, watch = _backward(case.module, case, dtype, train)
    ref_grads = None
    rows: List[Dict[str, Any]] = []
    problems: List[Dict[str, Any]] = []
    zeros = [n for n, g in grads.items() if g is not None and bool(torch.isfinite(g).all()) and not bool(g.any())]
    explained = watch.explain(zeros) if watch is not None and zeros else {}
    unexplained = [n for n in zeros if n not in explained]
    if unexplained:
        try:
            explained.update({n: ("flat", FLAT) for n in _flat(case, unexplained, train)})
        except Exception:  # the layer does not run in float64: the zero gradients stay unexplained
            pass
    for name, g in grads.items():
        row: Dict[str, Any] = {"name": name, "present": g is not None}
        if g is not None:
            finite = bool(torch.isfinite(g).all())
            row.update(shape=list(g.shape), finite=finite, norm=float(g.double().norm()) if finite else None,
                       zero=bool((g == 0).all()), nonfinite=int((~torch.isfinite(g)).sum()))
        rows.append(row)
        if (g is None or not row["finite"] or row["zero"]) and name not in explained:
            problems.append(row)
    by_design = [n for n, (kind, _) in explained.items() if kind == "by_design"]
    dead = [n for n, (kind, _) in explained.items() if kind == "dead_relu"]
    flat = [n for n, (kind, _) in explained.items() if kind == "flat"]
    details: Dict[str, Any] = {"dtype": short_dtype(dtype), "mode": mode_name(case, train), "params": rows}
    if explained:
        details["zero_explained"] = {n: {"kind": k, "why": w} for n, (k, w) in explained.items()}
    if problems and isinstance(case.reference, nn.Module):
        try:
            ref_grads, _ = _backward(case.reference, case, dtype, train)
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
    if not problems and (dead or flat):
        parts = [f"all-zero gradient for {', '.join(names)}, explained by the values, not the code: {why}"
                 for names, why in ((dead, DEAD_RELU), (flat, FLAT)) if names]
        return CheckResult(
            "param_grads", Status.WARN, "; ".join(parts), where=", ".join(dead + flat), details=details,
            hint="the units never open on these inputs: re-initialise (smaller weights, bias 0), normalise or "
                 "clip the inputs, or use nonlinearity='tanh'" if dead else
                 "check the inputs: with these values the parameter cannot affect the output")
    if not problems:
        nonzero = len(rows) - len(by_design)
        summary = f"all {nonzero} trainable parameter(s) get finite, non-zero gradients ({short_dtype(dtype)})"
        if by_design:
            summary = (f"{nonzero} of {len(rows)} trainable parameter(s) get finite, non-zero gradients "
                       f"({short_dtype(dtype)}); {', '.join(by_design)} "
                       f"{'gets an all-zero gradient' if len(by_design) == 1 else 'get all-zero gradients'}, "
                       f"exactly right: {explained[by_design[0]][1]}")
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
        owners = _custom_functions_fed(case, missing, dtype, train)
        if owners:
            parts[-1] += (f": the custom autograd.Function {', '.join(sorted(set(owners.values())))} receives "
                          f"{', '.join(owners)} but its backward returns None for it")
            details["custom_function_returns_none"] = owners
            hint = ("its backward returns None in that parameter's slot: check the ctx.needs_input_grad index each "
                    "gradient is computed under and the order of the returned gradients (one per forward input)")
    if nonfinite:
        parts.append(f"non-finite gradient for {', '.join(nonfinite)}")
        hint = hint or "an overflow, a division by zero or log(0) on this parameter's path"
    if zero:
        parts.append(f"all-zero gradient for {', '.join(zero)}")
        hint = hint or "a dead path: a ReLU/mask/gate that never lets the signal through"
    if dead or flat:
        parts.append(f"({', '.join(dead + flat)}: all-zero too, explained by the values)")
    return CheckResult("param_grads", Status.FAIL, "; ".join(parts), where=", ".join(missing + nonfinite + zero),
                       hint=hint, details=details)


def _custom_functions_fed(case: Case, names: List[str], dtype: torch.dtype, train: Optional[bool]) -> Dict[str, str]:
    """``{parameter: custom autograd.Function}`` for each of ``names`` that is an input of a custom
    Function in the forward graph: that Function's backward, not a detach, is what drops its gradient."""
    try:
        m = module_copy(case.module, dtype, train)
        wanted = {id(p): n for n, p in m.named_parameters() if n in names}
        roots = [y.grad_fn for _, y in float_leaves(call(m, cast_args(case.args, dtype))) if y.grad_fn is not None]
    except Exception:  # the hint is a refinement: without it the generic one stands
        return {}
    return custom_function_inputs(roots, wanted)
