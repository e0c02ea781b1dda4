"""Check 7: causality, for layers that claim it.

A layer claims causality with a ``causal`` tag, an ``is_causal=True`` input, a causal mask among
its inputs (a float ``−inf`` upper triangle, or a bool triangle in either torch convention), or a
``causal``/``is_causal`` attribute set to ``True`` on it or a submodule.

The test, eval mode, float64: for ``t = 0, 1, …, T−2`` every sequence input is changed at all
positions after ``t`` (fresh random values; inputs passed as the same tensor change together), and
the main output at positions ``≤ t`` must not move. Positions before ``t`` were already tested with
a larger change, so the first ``t`` that moves is the first leaking position; the input position it
sees is then found by changing one position at a time.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    Arg, Case, call, cast_args, float_leaves, generator, grad_inputs, is_mask_name, map_args, module_copy, randn_like,
    time_dim,
)
from layerlab.checks.report import CheckResult, Status


def is_causal_mask(t: Any) -> bool:
    """A square ``(T, T)`` causal mask in any of torch's forms (float −inf above the diagonal, bool
    ``True`` above it (masked), or bool ``True`` on and below it (allowed))."""
    if not isinstance(t, Tensor) or t.dim() != 2 or t.shape[0] != t.shape[1] or t.shape[0] < 2:
        return False
    T = t.shape[0]
    upper = torch.ones(T, T, dtype=torch.bool, device=t.device).triu(1)
    if t.dtype == torch.bool:
        return bool(torch.equal(t, upper)) or bool(torch.equal(t, ~upper))
    if t.is_floating_point():
        blocked = t < -1e4
        return bool(torch.equal(blocked, upper)) and bool((t[~upper] == 0).all())
    return False


def claims_causal(case: Case) -> Optional[str]:
    """Why the layer is expected to be causal, or ``None``."""
    if "causal" in case.tags:
        return "tagged causal"
    for a in case.args:
        if a.name == "is_causal" and a.value is True:
            return "is_causal=True"
        if is_mask_name(a.name) and is_causal_mask(a.value):
            return f"a causal mask is passed as {a.name!r}"
    for name, m in case.module.named_modules():
        for attr in ("causal", "is_causal"):
            if getattr(m, attr, None) is True:
                return f"`{name or type(m).__name__}.{attr}` is True"
    return None


def causality(case: Case, opts: Any = None) -> CheckResult:
    """Changing inputs after position t leaves the output at positions ≤ t unchanged."""
    claim = claims_causal(case)
    if claim is None:
        return CheckResult("causality", Status.SKIP,
                           "the layer does not claim causality (no causal tag, is_causal=True, causal mask or "
                           "causal attribute)")
    module = module_copy(case.module, torch.float64, train=False)
    args = cast_args(case.args, torch.float64)
    seq = []
    T = None
    for name, t in grad_inputs(args):
        td = time_dim(module, t)
        if td is None:
            continue
        if T is None:
            T = t.shape[td]
        if t.shape[td] == T:
            seq.append((name, t, td))
    details: Dict[str, Any] = {"claim": claim, "mode": "eval", "dtype": "float64"}
    if not seq or T is None or T < 2:
        return CheckResult("causality", Status.SKIP, f"{claim}, but no sequence input with length ≥ 2 was found",
                           details=details)
    details.update(length=T, sequence_inputs={n: d for n, _, d in seq})
    with torch.no_grad():
        base = float_leaves(call(module, args))
    if not base:
        return CheckResult("causality", Status.SKIP, "no floating output", details=details)
    path, y0 = base[0]
    otd = next((d for d in (seq[0][2],) + tuple(range(y0.dim())) if d < y0.dim() and y0.shape[d] == T), None)
    if otd is None:
        return CheckResult("causality", Status.SKIP, f"{path} has no dimension of length T = {T}", details=details)
    details.update(output=path, output_time_dim=otd)
    gen = generator(case.seed, 7)
    scale = float(y0.abs().max()) or 1.0
    tol = 1e-9 * scale
    for t in range(T - 1):
        y = _run(module, args, seq, range(t + 1, T), gen)
        moved = (y.narrow(otd, 0, t + 1) - y0.narrow(otd, 0, t + 1)).abs()
        if float(moved.max()) > tol:
            source = None
            for s in range(t + 1, T):
                ys = _run(module, args, seq, [s], gen)
                if float((ys.narrow(otd, t, 1) - y0.narrow(otd, t, 1)).abs().max()) > tol:
                    source = s
                    break
            details.update(first_leaking_position=t, leaks_from=source, max_change=float(moved.max()))
            seen = f"input position {source}" if source is not None else "later inputs"
            return CheckResult(
                "causality", Status.FAIL,
                f"the output at position {t} changes when only inputs after {t} change: it sees {seen} "
                f"(first leaking position t = {t}, max change {float(moved.max()):.3g})",
                where=f"{path} position {t}",
                hint=("an off-by-one mask: the causal mask must block keys s > t, i.e. "
                      "torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1) as the *masked* positions")
                if source == t + 1 else
                "something sees the future: a mask with the wrong diagonal or convention, a padding on the wrong "
                "side of a causal conv, or a bidirectional part",
                details=details)
    return CheckResult("causality", Status.PASS,
                       f"{claim}: the output at every position t < {T} ignores inputs after t", details=details)


def _run(module: nn.Module, args: Sequence[Arg], seq, positions, gen: torch.Generator) -> Tensor:
    targets = {id(t): td for _, t, td in seq}
    pos = list(positions)

    def change(t: Tensor) -> Tensor:
        td = targets.get(id(t))
        if td is None:
            return t
        out = t.clone()
        idx = torch.tensor(pos, dtype=torch.long, device=out.device)
        new = randn_like(out.index_select(td, idx), gen)
        return out.index_copy(td, idx, new)

    with torch.no_grad():
        return float_leaves(call(module, map_args(args, change)))[0][1]
