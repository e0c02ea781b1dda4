"""Check 1: the layer runs, and what comes out has the shape and dtype its contract promises.

The forward runs on a copy with a pre-hook and a hook on every submodule. A call that raises
never reaches its hook, so the innermost call still open is the one that failed: it is named,
with its input shapes and the calls that finished before it. On success the output is checked
against explain-shape's formula (conv/pool-type layers, via :func:`layerlab.probe.formula.shape_op`),
against the reference's output shapes, for dtype (float32 in → float32 out), for NaN/inf, and for
inputs modified in place.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from layerlab.checks.case import (
    Case, call, cast_args, flatten, float_leaves, is_mask_name, module_copy, reference_copy, short_dtype, user_dtype,
)
from layerlab.checks.report import CheckResult, Status


def _shapes(value: Any) -> List[List[int]]:
    # a nested tensor (torch's transformer fast path) has no one shape: its dims, ragged ones as -1
    return [list(t.shape) if not t.is_nested else [-1 if s is None else s for s in _nested_dims(t)]
            for _, t in flatten(value, "")]


def _nested_dims(t: torch.Tensor) -> List[Optional[int]]:
    sizes = t._nested_tensor_size()  # one row of sizes per component
    return [t.size(0)] + [int(c[0]) if bool((c == c[0]).all()) else None for c in sizes.unbind(1)]


def _finite(value: Any) -> bool:
    return all(torch.isfinite(t).all() for _, t in flatten(value, "") if t.is_floating_point() and not t.is_nested)


def _library_module(module: nn.Module) -> bool:
    """Is it one of torch's own modules (whose math torch tests), not code under test?"""
    return type(module).__module__.startswith("torch.")


