"""Check 10 (``--deep``): second derivatives, strided inputs, determinism, ``torch.compile``.

* ``gradgradcheck``: torch's, fast mode, float64, inputs and parameters together — only under the
  Jacobian cap (its fast mode explains a failure by building slow Jacobians);
* non-contiguous inputs: each input becomes a strided view into a buffer whose gaps hold NaN
  (integers: a huge value), as PyTorch's own tests do; a layer that reads memory as if it were
  contiguous picks up the NaN. Outputs and input gradients must equal the contiguous run's;
* determinism: eval forward twice gives identical bits; train mode is reported next to eval;
* ``torch.compile``: outputs and gradients equal eager's (a compiler missing from the machine is
  a skip, not a failure).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import Tensor

from layerlab.checks.case import (
    Case, call, cast_args, float_leaves, generator, grad_inputs, map_args, module_copy, parity_mode,
    randn_like, short_dtype, trainable, user_dtype,
)
from layerlab.checks.compare import compare
from layerlab.checks.directional import count_nonfinite
from layerlab.checks.numgrad import GradcheckOptions, functional, low_precision_tolerances
from layerlab.checks.precision import IslandRecorder, summary as island_summary
from layerlab.checks.report import CheckResult, Status


def gradgradcheck(case: Case, opts: Any = None) -> CheckResult:
    """Second derivatives (float64, torch.autograd.gradgradcheck fast mode) under the size cap."""
    o = getattr(opts, "gradcheck", None) or GradcheckOptions()
    module = module_copy(case.module, torch.float64, parity_mode(case))
    args = cast_args(case.args, torch.float64)
    inputs = grad_inputs(args)
    params = [(n, p.detach().clone()) for n, p in trainable(module)]
    f = functional(module, args, [t for _, t in inputs], [n for n, _ in params])
    with IslandRecorder() as recorder:
        outs = f(*[t.detach().requires_grad_(True) for _, t in inputs], *[p.requires_grad_(True) for _, p in params])
    n_out = sum(y.numel() for y in outs)
    size = (sum(t.numel() for _, t in inputs) + sum(p.numel() for _, p in params)) * n_out
    details: Dict[str, Any] = {"jacobian_elements": size, "cap": o.slow_cap, "dtype": "float64"}
    bad = [(p, count_nonfinite(y.detach())) for p, y in zip(f.paths, outs) if count_nonfinite(y.detach())]  # type: ignore
    if bad:
        return CheckResult("gradgradcheck", Status.SKIP, f"the layer outputs NaN/Inf in {bad[0][0]} (float64): "
                           "finite differences cannot check its derivatives", where=bad[0][0], details=details)
    eps, rtol = low_precision_tolerances(recorder.lowest, o)
    atol = o.atol if recorder.lowest is None else 10 * rtol * o.atol / o.rtol
    if recorder.lowest is not None:
        low = str(recorder.lowest).replace("torch.", "")
        details["low_precision"] = {"dtype": low, "ops": [i.to_dict() for i in recorder.islands],
                                    "more": recorder.more}
        details.update(eps=eps, atol=atol, rtol=rtol)
    if size > o.slow_cap and inputs:
        # torch's fast gradgradcheck explains a failure with slow Jacobians: keep them under the cap by
        # checking the inputs only (parameters stay fixed inside the function)
        size_in = sum(t.numel() for _, t in inputs) * n_out
        if size_in <= o.slow_cap:
            f = functional(module, args, [t for _, t in inputs], [])
            details.update(jacobian_elements=size_in, parameters_checked=False,
                           note=f"parameters left out: with them the Jacobian has {size:,} elements")
            params, size = [], size_in
    if size > o.slow_cap:
        return CheckResult("gradgradcheck", Status.SKIP,
                           f"too large: the Jacobian has {size:,} elements > cap {o.slow_cap:,} (use smaller inputs)",
                           details=details)
    tensors = [t.detach().clone().requires_grad_(True) for _, t in inputs] + \
              [p.requires_grad_(True) for _, p in params]
    if not tensors:
        return CheckResult("gradgradcheck", Status.SKIP, "nothing to differentiate")
    from torch.autograd.gradcheck import GradcheckError

    try:
        torch.autograd.gradgradcheck(f, tuple(tensors), eps=eps, atol=atol, rtol=rtol, fast_mode=True,
                                     raise_exception=True)
    except GradcheckError as exc:
        first = str(exc).strip().splitlines()[0]
        names = [n for n, _ in inputs] + [n for n, _ in params]
        details["error"] = str(exc)[:1500]
        if recorder.lowest is not None:  # rounding noise of the islands, or a real error: cannot tell
            return CheckResult("gradgradcheck", Status.WARN,
                               f"cannot tell: part of the layer computes in {low} "
                               f"({island_summary(recorder.islands, recorder.more)}), so second derivatives by finite "
                               f"differences (step {eps:g}) are within its rounding noise; torch says: {first}",
                               hint="check second derivatives on a float64-only variant of the layer", details=details)
        return CheckResult("gradgradcheck", Status.FAIL, f"second derivatives are wrong: {first}",
                           where=", ".join(names), hint="a custom backward that is not itself differentiable "
                           "(use torch ops inside backward, or mark it once_differentiable)", details=details)
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0]
        return CheckResult("gradgradcheck", Status.WARN, f"not twice differentiable: {msg}",
                           hint="fine unless you need higher-order gradients (MAML, gradient penalties)",
                           details=details)
    what = "inputs and parameters" if details.get("parameters_checked", True) else "inputs (parameters fixed)"
    precision = "float64, fast mode" if recorder.lowest is None else (
        f"float64 run, but part of the layer computes in {low} ({island_summary(recorder.islands, recorder.more)}): "
        f"step {eps:g}, rtol {rtol:g}, so only errors above {low} precision show")
    return CheckResult("gradgradcheck", Status.PASS,
                       f"second derivatives w.r.t. {what} match finite differences ({precision})",
                       details=details)


def _compare_outputs(expected: Any, actual: Any, gen: torch.Generator,
                     **tolerances: Any) -> Tuple[List[Any], Any, Any]:
    """Compare every float output of ``actual`` with ``expected``'s, by path: ``(comparisons,
    loss_expected, loss_actual)``, the losses weighting both outputs by the same random tensors
    (``0`` when no output needs a gradient) so that their backward passes compare too."""
    comps = []
    loss_e, loss_a = 0, 0
    got = dict(float_leaves(actual))
    for path, y in float_leaves(expected):
        comps.append(compare(got.get(path), y, path, **tolerances))
        if y.requires_grad and path in got:
            g = randn_like(y, gen)
            loss_e, loss_a = loss_e + (y * g).sum(), loss_a + (got[path] * g).sum()
    return comps, loss_e, loss_a


def _strided(t: Tensor) -> Tensor:
    """The same values as ``t`` in a non-contiguous view whose gaps are poisoned."""
    if t.dim() == 0:
        return t
    shape = list(t.shape)
    shape[-1] *= 2
    fill = float("nan") if t.is_floating_point() else (True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)
    buf = torch.full(shape, fill, dtype=t.dtype, device=t.device)
    view = buf[..., ::2]
    view.copy_(t)
    if t.requires_grad:
        view = view.detach().requires_grad_(True)
    return view


def noncontiguous(case: Case, opts: Any = None) -> CheckResult:
    """Outputs and input gradients equal for non-contiguous inputs with NaN-poisoned gaps."""
    module = module_copy(case.module, torch.float64, False)
    args = cast_args(case.args, torch.float64, requires_grad=True)
    strided = map_args(args, lambda t: _strided(t.detach()).requires_grad_(t.requires_grad)
                       if t.is_floating_point() else _strided(t))
    if all(t.is_contiguous() for _, t in grad_inputs(strided)) and not grad_inputs(strided):
        return CheckResult("noncontiguous", Status.SKIP, "no input to make non-contiguous")
    out_a, out_b = call(module, args), call(module, strided)
    comps, loss_a, loss_b = _compare_outputs(out_a, out_b, generator(case.seed, 10), dtype=torch.float64)
    ia, ib = grad_inputs(args), grad_inputs(strided)
    if isinstance(loss_a, Tensor) and ia:
        ga = torch.autograd.grad(loss_a, [t for _, t in ia], allow_unused=True)
        gb = torch.autograd.grad(loss_b, [t for _, t in ib], allow_unused=True)
        for (name, _), x, y in zip(ia, gb, ga):
            comps.append(compare(x, y, f"grad {name}", dtype=torch.float64))
    bad = [c for c in comps if not c.ok]
    details = {"comparisons": [c.to_dict() for c in comps], "gaps": "NaN (integers: max value)"}
    if bad:
        return CheckResult("noncontiguous", Status.FAIL,
                           f"non-contiguous inputs change {bad[0].what}: {bad[0].describe()}", where=bad[0].what,
                           hint="the layer reads raw memory as if it were contiguous (.view on a strided tensor "
                                "in a custom op, data_ptr arithmetic); call .contiguous() first",
                           details=details)
    return CheckResult("noncontiguous", Status.PASS,
                       f"strided inputs with NaN-poisoned gaps give the same {len(comps)} output(s)/gradient(s)",
                       details=details)


def determinism(case: Case, opts: Any = None) -> CheckResult:
    """Eval forward is bitwise repeatable; train vs eval difference reported."""
    dtype = user_dtype(case)
    module = module_copy(case.module, None, False)
    args = cast_args(case.args, None)
    with torch.no_grad():
        a = float_leaves(call(module, args))
        b = float_leaves(call(module, args))
    diff = [(p, float((x - y).abs().nan_to_num(float("inf")).max()) if x.numel() else 0.0)
            for (p, x), (_, y) in zip(a, b) if not torch.equal(x.nan_to_num(), y.nan_to_num())]
    details: Dict[str, Any] = {"dtype": short_dtype(dtype)}
    train = module_copy(case.module, None, True)
    try:
        with torch.no_grad():
            t = float_leaves(call(train, args))
        details["train_vs_eval_max_abs_diff"] = {p: float((x - y).abs().max()) if x.shape == y.shape else None
                                                 for (p, x), (_, y) in zip(t, a)}
    except Exception as exc:
        details["train_error"] = f"{type(exc).__name__}: {exc}"
    if diff:
        return CheckResult("determinism", Status.FAIL,
                           f"two eval-mode forwards on the same input differ: {diff[0][0]} by {diff[0][1]:.3g}",
                           where=diff[0][0], hint="randomness in eval mode (dropout not gated on self.training, "
                           "torch.rand in forward) or state kept between calls", details=details)
    return CheckResult("determinism", Status.PASS, "eval-mode forward is bitwise repeatable", details=details)


def compile_parity(case: Case, opts: Any = None) -> CheckResult:
    """torch.compile output and gradients equal eager (float32 tolerances of the user dtype)."""
    backend = getattr(opts, "compile_backend", None) or "inductor"
    dtype = user_dtype(case)
    eager = module_copy(case.module, None, False)
    compiled_src = module_copy(case.module, None, False)
    try:
        import torch._dynamo  # noqa: F401

        torch._dynamo.reset()
        compiled = torch.compile(compiled_src, backend=backend)
    except Exception as exc:
        return CheckResult("compile", Status.SKIP, f"torch.compile is unavailable: {type(exc).__name__}: {exc}")
    args_e = cast_args(case.args, None, requires_grad=True)
    args_c = cast_args(case.args, None, requires_grad=True)
    try:
        out_c = call(compiled, args_c)
    except Exception as exc:
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        env = any(w in text.lower() for w in ("compiler", "cpp", "gcc", "clang", "triton", "inductor"))
        return CheckResult("compile", Status.SKIP if env else Status.WARN,
                           f"torch.compile (backend {backend}) failed: {text}",
                           hint=None if env else "graph breaks are fine; an error here means the layer cannot be "
                           "compiled (data-dependent Python control flow, unsupported ops)",
                           details={"backend": backend})
    out_e = call(eager, args_e)
    comps, loss_e, loss_c = _compare_outputs(out_e, out_c, generator(case.seed, 11), dtype=dtype,
                                             rtol=1e-4 if dtype == torch.float32 else None,
                                             atol=1e-5 if dtype == torch.float32 else None)
    if isinstance(loss_e, Tensor):
        te = [t for _, t in grad_inputs(args_e)] + [p for _, p in trainable(eager)]
        tc = [t for _, t in grad_inputs(args_c)] + [p for _, p in trainable(compiled_src)]
        names = [n for n, _ in grad_inputs(args_e)] + [n for n, _ in trainable(eager)]
        ge = torch.autograd.grad(loss_e, te, allow_unused=True)
        gc = torch.autograd.grad(loss_c, tc, allow_unused=True)
        for n, a, b in zip(names, gc, ge):
            comps.append(compare(a, b, f"grad {n}", dtype=dtype, rtol=1e-4 if dtype == torch.float32 else None,
                                 atol=1e-5 if dtype == torch.float32 else None))
    bad = [c for c in comps if not c.ok and c.note != "neither has a value"]
    details = {"backend": backend, "comparisons": [c.to_dict() for c in comps]}
    if bad:
        return CheckResult("compile", Status.FAIL, f"torch.compile changes {bad[0].what}: {bad[0].describe()}",
                           where=bad[0].what[5:] if bad[0].what.startswith("grad ") else bad[0].what,
                           hint="eager and compiled disagree: an in-place op on a view, a Python-side value "
                                "captured at trace time, or a compiler bug (try backend='aot_eager' to tell)",
                           details=details)
    return CheckResult("compile", Status.PASS,
                       f"torch.compile (backend {backend}) outputs and gradients equal eager ({len(comps)} tensors)",
                       details=details)
