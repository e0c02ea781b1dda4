"""Directional derivatives, analytical and numerical: the arithmetic of the gradient check.

For a checked tensor ``t_i`` and an output ``y_j``, with random unit directions ``u_i`` (the
tensor) and ``v_j`` (the output), both sides of ``vᵀJu`` are computed without building a Jacobian:

* analytical: ``⟨∂⟨v_j, y_j⟩/∂t_i, u_i⟩``, one backward per output (run twice: the two must be
  bitwise equal, else the backward is not reentrant);
* numerical: ``⟨v_j, (f(t_i + eps·u_i) − f(t_i − eps·u_i)) / 2eps⟩``, two forwards per tensor.

A :class:`Direction` may cover only a random subset of a large tensor's entries (the rest of
``u`` is zero): the check then costs the same two forwards but needs no tensor-sized ``u``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import Arg, call, float_leaves, map_args, rand_like

#: ``progress(what, i, n)``: called before each step of a long check
Progress = Callable[[str, int, int], None]


def functional(module: nn.Module, args: Sequence[Arg], inputs: Sequence[Tensor],
               param_names: Sequence[str]) -> Callable[..., Tuple[Tensor, ...]]:
    """``f(*inputs, *params) -> floating outputs``: the layer with its parameters as explicit inputs
    (parameters not named keep the module's own values).

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


@dataclass
class Direction:
    """A unit direction in one tensor's space: dense, or on the flat entries ``index`` only."""

    values: Tensor
    index: Optional[Tensor] = None

    @property
    def entries(self) -> int:
        return self.values.numel()

    def sum(self) -> float:
        return float(self.values.sum())

    def dot(self, g: Tensor) -> float:
        if self.index is None:
            return float((g * self.values).sum())
        return float((g.reshape(-1)[self.index] * self.values).sum())

    def shift(self, t: Tensor, step: float) -> Tensor:
        if self.index is None:
            return t + step * self.values
        return t.reshape(-1).index_add(0, self.index, step * self.values).view_as(t)


def direction(t: Tensor, gen: torch.Generator, max_entries: Optional[int] = None) -> Direction:
    """A random unit direction with nonnegative entries (as torch's fast gradcheck draws them), on
    at most ``max_entries`` randomly chosen entries of ``t``."""
    if max_entries is None or t.numel() <= max_entries:
        return Direction(_unit(rand_like(t, gen)))
    index = torch.randperm(t.numel(), generator=gen)[:max_entries].sort().values.to(t.device)
    values = torch.rand(max_entries, generator=gen, dtype=t.dtype).to(t.device)
    return Direction(_unit(values), index)


def unit(t: Tensor, gen: torch.Generator) -> Tensor:
    return _unit(rand_like(t, gen))


def _unit(u: Tensor) -> Tensor:
    n = u.norm()
    return u / n if n > 0 else u


def analytical(outs: Sequence[Tensor], vs: Sequence[Tensor], tensors: Sequence[Tensor],
               us: Sequence[Direction]) -> Tuple[List[List[float]], Dict[str, Any], List[Dict[str, Any]]]:
    """``(a, reentrant, nonfinite)``: ``a[i][j] = ⟨∂⟨v_j, y_j⟩/∂t_i, u_i⟩``; ``reentrant`` says whether
    two backward passes agree bitwise; ``nonfinite`` lists the gradients holding NaN/Inf
    (``{"tensor": i, "output": j, "nan": n, "inf": n, "numel": n}``)."""
    a = [[0.0] * len(outs) for _ in tensors]
    reentrant: Dict[str, Any] = {"ok": True}
    nonfinite: List[Dict[str, Any]] = []
    for j, (y, v) in enumerate(zip(outs, vs)):
        if not y.requires_grad:
            continue
        g1 = torch.autograd.grad(y, tensors, v, allow_unused=True, retain_graph=True)
        g2 = torch.autograd.grad(y, tensors, v, allow_unused=True, retain_graph=True)
        for i, (x1, x2, u) in enumerate(zip(g1, g2, us)):
            if x1 is None:
                continue
            bad = count_nonfinite(x1)
            if bad:
                nonfinite.append({"tensor": i, "output": j, **bad, "numel": x1.numel()})
                a[i][j] = math.nan
                continue
            a[i][j] = u.dot(x1)
            if reentrant["ok"] and x2 is not None and not torch.equal(x1, x2):
                reentrant = {"ok": False, "tensor": i, "max_diff": float((x1 - x2).abs().nan_to_num(math.inf).max())}
    return a, reentrant, nonfinite


def numerical(f: Callable[..., Tuple[Tensor, ...]], tensors: Sequence[Tensor], us: Sequence[Direction],
              vs: Sequence[Tensor], eps: float, which: Optional[Sequence[int]] = None,
              progress: Optional[Progress] = None, names: Optional[Sequence[str]] = None,
              as_with_grad: bool = False) -> Dict[int, List[float]]:
    """``{i: n_i}`` with ``n_i[j] = ⟨v_j, (f(t_i + eps·u_i) − f(t_i − eps·u_i)) / 2eps⟩``, other tensors
    fixed, for the tensors ``which`` (default: all).

    ``as_with_grad``: run the forwards as the analytical pass does, with autograd on and the shifted
    tensor requiring grad. torch's transformer layers take a different code path when no grad is
    needed (the nested-tensor fast path, which zeroes padded positions): finite differences of that
    path would be compared with the gradient of the other one."""
    plain = [t.detach().requires_grad_(as_with_grad and t.is_floating_point()) for t in tensors]
    todo = list(range(len(tensors))) if which is None else list(which)
    out: Dict[int, List[float]] = {}
    with torch.enable_grad() if as_with_grad else torch.no_grad():
        for k, i in enumerate(todo):
            if progress is not None:
                progress(names[i] if names else str(i), k, len(todo))
            plus, minus = list(plain), list(plain)
            plus[i] = us[i].shift(plain[i], eps)
            minus[i] = us[i].shift(plain[i], -eps)
            yp = [y.detach() for y in f(*plus)]
            ym = [y.detach() for y in f(*minus)]
            out[i] = [float(((p - m) / (2 * eps) * v).sum()) for p, m, v in zip(yp, ym, vs)]
    if progress is not None:
        progress("", len(todo), len(todo))
    return out


def count_nonfinite(t: Tensor) -> Dict[str, int]:
    """``{"nan": n, "inf": n}`` when ``t`` holds any, else ``{}``."""
    if not t.is_floating_point() or bool(torch.isfinite(t).all()):
        return {}
    return {"nan": int(torch.isnan(t).sum()), "inf": int(torch.isinf(t).sum())}


def allowed(atol: float, u: Tensor, v: Tensor, rtol: float, numerical_value: float) -> float:
    """torch's gradcheck tolerance for one directional derivative: ``atol·Σu·Σv + rtol·|n|``."""
    return atol * u.sum() * float(v.sum()) + rtol * abs(numerical_value)


def finite(x: float) -> bool:
    """Neither NaN nor ±inf (a plain float)."""
    return x == x and abs(x) != float("inf")
