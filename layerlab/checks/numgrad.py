"""Check 4: numerical gradient check in float64, inputs and parameters together, each one named.

The layer is made a function of its inputs *and* its parameters with
:func:`torch.func.functional_call`, on a float64 copy (float32 cannot resolve a 1e-6 step).

*Fast mode* is the idea of ``gradcheck(fast_mode=True)``: for random unit directions ``u`` (per
checked tensor) and ``v`` (per output), the analytical ``vᵀJu`` (one backward per output) must
equal the numerical one (a central difference along ``u``), within
``atol·Σu·Σv + rtol·|numerical|`` — torch's tolerances, scaled as torch scales them. It is done
one tensor at a time (two forwards each), so a failure already names the input or parameter,
and the ratio ``analytical / numerical`` shows a dropped factor at a glance. It never builds a
Jacobian (:mod:`layerlab.checks.directional`). (``torch.autograd.gradcheck``'s own fast mode, on
failure, recomputes the full slow Jacobian of every input — exactly what the size cap prevents.)

What can make finite differences lie, and what the check does about it, before any verdict:

* NaN/Inf in an input, a parameter, an output or a gradient: said as such (a NaN is never
  reported as a "wrong gradient" or a "non-reentrant backward", since NaN ≠ NaN);
* float32 islands (:mod:`layerlab.checks.precision`): ops that compute in float32 inside the
  float64 run (Llama's RMSNorm, T5's LayerNorm). The step and tolerances then follow the lowest
  precision seen, the report names the ops, and a mismatch is a failure only if the numerical
  derivative is stable when the step is quadrupled — otherwise the check says it cannot tell;
* a kink (ReLU) or a bend sharper than the step (a LayerNorm of an all-zero row) between the two
  shifted points: a mismatch is re-measured at a step ten times smaller, and is a failure only if
  it does not go away there (a wrong backward is off by the same amount at every step);
* a big model (:mod:`layerlab.checks.sampling`): the tensors checked are chosen under a budget,
  and the report lists what was left out.

*Slow mode* (``torch.autograd.gradcheck(fast_mode=False)``) then confirms each failing tensor of
an all-float64 layer, element by element, only when its Jacobian ``numel(tensor) × Σ
numel(outputs)`` is at most ``slow_cap`` elements; otherwise it is skipped and the report says so.
"""

from __future__ import annotations

import time

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from layerlab.checks.case import (
    Case, cast_args, generator, grad_inputs, has_inference_fast_path, mode_name, module_copy, parity_mode, trainable,
)
from layerlab.checks.directional import (
    Progress, allowed as tolerance, analytical, count_nonfinite, direction, finite as _finite, functional, numerical,
    unit,
)
from layerlab.checks.exact_dtype import exact_dtype
from layerlab.checks.kinks import describe as describe_kinks, off_kinks
from layerlab.checks.magnitude import large_output
from layerlab.checks.precision import IslandRecorder, summary as island_summary
from layerlab.checks.report import CheckResult, Status
from layerlab.checks.sampling import Plan, custom_function_leaves, describe as describe_plan, plan as make_plan
from layerlab.checks.slow_mode import slow_gradcheck
from layerlab.checks.train_mode import reseeded

__all__ = ["GradcheckOptions", "gradcheck", "functional", "low_precision_tolerances"]

#: step and rtol when part of the layer computes in this dtype: the step near the cube root of the
#: dtype's resolution (rounding noise / step ≈ truncation error); atol is measured (``_noise_floor``)
LOW_PRECISION = {torch.float32: (1e-3, 1e-2), torch.float16: (1e-2, 1e-1), torch.bfloat16: (1e-2, 1e-1)}