class _Tracer:
    """Forward pre-hooks and hooks that keep the stack of open calls and the finished ones."""

    def __init__(self, root: nn.Module) -> None:
        self.stack: List[Tuple[str, List[List[int]]]] = []
        self.done: List[Dict[str, Any]] = []
        #: the first call (innermost first) whose output is non-finite while its inputs are finite
        self.non_finite_origin: Optional[Tuple[str, nn.Module]] = None
        self.handles = []
        for name, m in root.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._pre(name or "(root)")))
            self.handles.append(m.register_forward_hook(self._post(name or "(root)")))

    def _pre(self, name: str):
        def hook(module, inputs):
            self.stack.append((name, _shapes(inputs)))
        return hook

    def _post(self, name: str):
        def hook(module, inputs, output):
            if self.stack and self.stack[-1][0] == name:
                _, in_shapes = self.stack.pop()
                self.done.append({"module": name, "type": type(module).__name__, "inputs": in_shapes,
                                  "outputs": _shapes(output)})
            if self.non_finite_origin is None and not _finite(output) and _finite(inputs):
                self.non_finite_origin = (name, module)
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def runs(case: Case, opts: Any = None) -> CheckResult:
    """The forward runs; output shapes follow the formula and the reference; dtype kept; finite."""
    module = module_copy(case.module)
    args = cast_args(case.args, None)
    versions = {a.name: [t._version for _, t in flatten(a.value)] for a in args}
    tracer = _Tracer(module)
    try:
        with torch.no_grad():
            out = call(module, args)
    except Exception as exc:  # the layer's own failure: that is what this check reports
        failing, in_shapes = tracer.stack[-1] if tracer.stack else ("(root)", _shapes([a.value for a in args]))
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return CheckResult(
            "runs", Status.FAIL, f"the layer raised {type(exc).__name__}: {message}", where=failing,
            hint=f"`{failing}` failed on inputs of shape {in_shapes}; the calls before it are listed in the details",
            details={"exception": type(exc).__name__, "message": str(exc)[:2000], "failing_module": failing,
                     "failing_inputs": in_shapes, "ran_before": tracer.done[-10:],
                     "inputs": {a.name: _shapes(a.value) for a in args}},
        )
    finally:
        tracer.remove()
    leaves = flatten(out)
    details: Dict[str, Any] = {
        "inputs": {a.name: _shapes(a.value) for a in args},
        "outputs": {p: {"shape": list(t.shape), "dtype": short_dtype(t.dtype)} for p, t in leaves},
    }
    problems: List[Tuple[str, str, str]] = []  # (where, what, hint)
    domain: List[Tuple[str, str, str]] = []  # non-finite values made by torch's own module: warnings
    udt = user_dtype(case)
    for path, t in float_leaves(out):
        if t.dtype != udt:
            problems.append((path, f"{path} is {short_dtype(t.dtype)} for {short_dtype(udt)} input",
                             "create internal tensors with dtype=x.dtype, device=x.device"))
        if not torch.isfinite(t).all():
            n = int((~torch.isfinite(t)).sum())
            origin = tracer.non_finite_origin
            if (origin is not None and _library_module(origin[1]) and _library_module(case.module)
                    and _finite([a.value for a in args])):
                # torch's own module tested on finite input: the input lies outside its domain
                # (LPPool's x ** p with a fractional p on negative values), not a bug of the layer.
                # Inside a user's model the same NaN is the model's to explain: it stays a failure.
                domain.append((path, f"{path} has {n} non-finite value(s): torch's own "
                               f"{type(origin[1]).__name__} at `{origin[0]}` returns them for this input",
                               "the input is outside that module's domain (e.g. negative values into a "
                               "fractional power): give inputs in its domain, or check what feeds it"))
            else:
                at = f" (first at `{origin[0]}`, from finite inputs)" if origin else ""
                problems.append((path, f"{path} has {n} non-finite value(s) on random input{at}",
                                 "look for a division by zero, log of ≤ 0, or a fully masked softmax row"))
    formula = _formula(module, args, leaves)
    if formula:
        details["formula"] = formula
        if formula.get("ok") is False:
            problems.append(("output", f"output shape {formula['actual']} ≠ {formula['predicted']} from "
                             f"{formula['call']}", "the output-size arithmetic differs from torch's: see explain-shape"))
    if isinstance(case.reference, nn.Module) or callable(case.reference):
        try:
            ref = reference_copy(case.reference, None, module.training)
            with torch.no_grad():
                ref_out = call(ref, cast_args(case.args, None))
            ref_shapes = {p: list(t.shape) for p, t in flatten(ref_out)}
            details["reference_outputs"] = ref_shapes
            for path, t in leaves:
                if path in ref_shapes and ref_shapes[path] != list(t.shape):
                    problems.append((path, f"{path} has shape {list(t.shape)}, the reference returns "
                                     f"{ref_shapes[path]}", "match the reference's layout (batch_first? "
                                     "squeezed dims?)"))
        except Exception as exc:
            details["reference_error"] = f"{type(exc).__name__}: {exc}"
    for a in args:
        now = [t._version for _, t in flatten(a.value)]
        if now != versions[a.name] and not is_mask_name(a.name):
            problems.append((a.name, f"input {a.name!r} was modified in place",
                             "clone the input before an in-place op, or say the layer is in-place"))
    shapes = ", ".join(f"{p} {tuple(t.shape)}" for p, t in leaves) or "no tensor"
    if problems:
        where, what, hint = problems[0]
        details["problems"] = [{"where": w, "problem": p, "hint": h} for w, p, h in problems]
        return CheckResult("runs", Status.FAIL, "; ".join(p for _, p, _ in problems), where=where, hint=hint,
                           details=details)
    if domain:
        where, what, hint = domain[0]
        details["problems"] = [{"where": w, "problem": p, "hint": h} for w, p, h in domain]
        details["outside_domain"] = True
        return CheckResult("runs", Status.WARN, "; ".join(p for _, p, _ in domain), where=where, hint=hint,
                           details=details)
    summary = f"runs: {shapes}"
    if formula and formula.get("ok"):
        summary += f" (= {formula['call']})"
    return CheckResult("runs", Status.PASS, summary, details=details)


def _formula(module: nn.Module, args, leaves) -> Optional[Dict[str, Any]]:
    """explain-shape's prediction for conv/pool-type layers (``None`` when no formula covers it)."""
    try:
        from layerlab.probe.formula import shape_op
        from layerlab.shapes import explain
    except ImportError:  # pragma: no cover - the probe package is optional here
        return None
    found = shape_op(module)
    if found is None or not args or not leaves:
        return None
    first = flatten(args[0].value)
    if not first:
        return None
    op, params = found
    try:
        ex = explain(op, list(first[0][1].shape), **params)
    except Exception as exc:  # explain-shape cannot model this configuration
        return {"op": op, "note": f"no formula: {getattr(exc, 'message', exc)}"}
    if ex.error is not None or ex.output_shape is None:
        return {"op": op, "call": ex.call, "note": "the arithmetic says torch raises", "ok": None}
    actual = list(leaves[0][1].shape)
    return {"op": op, "call": ex.call, "predicted": list(ex.output_shape), "actual": actual,
            "ok": list(ex.output_shape) == actual,
            "steps": [f"{s.dim}: {s.substituted} = {s.output}" for s in ex.steps]}
