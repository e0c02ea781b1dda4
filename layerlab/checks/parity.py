"""Forward and backward parity with a reference that carries the layer's weights.

*Forward parity* runs both in float64 (so any difference is the maths, not rounding), then in the
user's dtype, and compares every floating output with ``assert_close``'s tolerances for that
dtype. When the float64 outputs differ and the two modules share submodule names, the first
submodule whose inputs agree but whose outputs differ is named; when every differing submodule
already got a different input, the fault is in the layer's own ``forward`` code before it.

*Backward parity* feeds both the same random ``grad_output`` (float64) and compares the gradient
of every input and of every parameter, by name: a wrong gate order or a transposed weight shows
up as the parameter whose gradient differs.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    Case, call, cast_args, float_leaves, flatten, generator, grad_inputs, module_copy, mode_name, parity_mode,
    randn_like, reference_copy, short_dtype, trainable, user_dtype,
)
from layerlab.checks.compare import Comparison, compare
from layerlab.checks.report import CheckResult, Status

_NO_REF_HINT = "name the layer it should equal: verify(..., reference=nn.LSTM(...)), or `reference:` in the spec"


def _no_reference(name: str, case: Case) -> Optional[CheckResult]:
    if case.reference_error:
        return CheckResult(name, Status.FAIL, f"the reference could not be set up: {case.reference_error}",
                           where="reference",
                           hint="map the names with weight_map: {our_name: their_name} (their_name.T to transpose)",
                           details={"error": case.reference_error})
    if case.reference is None:
        return CheckResult(name, Status.SKIP, "no reference to compare with", hint=_NO_REF_HINT)
    return None


def _run_pair(case: Case, dtype: torch.dtype, train: Optional[bool], *, grad: bool = False):
    ours = module_copy(case.module, dtype, train)
    ref = reference_copy(case.reference, dtype, train)
    args = cast_args(case.args, dtype, requires_grad=grad)
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        out_o = call(ours, args)
        out_r = call(ref, args)
    return ours, ref, args, out_o, out_r


def _compare_outputs(out_o: Any, out_r: Any, dtype: torch.dtype) -> Tuple[List[Comparison], Optional[str]]:
    lo = dict(flatten(out_o))
    lr = dict(flatten(out_r))
    if list(lo) != list(lr):
        common = [p for p in lo if p in lr]
        if not common:
            return [], (f"the outputs have different structure: ours {list(lo)} "
                        f"({_shapes(lo)}), the reference {list(lr)} ({_shapes(lr)})")
        lo = {p: lo[p] for p in common}
    comps = []
    for path, t in lo.items():
        r = lr[path]
        comps.append(compare(t, r, path, dtype=dtype if t.is_floating_point() else None))
    return comps, None


def _shapes(leaves: Dict[str, Tensor]) -> str:
    return ", ".join(f"{p} {tuple(t.shape)}" for p, t in leaves.items())


def forward_parity(case: Case, opts: Any = None) -> CheckResult:
    """Outputs equal the reference's in float64, then in the user's dtype."""
    early = _no_reference("forward_parity", case)
    if early:
        return early
    train = parity_mode(case)
    dtypes = [torch.float64]
    udt = user_dtype(case)
    if udt != torch.float64 and udt.is_floating_point:
        dtypes.append(udt)
    runs = []
    for dtype in dtypes:
        _, _, _, out_o, out_r = _run_pair(case, dtype, train)
        comps, structure_error = _compare_outputs(out_o, out_r, dtype)
        if structure_error:
            return CheckResult("forward_parity", Status.FAIL, structure_error, where="output",
                               hint="return what the reference returns, in the same order",
                               details={"dtype": short_dtype(dtype)})
        runs.append({"dtype": short_dtype(dtype), "comparisons": [c.to_dict() for c in comps],
                     "ok": all(c.ok for c in comps)})
        if dtype == torch.float64 and not runs[-1]["ok"]:
            break
    details: Dict[str, Any] = {"mode": mode_name(case, train), "runs": runs,
                               "reference": case.reference_note}
    first = runs[0]
    if not first["ok"]:
        bad = [c for c in first["comparisons"] if not c["ok"]]
        worst = Comparison(**bad[0])
        where = bad[0]["what"]
        origin = _first_divergent_submodule(case, train)
        if origin:
            details["divergence"] = origin
            where = origin["where"]
        summary = f"float64 outputs differ from the reference: {worst.what}: {worst.describe()}"
        if worst.note:
            summary += f" ({worst.note})"
        return CheckResult("forward_parity", Status.FAIL, summary, where=where,
                           hint=origin["hint"] if origin else
                           "the maths differs from the reference (not rounding: float64); "
                           "compare the formula term by term",
                           details=details)
    if len(runs) > 1 and not runs[1]["ok"]:
        bad = [Comparison(**c) for c in runs[1]["comparisons"] if not c["ok"]]
        return CheckResult("forward_parity", Status.WARN,
                           f"float64 matches; in {runs[1]['dtype']} {bad[0].what} differs beyond assert_close's "
                           f"{runs[1]['dtype']} tolerance: {bad[0].describe()}", where=bad[0].what,
                           hint="a precision difference, not wrong maths: an operation order that loses precision "
                                "(e.g. a sum of large terms before a subtraction)",
                           details=details)
    n = len(runs[0]["comparisons"])
    return CheckResult("forward_parity", Status.PASS,
                       f"{n} output(s) equal the reference in {' and '.join(r['dtype'] for r in runs)} "
                       f"(assert_close tolerances)",
                       details=details)


def _first_divergent_submodule(case: Case, train: Optional[bool]) -> Optional[Dict[str, Any]]:
    """Which submodule first computes something different (both modules hooked, float64)."""
    if not isinstance(case.reference, nn.Module):
        return None
    ours = module_copy(case.module, torch.float64, train)
    ref = reference_copy(case.reference, torch.float64, train)
    names_o = {n for n, _ in ours.named_modules() if n}
    names_r = {n for n, _ in ref.named_modules() if n}
    common = names_o & names_r
    if not common:
        return None
    seen_o, hooks_o = _record(ours, common)
    seen_r, hooks_r = _record(ref, common)
    args = cast_args(case.args, torch.float64)
    try:
        with torch.no_grad():
            call(ours, args)
            call(ref, args)
    finally:
        for h in hooks_o + hooks_r:
            h.remove()
    first_bad_input = None
    for name, (inp_o, out_o) in seen_o.items():
        if name not in seen_r:
            continue
        inp_r, out_r = seen_r[name]
        same_in = _all_close(inp_o, inp_r)
        same_out = _all_close(out_o, out_r)
        if same_in and not same_out:
            return {"where": name, "kind": "submodule",
                    "hint": f"`{name}` receives the same input as the reference's `{name}` but returns a different "
                            "output: the bug is inside it (or in its weights)"}
        if not same_in and first_bad_input is None:
            first_bad_input = name
    if first_bad_input is not None:
        return {"where": f"{type(case.module).__name__}.forward (before `{first_bad_input}`)", "kind": "own code",
                "hint": f"`{first_bad_input}` already receives a different input: the difference arises in the "
                        "layer's own forward code before it, not in a submodule"}
    return None


def _record(module: nn.Module, names: set):
    seen: Dict[str, Tuple[List[Tensor], List[Tensor]]] = {}
    hooks = []
    for name, m in module.named_modules():
        if name not in names:
            continue

        def hook(mod, inputs, output, _name=name):
            if _name not in seen:
                seen[_name] = ([t for _, t in float_leaves(inputs)], [t for _, t in float_leaves(output)])

        hooks.append(m.register_forward_hook(hook))
    return seen, hooks


def _all_close(a: List[Tensor], b: List[Tensor]) -> bool:
    if len(a) != len(b):
        return False
    return all(x.shape == y.shape and compare(x, y, "", dtype=torch.float64).ok for x, y in zip(a, b))


def backward_parity(case: Case, opts: Any = None) -> CheckResult:
    """Input and parameter gradients equal the reference's for the same random grad_output (float64)."""
    early = _no_reference("backward_parity", case)
    if early:
        return early
    train = parity_mode(case)
    ours, ref, args, out_o, out_r = _run_pair(case, torch.float64, train, grad=True)
    lo, lr = float_leaves(out_o), dict(float_leaves(out_r))
    gen = generator(case.seed, 3)
    loss_o, loss_r = 0, 0
    used = []
    for path, t in lo:
        if path not in lr or not t.requires_grad and not lr[path].requires_grad:
            continue
        if t.shape != lr[path].shape:
            return CheckResult("backward_parity", Status.SKIP,
                               f"{path}: shapes differ ({tuple(t.shape)} vs {tuple(lr[path].shape)}); see forward parity")
        g = randn_like(t, gen)
        loss_o = loss_o + (t * g).sum()
        loss_r = loss_r + (lr[path] * g).sum()
        used.append(path)
    if not used:
        return CheckResult("backward_parity", Status.SKIP, "no output requires grad: nothing to differentiate")
    inputs = grad_inputs(args)
    params_o = dict(trainable(ours))
    params_r = dict(ref.named_parameters()) if isinstance(ref, nn.Module) else {}
    pairs: List[Tuple[str, Tensor, Optional[Tensor], bool]] = [(n, t, t, False) for n, t in inputs]
    not_compared = []
    for name, p in params_o.items():
        spec = case.param_map.get(name)
        theirs = spec[:-2] if spec and spec.endswith(".T") else spec
        if theirs is None or theirs not in params_r:
            not_compared.append(name)
            continue
        pairs.append((name, p, params_r[theirs], bool(spec.endswith(".T"))))
    grads_o = _grads(loss_o, [p[1] for p in pairs])
    grads_r = _grads(loss_r, [p[2] for p in pairs])
    comps: List[Comparison] = []
    for (name, _, _, transpose), go, gr in zip(pairs, grads_o, grads_r):
        if transpose and gr is not None:
            gr = gr.t()
        label = f"grad {name}"
        comps.append(compare(go, gr, label, dtype=torch.float64))
    bad = [c for c in comps if not c.ok and not (c.note == "neither has a value")]
    details = {"mode": mode_name(case, train), "grad_outputs": used, "dtype": "float64",
               "comparisons": [c.to_dict() for c in comps], "not_compared": not_compared,
               "reference": case.reference_note}
    if bad:
        names = [c.what[5:] for c in bad]
        param_names = [n for n in names if n in params_o]
        where = ", ".join(param_names or names)
        worst = max(bad, key=lambda c: c.max_abs_diff)
        listed = ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")
        summary = (f"gradients differ from the reference for {listed}; worst {worst.what}: {worst.describe()}")
        if worst.note:
            summary += f" ({worst.note})"
        details["mismatched"] = names
        return CheckResult("backward_parity", Status.FAIL, summary, where=where,
                           hint=_backward_hint(bad, params_o),
                           details=details)
    summary = f"gradients of {len(inputs)} input(s) and {len(pairs) - len(inputs)} parameter(s) equal the reference's"
    if not_compared:
        summary += f"; not compared (no counterpart): {', '.join(not_compared)}"
    return CheckResult("backward_parity", Status.PASS, summary, details=details)


def _grads(loss: Any, tensors: List[Tensor]) -> List[Optional[Tensor]]:
    wanted = [t for t in tensors if t is not None and t.requires_grad]
    if not wanted or not isinstance(loss, Tensor) or not loss.requires_grad:
        return [None] * len(tensors)
    got = torch.autograd.grad(loss, wanted, allow_unused=True, retain_graph=True)
    by_id = {id(t): g for t, g in zip(wanted, got)}
    return [by_id.get(id(t)) if t is not None else None for t in tensors]


def _backward_hint(bad: List[Comparison], params: Dict[str, Any]) -> str:
    missing = [c.what[5:] for c in bad if c.note and c.note.startswith("ours has no gradient")]
    if missing:
        return (f"no gradient reaches {', '.join(missing)}: look for .detach(), .data, torch.no_grad() or an "
                "unused branch on its path")
    if all(c.what[5:] not in params for c in bad):
        return "only input gradients differ: a custom backward, or an op on the input path that is not differentiated"
    return ("the parameters named receive different gradients: check how they enter the formula "
            "(transposed weight, gate order inside a stacked weight, a missing scale)")