@dataclass
class GradcheckOptions:
    """Tolerances, caps and budget of the numerical gradient check (torch's defaults for the first three).

    Attributes:
        eps: finite-difference step.
        atol, rtol: tolerances (``torch.autograd.gradcheck``'s defaults).
        slow_cap: the largest Jacobian (elements) slow mode may build for one tensor.
        budget: checked tensors × elements of all tensors, at most (each checked tensor costs two
            forwards of the whole layer); above it, tensors are sampled (:mod:`~layerlab.checks.sampling`).
        min_tensors: tensors checked however big the layer is.
        max_entries: entries a direction covers in one tensor when sampling.
        seconds: finite differences of more tensors than fit in this time (from the first
            forward's time) are sampled too, ``min_tensors`` at least.
        progress: ``progress(what, i, n)`` before each tensor's finite difference.
    """

    eps: float = 1e-6
    atol: float = 1e-5
    rtol: float = 1e-3
    slow_cap: int = 1_000_000
    budget: int = 3_000_000_000
    min_tensors: int = 8
    max_entries: int = 65_536
    seconds: float = 20.0
    progress: Optional[Progress] = None


def low_precision_tolerances(dtype: Optional[torch.dtype], o: GradcheckOptions) -> Tuple[float, float]:
    """``(eps, rtol)`` for a float64 run with islands of ``dtype`` (``None``: none, ``o``'s own)."""
    if dtype is None:
        return o.eps, o.rtol
    eps, rtol = LOW_PRECISION.get(dtype, LOW_PRECISION[torch.float16])
    return max(eps, o.eps), max(rtol, o.rtol)


