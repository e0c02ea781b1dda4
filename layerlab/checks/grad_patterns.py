"""What shape a wrong gradient has: gradcheck's "the backward is wrong" turned into which mistake.

gradcheck (:mod:`layerlab.checks.numgrad`) compares analytical and numerical derivatives along a
random direction, which says *that* a custom backward is wrong. Here, for small failing tensors,
the whole vector-Jacobian product ``vᵀJ`` is computed both ways (autograd; central differences,
one pair of forwards per element, float64) and compared the way parity compares outputs
(:func:`layerlab.checks.patterns.pattern`), plus one pattern only gradients have:

* **swapped**: the gradient returned for ``x`` is the one ``y`` needs and vice versa (a backward
  that returns its gradients in the wrong order);
* **transposed**: ``x.t() @ g`` where ``g.t() @ x`` is meant;
* a **constant ratio**: a dropped factor, a mean where a broadcast dim must be summed (1/N).

Nothing is claimed when no pattern fits: the caller keeps its plain verdict.

Legend: v the random output direction · J the Jacobian · N a size the ratio names.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from layerlab.checks.patterns import mismatch, pattern

#: elements of all failing tensors together, above which the numerical vᵀJ costs too many forwards
MAX_ELEMENTS = 4096


def _outputs(out: Any) -> List[Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in items if isinstance(o, Tensor) and o.is_floating_point()]


def _loss(f: Callable, args: Sequence[Tensor], vs: List[Tensor]) -> Tensor:
    return sum((o * v).sum() for o, v in zip(_outputs(f(*args)), vs))


def backward_pattern(f: Callable, tensors: Sequence[Tensor], names: Sequence[str], failing: Sequence[str],
                     seed: int = 0, eps: float = 1e-6) -> Optional["Seen"]:
    """What is seen in the wrong gradients of ``failing`` and the fix (a :class:`Seen`), or ``None``."""
    try:  # a refinement of a verdict already reached: if it cannot run, the plain verdict stands
        found = _backward_pattern(f, tensors, names, failing, seed, eps)
    except Exception:
        return None
    return found if found is None or isinstance(found, Seen) else Seen(*found)


def _backward_pattern(f: Callable, tensors: Sequence[Tensor], names: Sequence[str], failing: Sequence[str],
                      seed: int, eps: float) -> Optional[Tuple[str, str]]:
    index = [names.index(n) for n in failing if n in names]
    if not index or sum(tensors[i].numel() for i in index) > MAX_ELEMENTS:
        return None
    fixed = [t.detach().clone() for t in tensors]
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        vs = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in _outputs(f(*fixed))]
    live = list(fixed)
    for i in index:
        live[i] = fixed[i].clone().requires_grad_(True)
    outs = _outputs(f(*live))
    loss = sum((o * v).sum() for o, v in zip(outs, vs))
    # no failing tensor on the graph at all (a stop-gradient on every path): autograd.grad would raise
    grads = (torch.autograd.grad(loss, [live[i] for i in index], allow_unused=True, retain_graph=True)
             if loss.requires_grad else (None,) * len(index))
    analytical = {i: (g if g is not None else torch.zeros_like(fixed[i])).detach() for i, g in zip(index, grads)}
    numerical = {}
    with torch.no_grad():
        for i in index:
            flat, num = fixed[i].reshape(-1), torch.zeros(fixed[i].numel(), dtype=fixed[i].dtype)
            for k in range(flat.numel()):
                keep = float(flat[k])
                flat[k] = keep + eps
                up = float(_loss(f, fixed, vs))
                flat[k] = keep - eps
                down = float(_loss(f, fixed, vs))
                flat[k] = keep
                num[k] = (up - down) / (2 * eps)
            numerical[i] = num.reshape(fixed[i].shape)
    unreached = [i for i, g in zip(index, grads) if g is None and bool(numerical[i].abs().max() > 0)]
    if unreached:
        return _no_gradient(outs, live, names, unreached, every=len(unreached) == len(index))
    close = lambda a, b: a.shape == b.shape and not mismatch(a, b, rtol=1e-5, atol=1e-6 * (1 + float(b.abs().max()))).any()  # noqa: E731
    for a in index:
        for b in index:
            if a < b and close(analytical[a], numerical[b]) and close(analytical[b], numerical[a]) \
                    and not close(analytical[a], numerical[a]):
                return (f"the gradient returned for {names[a]} is the one {names[b]} needs, and vice versa",
                        f"the backward returns its gradients in the wrong order: return them in the order of the "
                        f"forward's inputs ({names[min(a, b)]}, {names[max(a, b)]}, …)")
    ratios = []
    for i in index:
        found = pattern(analytical[i], numerical[i])
        if found is not None and found.kind == "transposed":
            return (f"the gradient of {names[i]} is the right one transposed",
                    f"the backward computes {names[i]}'s gradient transposed: for y = x @ W.T it is g.T @ x, not "
                    "x.T @ g")
        if found is not None and found.kind == "ratio":
            ratios.append((names[i], found))
    if not ratios:
        return None
    name, found = ratios[0]
    n = 1 / found.details["ratio"]
    mean = (f"; 1/{round(n)}: a mean over {round(n)} elements where the backward must sum over the broadcast "
            "dimension?") if found.details["factor"] is None and n > 2.5 and abs(n - round(n)) < 1e-3 else ""
    listed = ", ".join(f"{nm} ({p.details['ratio']:.4g})" for nm, p in ratios)
    return (f"analytical/numerical is constant for {listed}",
            f"the backward's gradient for {name} is off by a constant factor: {found.hint}{mean}")


def custom_function_inputs(roots: Sequence[Any], wanted: Dict[int, str]) -> Dict[str, str]:
    """``{name: Function class name}`` for each leaf tensor of ``wanted`` (``id → name``) that a custom
    ``autograd.Function`` receives directly, found by walking the graph back from ``roots`` (grad_fns)."""
    found: Dict[str, str] = {}
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        custom = isinstance(node, torch.autograd.function.BackwardCFunction)
        for nxt, _ in node.next_functions:
            variable = getattr(nxt, "variable", None)
            if custom and variable is not None and id(variable) in wanted:
                found[wanted[id(variable)]] = node._forward_cls.__name__
            stack.append(nxt)
    return found


class Seen(NamedTuple):
    """What :func:`backward_pattern` saw, and the fix. ``stop_gradient``: every failing tensor is cut
    off the graph by a ``.detach()``/``.data``/``no_grad`` in the forward (no custom Function is
    involved), which a target network or an EMA teacher does on purpose, so it is no verdict."""

    seen: str
    fix: str
    stop_gradient: bool = False


def _no_gradient(outs: Sequence[Tensor], live: Sequence[Tensor], names: Sequence[str],
                 unreached: Sequence[int], every: bool) -> Seen:
    """The output depends on these tensors (finite differences move), yet autograd gives them no
    gradient at all: name the custom autograd.Function that receives them and returns None."""
    wanted = {id(live[i]): names[i] for i in unreached}
    owners = custom_function_inputs([o.grad_fn for o in outs if o.grad_fn is not None], wanted)
    listed = ", ".join(names[i] for i in unreached)
    if owners:
        fns = ", ".join(sorted(set(owners.values())))
        return Seen(f"{listed} gets no gradient at all (None), though the output depends on it: the custom "
                    f"autograd.Function {fns} receives it and its backward returns None in its slot",
                    f"check the ctx.needs_input_grad index that gates {listed}'s gradient in {fns}.backward "
                    "(index i is the forward's i-th input) and the order of the returned gradients")
    return Seen(f"{listed} gets no gradient at all (None), though the output depends on it",
                f"a .detach(), .data or torch.no_grad() cuts {listed} off the graph while the forward still uses "
                "it: expected for a stop-gradient by design (a target network, an EMA teacher), the bug "
                "otherwise", stop_gradient=every)
