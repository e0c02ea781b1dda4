"""Where a parity failure comes from: a buffer, a weight read wrong, or the first submodule that diverges.

Run after forward or backward parity failed, in float64, on copies:

* :func:`buffer_differences`: *structure* buffers (see :mod:`layerlab.checks.reference`) that
  differ from the reference's, by name and shape; and whether the outputs agree once the
  reference is given ours (then the buffer explains the whole difference);
* :func:`counterfactual`: hypotheses tested by changing the reference and seeing the difference
  vanish: a square weight used transposed, the gate blocks of a stacked RNN weight read in another
  order. A hypothesis is only reported when the outputs then agree within float64 tolerance;
* :func:`first_divergent_submodule`: both modules hooked (positional *and* keyword inputs, every
  call of a submodule called more than once), the innermost submodule that receives the same
  inputs as the reference's namesake but returns something else; or, when a submodule already
  receives different inputs, the forward code of its parent before it.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import Case, call, cast_args, float_leaves, flatten, module_copy, reference_copy
from layerlab.checks.compare import compare
from layerlab.checks.patterns import GATES, mismatch, pattern
from layerlab.checks.reference import OutputAdapter
from layerlab.checks.variants import known_variant

_F64 = torch.float64


def unwrap(ref: Any) -> Any:
    """The module that carries the weights (inside an :class:`OutputAdapter`)."""
    while isinstance(ref, OutputAdapter):
        ref = ref.inner
    return ref


def _outputs_agree(out_o: Any, out_r: Any) -> bool:
    lo, lr = dict(float_leaves(out_o)), dict(float_leaves(out_r))
    return list(lo) == list(lr) and all(
        lo[p].shape == lr[p].shape and not mismatch(lo[p], lr[p]).any() for p in lo)


def _run(case: Case, ref: Any, train: Optional[bool]) -> Tuple[Any, Any]:
    args = cast_args(case.args, _F64)
    with torch.no_grad():
        return call(module_copy(case.module, _F64, train), args), call(ref, args)


# -- buffers ---------------------------------------------------------------------------------------

def buffer_differences(case: Case, train: Optional[bool]) -> List[Dict[str, Any]]:
    """Buffers both have (same name and shape) whose values differ, each with its comparison and
    whether copying ours into the reference makes the outputs agree (``explains_output``)."""
    ref = unwrap(case.reference)
    if not isinstance(ref, nn.Module):
        return []
    theirs = dict(ref.named_buffers())
    found = []
    for name, ours in case.module.named_buffers():
        other = theirs.get(name)
        if other is None or other.shape != ours.shape:
            continue
        if ours.is_floating_point() and other.is_floating_point():
            c = compare(ours, other, f"buffer {name}")
        else:
            c = compare(ours.double(), other.double(), f"buffer {name}", rtol=0.0, atol=0.0)
        if not c.ok:
            found.append({"buffer": name, "comparison": c.to_dict(), "describe": c.describe()})
    if found:
        patched = reference_copy(case.reference, _F64, train)
        inner = dict(unwrap(patched).named_buffers())
        with torch.no_grad():
            for f in found:
                src = dict(case.module.named_buffers())[f["buffer"]]
                inner[f["buffer"]].copy_(src.to(inner[f["buffer"]].dtype))
        try:
            out_o, out_r = _run(case, patched, train)
            agree = _outputs_agree(out_o, out_r)
        except Exception:  # the patched reference failing says nothing either way
            agree = False
        for f in found:
            f["explains_output"] = agree
    return found


# -- hypotheses tested on the reference -----------------------------------------------------------

def counterfactual(case: Case, train: Optional[bool]) -> Optional[Dict[str, Any]]:
    """A change to the reference's weights that makes its outputs equal ours, or ``None``.

    Tries each square weight transposed, then every reordering of the gate blocks of torch's
    stacked RNN weights (all of one layer's ``weight_ih``/``weight_hh``/``bias_*`` together).
    """
    ref = unwrap(case.reference)
    if not isinstance(ref, nn.Module):
        return None
    try:
        out_o, _ = _run(case, reference_copy(case.reference, _F64, train), train)
    except Exception:
        return None
    variant = known_variant(case.reference, out_o, _outputs_agree,
                            lambda r: call(reference_copy(r, _F64, train), cast_args(case.args, _F64)))
    if variant or not case.param_map:  # a textbook variant of the whole layer (layerlab.checks.variants)
        return variant
    ours_of = {(s[:-2] if s.endswith(".T") else s): o for o, s in case.param_map.items()}
    for name, p in unwrap(case.reference).named_parameters():
        if p.dim() == 2 and p.shape[0] == p.shape[1] and p.shape[0] > 1 and name in ours_of:
            if _agrees_after(case, train, out_o, lambda params, n=name: params[n].copy_(params[n].t().clone())):
                ours = ours_of[name]
                return {"kind": "transposed", "where": ours,
                        "text": f"the difference vanishes when the reference uses `{ours}` transposed",
                        "hint": f"`{ours}` is used transposed: x @ W where torch computes x @ W.T "
                                "(or the weight is stored as (in, out))"}
    return _gate_order(case, train, out_o, ours_of) or _attention_scale(case, train, out_o, ours_of)


def _gate_order(case: Case, train: Optional[bool], out_o: Any, ours_of: Dict[str, str]) -> Optional[Dict[str, Any]]:
    ref = unwrap(case.reference)
    gates = next((g for cls, g in GATES.items() if type(ref).__name__ == cls), None)
    stacked = [n for n, _ in ref.named_parameters() if n.split(".")[-1].startswith(("weight_ih", "weight_hh",
                                                                                      "bias_ih", "bias_hh"))]
    if gates is None or not stacked:
        return None
    k = len(gates)
    for perm in itertools.permutations(range(k)):
        if perm == tuple(range(k)):
            continue

        def permute(params: Dict[str, Tensor], perm=perm) -> None:
            for n in stacked:
                blocks = params[n].detach().clone().chunk(k, 0)
                params[n].copy_(torch.cat([blocks[j] for j in perm], 0))

        if _agrees_after(case, train, out_o, permute):
            order = [""] * k
            for torch_gate, block in enumerate(perm):
                order[block] = gates[torch_gate]
            where = ", ".join(ours_of.get(n, n) for n in stacked)
            return {"kind": "gate_order", "where": where, "ours": order, "torch": list(gates),
                    "text": f"the difference vanishes when the reference's gate blocks are reordered: this layer "
                            f"reads the stacked gates as ({', '.join(order)}), torch stacks ({', '.join(gates)})",
                    "hint": f"read the chunks in torch's order: {', '.join(gates)} = gates.chunk({k}, dim=1)"}
    return None


def _attention_scale(case: Case, train: Optional[bool], out_o: Any,
                     ours_of: Dict[str, str]) -> Optional[Dict[str, Any]]:
    """nn.MultiheadAttention's scores are ``q·k / √d_head``: scaling the reference's query projection
    by ``f`` scales them by ``f``; the ``f`` that makes the outputs agree names the scale ours uses."""
    ref = unwrap(case.reference)
    E, h = getattr(ref, "embed_dim", None), getattr(ref, "num_heads", None)
    names = dict(ref.named_parameters())
    if not isinstance(E, int) or not isinstance(h, int) or "in_proj_weight" not in names:
        return None
    d = E // h
    options = ((d ** 0.5, f"no 1/√d_head scale (d_head = {d})", "divide the scores by √d_head: q @ k.T / √d_head"),
               (d ** -0.5, f"the 1/√d_head scale applied twice (d_head = {d})", "divide the scores by √d_head once"),
               ((d / E) ** 0.5, f"1/√embed_dim instead of 1/√d_head ({E} vs {d})",
                "scale by the head dim: q @ k.T / √(embed_dim / num_heads)"))
    for factor, what, fix in options:
        if abs(factor - 1) < 1e-12:
            continue

        def scale_q(params: Dict[str, Tensor], f=factor) -> None:
            params["in_proj_weight"][:E].mul_(f)
            if "in_proj_bias" in params:
                params["in_proj_bias"][:E].mul_(f)

        if _agrees_after(case, train, out_o, scale_q):
            return {"kind": "attention_scale", "where": "attention scores (q·kᵀ scale)", "factor": factor,
                    "text": f"the difference vanishes when the reference's scores are scaled by {factor:.4g}: {what}",
                    "hint": fix}
    return None


def _agrees_after(case: Case, train: Optional[bool], out_o: Any, change) -> bool:
    ref = reference_copy(case.reference, _F64, train)
    with torch.no_grad():
        change(dict(unwrap(ref).named_parameters()))
    try:
        with torch.no_grad():
            out_r = call(ref, cast_args(case.args, _F64))
    except Exception:
        return False
    return _outputs_agree(out_o, out_r)


# -- the first submodule that computes something else --------------------------------------------

def first_divergent_submodule(case: Case, train: Optional[bool],
                              tol: Optional[Tuple[float, float]] = None) -> Optional[Dict[str, Any]]:
    """Which submodule first computes something different (both modules hooked, float64).

    ``tol``: ``(rtol, atol)`` where the layer or its reference rounds through float32 inside the
    float64 run (:class:`~layerlab.checks.precision.Islands`): a submodule whose outputs differ only by
    that rounding is not a culprit, and one fed inputs that differ only by it is not "fed wrong"."""
    if not isinstance(unwrap(case.reference), nn.Module):
        return None
    ours = module_copy(case.module, _F64, train)
    ref = reference_copy(case.reference, _F64, train)
    names_o = {n for n, _ in ours.named_modules() if n}
    names_r = {n for n, _ in unwrap(ref).named_modules() if n}
    common = names_o & names_r
    if not common:
        return None
    seen_o, order, hooks = _record(ours, common)
    seen_r, _, hooks_r = _record(unwrap(ref), common)
    try:
        with torch.no_grad():
            args = cast_args(case.args, _F64)
            call(ours, args)
            call(ref, args)
    finally:
        for h in hooks + hooks_r:
            h.remove()
    culprits, fed_wrong = [], []
    for name, i in order:
        if name not in seen_r or i >= len(seen_r[name]):
            continue
        (in_o, out_o), (in_r, out_r) = seen_o[name][i], seen_r[name][i]
        same_in = _all_close(in_o, in_r, tol)
        if same_in and not _all_close(out_o, out_r, tol):
            culprits.append((name, i, out_o, out_r))
        elif not same_in:
            fed_wrong.append(name)
    # the innermost culprit: a parent diverges too when its child does
    inner = [c for c in culprits if not any(o[0].startswith(c[0] + ".") for o in culprits)]
    if inner:
        name, i, out_o, out_r = inner[0]
        calls = len(seen_o[name])
        step = f" (call {i + 1} of {calls})" if calls > 1 else ""
        children = [n for n in fed_wrong if n.startswith(name + ".")]
        found = pattern(out_o[0], out_r[0], tol=tol) if out_o and out_r else None
        if children:
            hint = (f"`{name}` receives the same inputs as the reference's `{name}`{step}, but its `{children[0]}` "
                    f"already receives different ones: the difference arises in `{name}`'s own forward code "
                    f"before `{children[0]}`")
        else:
            hint = (f"`{name}` receives the same inputs as the reference's `{name}`{step} but returns a different "
                    "output: the bug is inside it (or in its weights)")
        out = {"where": name, "kind": "submodule", "call": i, "calls": calls, "hint": hint}
        if found:
            out["pattern"] = found.to_dict()
            out["hint"] = f"{hint}; its output: {found.text}: {found.hint}"
        return out
    if fed_wrong:
        first = fed_wrong[0]
        return {"where": f"{type(case.module).__name__}.forward (before `{first}`)", "kind": "own code",
                "hint": f"`{first}` already receives a different input: the difference arises in the "
                        "layer's own forward code before it, not in a submodule"}
    return None


def _record(module: nn.Module, names: set):
    """Hooks recording every call's (input leaves, output leaves) of the named submodules, and the
    order calls complete in."""
    seen: Dict[str, List[Tuple[List[Tensor], List[Tensor]]]] = {}
    order: List[Tuple[str, int]] = []
    hooks = []
    for name, m in module.named_modules():
        if name not in names:
            continue

        def hook(mod, args, kwargs, output, _name=name):
            calls = seen.setdefault(_name, [])
            order.append((_name, len(calls)))
            calls.append((_bound_leaves(mod, args, kwargs), [t for _, t in float_leaves(output)]))

        hooks.append(m.register_forward_hook(hook, with_kwargs=True))
    return seen, order, hooks


def _bound_leaves(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Tensor]:
    """The floating tensors a call received, positional and keyword alike, in the order of the
    submodule's ``forward`` parameters (so ``norm(x)`` and ``norm(input=x)`` compare equal)."""
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        values = list(bound.arguments.values())
    except (TypeError, ValueError):
        values = list(args) + [kwargs[k] for k in sorted(kwargs)]
    return [t for _, t in flatten(values) if t.is_floating_point()]


def _all_close(a: List[Tensor], b: List[Tensor], tol: Optional[Tuple[float, float]] = None) -> bool:
    if len(a) != len(b):
        return False
    rtol, atol = tol if tol is not None else (None, None)
    return all(x.shape == y.shape and compare(x, y, "", dtype=_F64, rtol=rtol, atol=atol).ok for x, y in zip(a, b))