def gradcheck(case: Case, opts: Optional[Any] = None, reseed: Optional[int] = None) -> CheckResult:
    """Analytical gradients equal finite differences (float64) for every input and parameter (``reseed``: see train_mode)."""
    o = getattr(opts, "gradcheck", None) or GradcheckOptions()
    train = parity_mode(case) if reseed is None else None
    exact = exact_dtype(case)  # float64, or float32 where a kernel refuses float64
    module = module_copy(case.module, exact.dtype, train)
    args = cast_args(case.args, exact.dtype)
    inputs = grad_inputs(args)
    params = [(n, p.detach()) for n, p in trainable(module)]
    names = [n for n, _ in inputs] + [n for n, _ in params]
    kinds = ["input"] * len(inputs) + ["parameter"] * len(params)
    base = [t for _, t in inputs] + [p for _, p in params]
    if not base:
        return CheckResult("gradcheck", Status.SKIP, "no floating input and no trainable parameter to check")
    bad = [(n, k, count_nonfinite(t)) for n, k, t in zip(names, kinds, base) if count_nonfinite(t)]
    if bad:
        n, k, c = bad[0]
        return CheckResult("gradcheck", Status.SKIP, f"{k} {n} already holds {_count(c)}: finite differences need "
                           "finite values", where=n, details={"nonfinite": [
                               {"tensor": n, "kind": k, **c} for n, k, c in bad]})
    f = reseeded(functional(module, args, [t for _, t in inputs], [n for n, _ in params]), reseed)
    tensors = [t.detach().requires_grad_(True) for t in base]
    started = time.perf_counter()
    with IslandRecorder() as recorder:
        outs = f(*tensors)
    forward_s = time.perf_counter() - started
    low = torch.float32 if exact.fallback else recorder.lowest  # the whole run is float32: step and tolerances follow
    out_paths = list(f.paths)  # type: ignore[attr-defined]
    if not outs:
        return CheckResult("gradcheck", Status.SKIP, "the layer has no floating output")
    nan_out = [(p, count_nonfinite(y.detach()), y.numel()) for p, y in zip(out_paths, outs) if count_nonfinite(y.detach())]
    if nan_out:
        p, c, numel = nan_out[0]
        return CheckResult("gradcheck", Status.FAIL, f"the layer outputs {_count(c)} of {numel:,} values in {p} "
                           "on finite inputs and parameters (float64): gradients cannot be checked", where=p,
                           hint="a division by zero, log/sqrt of a non-positive value, or a softmax over a row that "
                                "is masked entirely", details={"nonfinite_outputs": [
                               {"output": p, **c, "numel": n} for p, c, n in nan_out], "dtype": "float64"})
    gen = generator(case.seed, 4)
    numels = [t.numel() for t in base]
    custom = custom_function_leaves(outs, tensors)
    # each checked tensor costs two forwards (four with float32 islands: a second step size); the
    # seeded order is the same on every machine, so a faster one checks a superset, never others
    per_tensor = (4 if low is not None else 2) * max(forward_s, 1e-6)
    chosen = make_plan(kinds, numels, custom, o.budget, o.min_tensors, o.max_entries, gen,
                       max_tensors=int(o.seconds / per_tensor))
    checked = chosen.checked
    eps, rtol = low_precision_tolerances(low, o)
    atol: Any = o.atol
    vs = [unit(y, gen) for y in outs]
    us = {i: direction(tensors[i], gen, chosen.max_entries) for i in checked}
    details: Dict[str, Any] = {
        "dtype": str(exact.dtype).replace("torch.", ""), "mode": mode_name(case, train), "eps": eps, "atol": atol,
        "rtol": rtol,
        "method": "fast (vᵀJu along random unit directions), one tensor at a time",
        "checked": [{"name": names[i], "kind": kinds[i], "numel": numels[i], "entries": us[i].entries}
                    for i in checked],
        "outputs": [{"path": p, "numel": y.numel()} for p, y in zip(out_paths, outs)],
        "jacobian_elements": sum(numels) * sum(y.numel() for y in outs),
        "slow_cap": o.slow_cap,
        "coverage": describe_plan(chosen, names, numels),
    }
    if exact.fallback:
        details["precision"] = exact.to_dict()
    elif recorder.lowest is not None:
        details["low_precision"] = {"dtype": str(recorder.lowest).replace("torch.", ""),
                                    "ops": [i.to_dict() for i in recorder.islands], "more": recorder.more,
                                    "note": "these ops compute in lower precision inside the float64 run: the step "
                                            "and tolerances follow that precision, so small errors go unseen"}
    grads, reentrant, nonfinite = analytical(outs, vs, [tensors[i] for i in checked], [us[i] for i in checked])
    a = {i: grads[k] for k, i in enumerate(checked)}
    if nonfinite:
        first = nonfinite[0]
        name = names[checked[first["tensor"]]]
        details["nonfinite_gradients"] = [dict(x, tensor=names[checked[x["tensor"]]], output=out_paths[x["output"]])
                                          for x in nonfinite]
        return CheckResult("gradcheck", Status.FAIL,
                           f"the gradient w.r.t. {name} holds {_count(first)} of {first['numel']:,} values "
                           f"(backward of {out_paths[first['output']]}) although the output is finite",
                           where=name, hint="a NaN in backward with a finite forward: torch.where/masked_fill over "
                           "a branch that is NaN or Inf (sqrt/log/division by 0 in the branch not taken), or a custom "
                           "backward dividing by zero", details=details)
    if not reentrant["ok"]:
        reentrant["tensor"] = names[checked[reentrant["tensor"]]]
        details["reentrant"] = reentrant
        return CheckResult("gradcheck", Status.FAIL,
                           f"backward is not reentrant: two backward passes differ by {reentrant['max_diff']:.3g} "
                           f"for {reentrant['tensor']}", where=reentrant["tensor"],
                           hint="the backward is nondeterministic or mutates saved state (a custom Function "
                                "writing into ctx tensors?)", details=details)
    progress = _named(o.progress)
    slow_path = has_inference_fast_path(module)
    num = numerical(f, tensors, us, vs, eps, checked, progress, names, as_with_grad=slow_path)
    num4 = None
    if low is not None:  # the 4× step measures the rounding noise of the islands
        num4 = numerical(f, tensors, us, vs, 4 * eps, checked, progress, names, as_with_grad=slow_path)
        details["atol"] = atol = _noise_floor(low, outs, eps, exact.rounding)
        details["tolerance"] = ("low precision: |analytical − numerical| ≤ atol + rtol·|numerical| + 4·|numerical(eps) − "
                                "numerical(4·eps)| at both steps; atol = 0.1·(dtype resolution)·‖output‖/eps")
    rows = _rows(names, kinds, out_paths, checked, a, num, num4, us, vs, atol, rtol)
    details["pairs_checked"] = len(rows)
    # every failing (tensor, output) pair; when all pass, the one closest to its tolerance
    details["directional"] = [r for r in rows if not r["ok"]] or [max(rows, key=_margin)]
    islands = exact.note() if exact.fallback else island_summary(recorder.islands, recorder.more)
    run = _Run(f, tensors, vs, names, kinds, chosen, low, islands, eps, o, us, outs, slow_path, exact.fallback)
    return _verdict(run, rows, details)


