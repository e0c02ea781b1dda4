"""Check 4: numerical gradient check in float64, inputs and parameters together, each one named.

The layer is made a function of its inputs *and* its parameters with
:func:`torch.func.functional_call`, on a float64 copy (float32 cannot resolve a 1e-6 step).

*Fast mode* is the idea of ``gradcheck(fast_mode=True)``: for random unit directions ``u`` (per
checked tensor) and ``v`` (per output), the analytical ``vᵀJu`` (one backward per output) must
equal the numerical one (a central difference along ``u``), within
``atol·Σu·Σv + rtol·|numerical|`` — torch's tolerances, scaled as torch scales them. It is done
one tensor at a time (two forwards each), so a failure already names the input or parameter,
and the ratio ``analytical / numerical`` shows a dropped factor at a glance. It never builds a
Jacobian. (``torch.autograd.gradcheck``'s own fast mode, on failure, recomputes the full slow
Jacobian of every input to explain itself — exactly what the size cap must prevent.)

*Slow mode* (``torch.autograd.gradcheck(fast_mode=False)``) then confirms each failing tensor,
element by element, only when its Jacobian ``numel(tensor) × Σ numel(outputs)`` is at most
``slow_cap`` elements; otherwise it is skipped and the report says so.

The backward is also run twice: different gradients mean the backward is not reentrant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.autograd.gradcheck import GradcheckError

from layerlab.checks.case import (
    Arg, Case, call, cast_args, float_leaves, generator, grad_inputs, map_args, module_copy, mode_name, parity_mode,
    rand_like, trainable,
)
from layerlab.checks.report import CheckResult, Status


@dataclass
class GradcheckOptions:
    """Tolerances and caps of the numerical gradient check (torch's defaults for the first three).

    Attributes:
        eps: finite-difference step.
        atol, rtol: tolerances (``torch.autograd.gradcheck``'s defaults).
        slow_cap: the largest Jacobian (elements) slow mode may build for one tensor.
    """

    eps: float = 1e-6
    atol: float = 1e-5
    rtol: float = 1e-3
    slow_cap: int = 1_000_000


def functional(module: nn.Module, args: Sequence[Arg], inputs: Sequence[Tensor],
               param_names: Sequence[str]) -> Callable[..., Tuple[Tensor, ...]]:
    """``f(*inputs, *params) -> floating outputs``: the layer with its parameters as explicit inputs.

    ``f.paths`` holds the outputs' paths (``output[1][0]``) after the first call."""
    ids = [id(t) for t in inputs]
    n_in = len(inputs)

    def f(*tensors: Tensor) -> Tuple[Tensor, ...]:
        sub = dict(zip(ids, tensors[:n_in]))
        new_args = map_args(args, lambda t: sub.get(id(t), t))
        params = dict(zip(param_names, tensors[n_in:]))
        out = call(lambda *a, **k: torch.func.functional_call(module, params, a, k), new_args)
        leaves = float_leaves(out)
        f.paths = [p for p, _ in leaves]  # type: ignore[attr-defined]
        return tuple(t for _, t in leaves)

    return f


def _unit(t: Tensor, gen: torch.Generator) -> Tensor:
    u = rand_like(t, gen)
    n = u.norm()
    return u / n if n > 0 else u


def gradcheck(case: Case, opts: Optional[Any] = None) -> CheckResult:
    """Analytical gradients equal finite differences (float64) for every input and parameter."""
    o = getattr(opts, "gradcheck", None) or GradcheckOptions()
    train = parity_mode(case)
    module = module_copy(case.module, torch.float64, train)
    args = cast_args(case.args, torch.float64)
    inputs = grad_inputs(args)
    params = [(n, p.detach().clone()) for n, p in trainable(module)]
    names = [n for n, _ in inputs] + [n for n, _ in params]
    kinds = ["input"] * len(inputs) + ["parameter"] * len(params)
    base = [t for _, t in inputs] + [p for _, p in params]
    if not base:
        return CheckResult("gradcheck", Status.SKIP, "no floating input and no trainable parameter to check")
    f = functional(module, args, [t for _, t in inputs], [n for n, _ in params])
    tensors = [t.detach().clone().requires_grad_(True) for t in base]
    outs = f(*tensors)
    out_paths = list(f.paths)  # type: ignore[attr-defined]
    if not outs:
        return CheckResult("gradcheck", Status.SKIP, "the layer has no floating output")
    gen = generator(case.seed, 4)
    vs = [_unit(y, gen) for y in outs]
    us = [_unit(t, gen) for t in tensors]
    analytical, reentrant = _analytical(outs, vs, tensors, us)
    numerical = _numerical(f, tensors, us, vs, o.eps)
    rows: List[Dict[str, Any]] = []
    failing: List[int] = []
    for i, (name, kind) in enumerate(zip(names, kinds)):
        for j, path in enumerate(out_paths):
            a, n = analytical[i][j], numerical[i][j]
            allowed = o.atol * float(us[i].sum()) * float(vs[j].sum()) + o.rtol * abs(n)
            ok = abs(a - n) <= allowed
            row = {"tensor": name, "kind": kind, "output": path, "analytical": a, "numerical": n,
                   "abs_diff": abs(a - n), "allowed": allowed, "ok": ok}
            if n != 0:
                row["ratio"] = a / n
            rows.append(row)
            if not ok and i not in failing:
                failing.append(i)
    details: Dict[str, Any] = {
        "dtype": "float64", "mode": mode_name(case, train), "eps": o.eps, "atol": o.atol, "rtol": o.rtol,
        "method": "fast (vᵀJu along random unit directions), one tensor at a time",
        "checked": [{"name": n, "kind": k, "numel": t.numel()} for n, k, t in zip(names, kinds, base)],
        "outputs": [{"path": p, "numel": y.numel()} for p, y in zip(out_paths, outs)],
        "jacobian_elements": sum(t.numel() for t in base) * sum(y.numel() for y in outs),
        "slow_cap": o.slow_cap,
        "pairs_checked": len(rows),
        # every failing (tensor, output) pair; when all pass, the one closest to its tolerance
        "directional": [r for r in rows if not r["ok"]] or [max(rows, key=_margin)],
    }
    if not reentrant["ok"]:
        reentrant["tensor"] = names[reentrant["tensor"]]
        details["reentrant"] = reentrant
        return CheckResult("gradcheck", Status.FAIL,
                           f"backward is not reentrant: two backward passes differ by {reentrant['max_diff']:.3g} "
                           f"for {reentrant['tensor']}", where=reentrant["tensor"],
                           hint="the backward is nondeterministic or mutates saved state (a custom Function "
                                "writing into ctx tensors?)", details=details)
    if not failing:
        return CheckResult("gradcheck", Status.PASS,
                           f"analytical = numerical gradients (float64, fast mode) for {len(inputs)} input(s) and "
                           f"{len(params)} parameter(s)", details=details)
    n_out = sum(y.numel() for y in outs)
    slow = []
    for i in failing[:4]:
        slow.append(_slow(f, tensors, i, names[i], n_out, o))
    details["slow"] = slow
    bad_rows = [r for r in rows if not r["ok"]]
    worst = max(bad_rows, key=lambda r: r["abs_diff"])
    ratio = f", ratio analytical/numerical {worst['ratio']:.4g}" if "ratio" in worst else ""
    listed = ", ".join(names[i] for i in failing)
    summary = (f"wrong gradient w.r.t. {listed}: d{worst['output']}/d{worst['tensor']} along a random direction: "
               f"analytical {worst['analytical']:.6g} vs numerical {worst['numerical']:.6g}{ratio} "
               f"(allowed {worst['allowed']:.2g})")
    confirmed = [s for s in slow if s.get("ran") and not s.get("passed")]
    if confirmed:
        summary += f"; slow mode confirms: {confirmed[0]['message']}"
    elif slow and all(s.get("ran") and s.get("passed") for s in slow):
        return CheckResult("gradcheck", Status.WARN, summary + "; but slow mode (element by element) passes",
                           where=listed, hint="a borderline tolerance or a non-smooth point (ReLU kink, max tie)",
                           details=details)
    return CheckResult("gradcheck", Status.FAIL, summary, where=listed,
                       hint="the backward does not compute the derivative of the forward: check the custom "
                            "autograd.Function's backward (or a .detach()/.data) for "
                            + ", ".join(names[i] for i in failing),
                       details=details)


def _margin(row: Dict[str, Any]) -> float:
    """How close a pair came to its tolerance (1 = at the limit)."""
    if row["allowed"] > 0:
        return row["abs_diff"] / row["allowed"]
    return 0.0 if row["abs_diff"] == 0 else float("inf")


def _analytical(outs, vs, tensors, us) -> Tuple[List[List[float]], Dict[str, Any]]:
    """``a[i][j] = ⟨∂⟨v_j, y_j⟩/∂t_i, u_i⟩``; each backward run twice to test reentrancy."""
    a = [[0.0] * len(outs) for _ in tensors]
    reentrant: Dict[str, Any] = {"ok": True}
    for j, (y, v) in enumerate(zip(outs, vs)):
        if not y.requires_grad:
            continue
        g1 = torch.autograd.grad(y, tensors, v, allow_unused=True, retain_graph=True)
        g2 = torch.autograd.grad(y, tensors, v, allow_unused=True, retain_graph=True)
        for i, (x1, x2, u) in enumerate(zip(g1, g2, us)):
            if x1 is not None:
                a[i][j] = float((x1 * u).sum())
                if reentrant["ok"] and x2 is not None and not torch.equal(x1, x2):
                    reentrant = {"ok": False, "tensor": i, "max_diff": float((x1 - x2).abs().max())}
    return a, reentrant


def _numerical(f, tensors, us, vs, eps) -> List[List[float]]:
    """``n[i][j] = ⟨v_j, (f(t_i + eps·u_i) − f(t_i − eps·u_i)) / 2eps⟩``, other tensors fixed."""
    plain = [t.detach() for t in tensors]
    out = []
    with torch.no_grad():
        for i, u in enumerate(us):
            plus = list(plain)
            minus = list(plain)
            plus[i] = plain[i] + eps * u
            minus[i] = plain[i] - eps * u
            yp, ym = f(*plus), f(*minus)
            out.append([float(((p - m) / (2 * eps) * v).sum()) for p, m, v in zip(yp, ym, vs)])
    return out


def _slow(f, tensors, i: int, name: str, n_out: int, o: GradcheckOptions) -> Dict[str, Any]:
    """torch's slow gradcheck on tensor ``i`` alone, if its Jacobian fits under the cap."""
    size = tensors[i].numel() * n_out
    info: Dict[str, Any] = {"tensor": name, "jacobian_elements": size, "cap": o.slow_cap}
    if size > o.slow_cap:
        info.update(ran=False, reason=f"its Jacobian would have {size:,} elements > cap {o.slow_cap:,}")
        return info
    fixed = [t.detach() for t in tensors]

    def fi(x: Tensor):
        args = list(fixed)
        args[i] = x
        return f(*args)

    x = fixed[i].clone().requires_grad_(True)
    try:
        torch.autograd.gradcheck(fi, (x,), eps=o.eps, atol=o.atol, rtol=o.rtol, fast_mode=False,
                                 raise_exception=True)
        info.update(ran=True, passed=True, message="slow mode passes")
    except GradcheckError as exc:
        first = str(exc).strip().splitlines()[0].rstrip(",")
        info.update(ran=True, passed=False, message=f"{first} ({name})", error=str(exc)[:1500])
    return info