@dataclass
class _Run:
    """What the verdict needs of one gradcheck run."""

    f: Any
    tensors: List[Tensor]
    vs: List[Tensor]
    names: List[str]
    kinds: List[str]
    plan: Plan
    low: Optional[torch.dtype]
    islands: str
    eps: float
    opts: GradcheckOptions
    us: Dict[int, Any]
    outs: Sequence[Tensor]
    as_with_grad: bool = False
    fallback: bool = False  # the whole run is float32: a kernel refuses float64 (``islands`` says which)


def _verdict(run: _Run, rows: List[Dict[str, Any]], details: Dict[str, Any]) -> CheckResult:
    checked, eps = run.plan.checked, run.eps
    n_in = sum(1 for i in checked if run.kinds[i] == "input")
    what = f"{n_in} input(s) and {len(checked) - n_in} parameter(s)"
    if run.plan.sampled:
        what += f" (a sample of {len(run.names)} tensors, see details)"
    low = str(run.low).replace("torch.", "") if run.low is not None else None
    precision = ("float64, fast mode" if low is None else
                 f"{run.islands}; step {eps:g}, rtol {details['rtol']:g}" if run.fallback else
                 f"float64 run, but part of the layer computes in {low} ({run.islands}): step {eps:g}, "
                 f"rtol {details['rtol']:g}, so only errors above {low} precision show")
    nonfinite = [r for r in rows if not _finite(r["numerical"])]
    if nonfinite:
        r = nonfinite[0]
        return CheckResult("gradcheck", Status.WARN,
                           f"the numerical derivative d{r['output']}/d{r['tensor']} is {r['numerical']}: a step of "
                           f"{eps:g} along a random direction makes the layer produce NaN/Inf, so the check cannot "
                           f"judge {r['tensor']}", where=r["tensor"],
                           hint="the layer is at the edge of its domain (sqrt/log near 0, a masked-out row)",
                           details=details)
    bad_rows = [r for r in rows if not r["ok"]]
    if not bad_rows:
        return CheckResult("gradcheck", Status.PASS, f"analytical = numerical gradients ({precision}) for {what}",
                           details=details)
    sure = [r for r in bad_rows if not r.get("unsure")]
    finer = _finer_step(run, sure, details)
    if finer and len(finer) == len(bad_rows):
        listed = ", ".join(dict.fromkeys(r["tensor"] for r in finer))
        return CheckResult("gradcheck", Status.PASS,
                           f"analytical = numerical gradients ({precision}) for {what}; {listed} at a step of "
                           f"{eps / FINER:g}: at {eps:g} the finite difference crossed a kink or a sharp bend "
                           "(ReLU, a LayerNorm of a constant row), and agreed once the step shrank",
                           details=details)
    sure = [r for r in sure if r not in finer]
    bad_rows = [r for r in bad_rows if r not in finer]
    if run.low is None and len(sure) == len(bad_rows) and off_kinks(run, sure, details):
        return CheckResult("gradcheck", Status.PASS, f"analytical = numerical gradients ({precision}) for {what} "
                           f"off the kinks: at the given point ({describe_kinks(details)}) the finite difference "
                           "straddles a non-differentiable point (relu/abs at 0, a max over ties) at every step; "
                           "moved off it by ~1e-3 they agree", details=details)
    if not sure:  # low precision: only one of the two steps disagrees
        r = max(bad_rows, key=lambda r: r["abs_diff"])
        listed = ", ".join(dict.fromkeys(r["tensor"] for r in bad_rows))
        return CheckResult("gradcheck", Status.WARN,
                           f"cannot tell: {precision}. The numerical derivative of {listed} changes with the step "
                           f"(d{r['output']}/d{r['tensor']}: {r['numerical']:.6g} at step {eps:g}, "
                           f"{r['numerical_4eps']:.6g} at {4 * eps:g}; analytical {r['analytical']:.6g}): "
                           "rounding noise, not a verdict", where=listed,
                           hint="run the layer with its low-precision casts removed (or in float32 throughout, "
                                "against a float32 reference) to check these gradients", details=details)
    if run.low is None and len(sure) == len(bad_rows) and (big := large_output(run, sure, details, precision, what)):
        return big  # an output so large that float64 rounding explains the mismatch
    failing = list(dict.fromkeys(r["tensor"] for r in sure))
    listed = ", ".join(failing)
    worst = max(sure, key=lambda r: r["abs_diff"])
    ratio = f", ratio analytical/numerical {worst['ratio']:.4g}" if "ratio" in worst else ""
    summary = (f"wrong gradient w.r.t. {listed}: d{worst['output']}/d{worst['tensor']} along a random direction: "
               f"analytical {worst['analytical']:.6g} vs numerical {worst['numerical']:.6g}{ratio} "
               f"(allowed {worst['allowed']:.2g})")
    hint = ("the backward does not compute the derivative of the forward: check the custom autograd.Function's "
            "backward (or a .detach()/.data) for " + listed)
    if low is not None:
        return CheckResult("gradcheck", Status.FAIL, summary + f"; the same at steps {eps:g} and {4 * eps:g}, so "
                           f"not rounding noise (note: {precision})", where=listed, hint=hint, details=details)
    index = {n: i for i, n in enumerate(run.names)}
    n_out = sum(v.numel() for v in run.vs)
    slow = [slow_gradcheck(run.f, run.tensors, index[n], n, n_out, run.opts) for n in failing[:4]]
    details["slow"] = slow
    confirmed = [s for s in slow if s.get("ran") and not s.get("passed")]
    if confirmed:
        summary += f"; slow mode confirms: {confirmed[0]['message']}"
        from layerlab.checks.grad_patterns import backward_pattern

        found = backward_pattern(run.f, run.tensors, run.names, failing, eps=run.eps)
        if found:
            summary, hint = summary + f"; {found.seen}", found.fix
        if found and found.stop_gradient:  # deliberate or not, only the author knows: no verdict
            return CheckResult("gradcheck", Status.WARN,
                               f"cannot judge {listed}: {found.seen} (d{worst['output']}/d{worst['tensor']} along a "
                               f"random direction: numerical {worst['numerical']:.6g}, autograd none)",
                               where=listed, hint=found.fix, details=details)
    elif slow and all(s.get("ran") and s.get("passed") for s in slow):
        return CheckResult("gradcheck", Status.WARN, summary + "; but slow mode (element by element) passes",
                           where=listed, hint="a borderline tolerance or a non-smooth point (ReLU kink, max tie)",
                           details=details)
    return CheckResult("gradcheck", Status.FAIL, summary, where=listed, hint=hint, details=details)


#: how much smaller the second look's step is
FINER = 10


def _finer_step(run: _Run, sure: List[Dict[str, Any]], details: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The failing rows that agree at a step ``FINER`` times smaller, by more than that step's tolerance.

    A backward that computes the wrong derivative is off by the same amount at every step; a
    finite difference that straddles a ReLU kink, or a bend as sharp as a LayerNorm of a constant
    row (its scale is ``sqrt(eps)`` ≈ 1e-6), is off only while the step is larger than the
    feature: measured on Hugging Face DeiT (zero CLS token; error 4e-3 at 1e-6, 3e-4 at 2.5e-7) and
    T5 (ReLU; 7e-3 at 1e-3 and 4e-3, 5e-9 at 1e-4 in float64). The rows that agree are marked ok;
    ``details["finer_step"]`` keeps the numbers."""
    if not sure:
        return []
    small = run.eps / FINER
    which = list(dict.fromkeys(run.names.index(r["tensor"]) for r in sure))
    num = numerical(run.f, run.tensors, run.us, run.vs, small, which, as_with_grad=run.as_with_grad)
    atol = _noise_floor(run.low, run.outs, small) if run.low is not None else None
    paths = [d["path"] for d in details["outputs"]]
    agreed = []
    for r in sure:
        i, j = run.names.index(r["tensor"]), paths.index(r["output"])
        nu = num[i][j]
        if run.low is None:
            allowed = tolerance(run.opts.atol, run.us[i], run.vs[j], details["rtol"], nu)
        else:
            allowed = atol[j] + details["rtol"] * abs(nu)
        diff = abs(r["analytical"] - nu)
        r.update(numerical_finer=nu, step_finer=small, allowed_finer=allowed)
        # agrees within the finer step's tolerance, and the error at ``eps`` lies beyond that whole
        # band: the finer step's rounding noise (10× that at ``eps`` with float32 islands) cannot
        # have moved a step-independent error (a wrong backward) into agreement
        if _finite(nu) and diff <= allowed and diff + allowed <= r["abs_diff"]:
            r["ok"] = True
            agreed.append(r)
    details["finer_step"] = {"step": small, "agreed": list(dict.fromkeys(r["tensor"] for r in agreed)),
                             "still_off": [r["tensor"] for r in sure if r not in agreed]}
    return agreed


def _rows(names, kinds, out_paths, checked, a, num, num4, us, vs, atol, rtol) -> List[Dict[str, Any]]:
    """One row per (tensor, output) pair. Without ``num4``: torch's rule, ``atol·Σu·Σv + rtol·|n|``.
    With it (low precision): the spread between the two steps is added to the allowance, and a
    pair fails only when *both* steps disagree with the analytical value; one of two is ``unsure``."""
    rows: List[Dict[str, Any]] = []
    for i in checked:
        for j, path in enumerate(out_paths):
            an, nu = a[i][j], num[i][j]
            row = {"tensor": names[i], "kind": kinds[i], "output": path, "analytical": an, "numerical": nu,
                   "abs_diff": abs(an - nu)}
            if num4 is None:
                row["allowed"] = tolerance(atol, us[i], vs[j], rtol, nu)
                row["ok"] = row["abs_diff"] <= row["allowed"]
            else:
                n4 = num4[i][j]
                row["numerical_4eps"], row["spread"] = n4, abs(nu - n4)
                row["allowed"] = atol[j] + rtol * abs(nu) + 4 * row["spread"]
                off = [row["abs_diff"] > row["allowed"], abs(an - n4) > row["allowed"]]
                row["ok"] = not any(off)
                row["unsure"] = any(off) and not all(off)
            if nu != 0 and _finite(nu):
                row["ratio"] = an / nu
            rows.append(row)
    return rows


def _noise_floor(dtype: torch.dtype, outs: Sequence[Tensor], eps: float, measured: float = 0.0) -> List[float]:
    """Per output: how much rounding to ``dtype`` can move ``⟨v, Δy⟩ / 2eps`` (``‖v‖ = 1``): a tenth of
    the dtype's resolution times ``‖y‖``, over the step (measured on Llama/T5 blocks: the noise
    stays below it, a dropped term in a backward stays ten times above it). A whole-float32 run
    (:mod:`~layerlab.checks.exact_dtype`) passes its ``measured`` relative rounding, which wins when larger."""
    resolution = max(0.1 * torch.finfo(dtype).eps, measured)
    return [resolution * float(y.detach().norm()) / eps for y in outs]


def _named(progress: Optional[Progress]) -> Optional[Progress]:
    if progress is None:
        return None
    return lambda what, i, n: progress(f"gradcheck {what}" if what else "", i, n)


def _count(c: Dict[str, int]) -> str:
    parts = [f"{c[k]:,} {'NaN' if k == 'nan' else 'Inf'}" for k in ("nan", "inf") if c.get(k)]
    return " and ".join(parts) or "non-finite values"


def _margin(row: Dict[str, Any]) -> float:
    """How close a pair came to its tolerance (1 = at the limit)."""
    if row["allowed"] > 0:
        return row["abs_diff"] / row["allowed"]
    return 0.0 if row["abs_diff"] == 0 else float("inf")
