"""Forward and backward parity with a reference that carries the layer's weights.

*Forward parity* runs both in float64 (so any difference is the maths, not rounding), then in the
user's dtype, and compares every floating output with ``assert_close``'s tolerances for that
dtype, and every *structure* buffer both have (a positional table built wrong is a finding, see
:mod:`layerlab.checks.reference`). A float64 difference is then located as precisely as the
evidence allows (:mod:`layerlab.checks.divergence`, :mod:`layerlab.checks.patterns`): a weight
that, transposed or with its gate blocks reordered in the reference, makes the difference vanish;
else the innermost submodule that receives the reference's inputs but returns something else;
and the pattern of the difference (a constant ratio such as N/(N−1), an offset, only the last
position). The hint follows from what was found, never from a list of usual suspects.

*Backward parity* feeds both the same random ``grad_output`` (float64) and compares the gradient
of every input and of every parameter, by name; the parameters are listed worst first by
relative error ``‖Δ‖/‖ref‖``, with the pattern of the worst one.

*Float32 islands* (:mod:`layerlab.checks.precision`): a layer (or reference) that computes part of
its forward in float32 on purpose (Llama's RMSNorm: ``hidden_states.to(torch.float32)``) differs from
a float64 counterpart by float32 rounding even when both are right. The float64 runs record such
ops; when there are any, both parities compare with ``assert_close``'s tolerances for the lowest
precision seen, say so in the summary, and look for patterns only above that rounding.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    Case, call, cast_args, float_leaves, flatten, generator, grad_inputs, has_batch_first, module_copy, mode_name,
    parity_mode, randn_like, reference_copy, short_dtype, time_dim, trainable, user_dtype,
)
from layerlab.checks.compare import Comparison, compare
from layerlab.checks.divergence import buffer_differences, counterfactual, first_divergent_submodule, unwrap
from layerlab.checks.exact_dtype import exact_dtype
from layerlab.checks.patterns import Pattern, mismatch, pattern
from layerlab.checks.precision import Islands
from layerlab.checks.report import CheckResult, Status

#: what a float64 difference is tested for before layerlab admits it cannot say why
_TESTED = ["a differing structure buffer", "a square weight used transposed", "gate blocks read in another order",
           "a different attention scale", "the innermost submodule that diverges", "a constant ratio or offset",
           "a difference confined to some positions, gate blocks or indices"]

_NO_REF_HINT = "name the layer it should equal: verify(..., reference=nn.LSTM(...)), or `reference:` in the spec"


def _no_reference(name: str, case: Case) -> Optional[CheckResult]:
    if case.reference_error:
        return CheckResult(name, Status.FAIL, f"the reference could not be set up: {case.reference_error}",
                           where="reference",
                           hint="map the names with weight_map: {our_name: their_name} (their_name.T to transpose)",
                           details={"error": case.reference_error})
    if case.reference is None and case.reference_suspect:
        return CheckResult(name, Status.WARN, case.reference_suspect, where="reference",
                           hint="no auto-reference could be chosen, so this is not a verdict; the layer looks wrong",
                           details={"reference": case.reference_note})
    if case.reference is None:
        note = f" ({case.reference_note})" if case.reference_note else ""
        return CheckResult(name, Status.SKIP, f"no reference to compare with{note}", hint=_NO_REF_HINT)
    return None


def _run_pair(case: Case, dtype: torch.dtype, train: Optional[bool], *, grad: bool = False):
    """Both forwards; in float64 the ops that rounded through a lower precision are recorded
    (returned as an :class:`Islands`, empty in other dtypes: there rounding is expected)."""
    ours = module_copy(case.module, dtype, train)
    ref = reference_copy(case.reference, dtype, train)
    args = cast_args(case.args, dtype, requires_grad=grad)
    ctx = torch.enable_grad() if grad else torch.no_grad()
    islands = Islands()
    with ctx:
        out_o = islands.record("ours", lambda: call(ours, args), dtype)
        out_r = islands.record("the reference", lambda: call(ref, args), dtype)
    return ours, ref, args, out_o, out_r, islands


def _compare_outputs(out_o: Any, out_r: Any, dtype: torch.dtype,
                     tol: Optional[Tuple[float, float]] = None) -> Tuple[List[Comparison], Optional[str]]:
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
        rtol, atol = tol if tol and t.is_floating_point() else (None, None)
        comps.append(compare(t, r, path, dtype=dtype if t.is_floating_point() else None, rtol=rtol, atol=atol))
    return comps, None


def _shapes(leaves: Dict[str, Tensor]) -> str:
    return ", ".join(f"{p} {tuple(t.shape)}" for p, t in leaves.items())


def forward_parity(case: Case, opts: Any = None) -> CheckResult:
    """Outputs equal the reference's in float64, then in the user's dtype; structure buffers too."""
    early = _no_reference("forward_parity", case)
    if early:
        return early
    train = parity_mode(case)
    exact = exact_dtype(case)  # float64, or float32 where a kernel refuses float64
    dtypes = [exact.dtype]
    udt = user_dtype(case)
    if udt != exact.dtype and udt.is_floating_point:
        dtypes.append(udt)
    runs = []
    last: Tuple[Any, Any] = (None, None)
    islands = Islands()
    for dtype in dtypes:
        _, _, _, out_o, out_r, seen = _run_pair(case, dtype, train)
        if dtype == torch.float64:
            islands = seen
        tol = (islands.tol if dtype == torch.float64 else None) if dtype != exact.dtype or not exact.fallback \
            else exact.parity_tol(_scale(out_r))
        comps, structure_error = _compare_outputs(out_o, out_r, dtype, tol)
        if structure_error:
            return CheckResult("forward_parity", Status.FAIL, structure_error, where="output",
                               hint="return what the reference returns, in the same order",
                               details={"dtype": short_dtype(dtype), "reference": case.reference_note})
        runs.append({"dtype": short_dtype(dtype), "comparisons": [c.to_dict() for c in comps],
                     "ok": all(c.ok for c in comps)})
        if dtype == exact.dtype:
            last = (out_o, out_r)
            if not runs[-1]["ok"]:
                break
    details: Dict[str, Any] = {"mode": mode_name(case, train), "runs": runs,
                               "reference": case.reference_note}
    if exact.fallback:
        details["precision"] = exact.to_dict()
    if islands.lowest is not None:
        details["low_precision"] = islands.to_dict()
    buffers = buffer_differences(case, train)
    if buffers:
        details["buffers"] = buffers
    first = runs[0]
    if not first["ok"] or buffers:
        return _explain_forward(case, train, first, buffers, last, details, islands)
    if len(runs) > 1 and not runs[1]["ok"]:
        bad = [Comparison(**c) for c in runs[1]["comparisons"] if not c["ok"]]
        return CheckResult("forward_parity", Status.WARN,
                           f"float64 matches; in {runs[1]['dtype']} {bad[0].what} differs beyond assert_close's "
                           f"{runs[1]['dtype']} tolerance: {bad[0].describe()}", where=bad[0].what,
                           hint="a precision difference, not wrong maths: an operation order that loses precision "
                                "(e.g. a sum of large terms before a subtraction)",
                           details=details)
    n = len(runs[0]["comparisons"])
    eval_only = ""
    if train is False and case.module.training:  # random train-mode forward: eval draws nothing, so check means
        from layerlab.checks.expectation import train_mean_mismatch

        mismatch = train_mean_mismatch(case)
        if mismatch is not None:
            details["train_mean"] = vars(mismatch)
            return CheckResult("forward_parity", Status.FAIL, f"equal in eval mode, but {mismatch.describe()}",
                               where=mismatch.output, hint=mismatch.hint(), details=details)
        eval_only = " in eval mode (train mode draws random numbers; its averages agree or were not compared)"
    tolerance = f"; float64 {islands.note()}" if islands.lowest is not None else ""
    if exact.fallback:
        tolerance = f"; {exact.note()}"
    return CheckResult("forward_parity", Status.PASS,
                       f"{n} output(s) equal {_against(case)} in {' and '.join(r['dtype'] for r in runs)} "
                       f"(assert_close tolerances){eval_only}{tolerance}",
                       details=details)


def _scale(out: Any) -> float:
    """The largest magnitude among the floating tensors of ``out`` (tolerances of a float32 fallback scale with it)."""
    values = [float(t.detach().abs().max()) for _, t in flatten(out) if t.is_floating_point() and t.numel()]
    return max(values, default=1.0)


def _against(case: Case) -> str:
    """``the reference``, or ``the auto-reference torch.nn.GRUCell`` when layerlab chose it."""
    if not case.reference_auto:
        return "the reference"
    return f"the auto-reference {case.reference_auto.split('(', 1)[0].split()[-1]}"


def _explain_forward(case: Case, train: Optional[bool], first: Dict[str, Any], buffers: List[Dict[str, Any]],
                     outputs: Tuple[Any, Any], details: Dict[str, Any], islands: Islands) -> CheckResult:
    """A float64 difference (or a differing buffer), located as precisely as the evidence allows:
    a buffer, a weight read wrong, the first divergent submodule, a pattern in the output."""
    bad = [c for c in first["comparisons"] if not c["ok"]]
    if buffers:
        b = buffers[0]
        effect = ("the outputs differ, and agree once the reference is given ours: the buffer explains it all"
                  if bad and b["explains_output"] else
                  "the outputs differ too" if bad else "these inputs do not reach the differing entries")
        return CheckResult("forward_parity", Status.FAIL,
                           f"buffer `{b['buffer']}` differs from {_against(case)}'s ({b['describe']}); {effect}",
                           where=", ".join(x["buffer"] for x in buffers),
                           hint=f"`{b['buffer']}` is structure built in __init__ (not state updated by forward): "
                                "compute it as the reference does",
                           details=details)
    worst = Comparison(**bad[0])
    summary = f"float64 outputs differ from {_against(case)}: {worst.what}: {worst.describe()}"
    if worst.note:
        summary += f" ({worst.note})"
    if islands.lowest is not None:
        summary += f" ({islands.note()})"
    where, hint = worst.what, None
    hypothesis = counterfactual(case, train)
    origin = first_divergent_submodule(case, train, islands.tol) if hypothesis is None else None
    found = _output_pattern(case, outputs, worst.what, islands.tol)
    if hypothesis:
        details["hypothesis"] = hypothesis
        where, hint = hypothesis["where"], hypothesis["hint"]
        summary += f"; {hypothesis['text']}"
    elif origin:
        details["divergence"] = origin
        where, hint = origin["where"], origin["hint"]
    if found:
        details["pattern"] = found.to_dict()
        summary += f"; {worst.what}: {found.text}"
        if not hypothesis and not origin and found.kind in ("positions", "indices"):
            which = found.details.get("positions", found.details.get("indices", []))
            where = f"{worst.what} {'positions' if found.kind == 'positions' else 'dim %d indices' % found.details['dim']} " \
                    f"{', '.join(map(str, which[:8]))}"
        if hint is None or (origin and "pattern" not in origin):
            hint = f"{hint}; {found.hint}" if hint else found.hint
    if hint is None:
        hint = ("not rounding (float64), and none of the patterns layerlab tests for explains it (see "
                "details.tested): compare the formula with the reference's term by term")
        details["tested"] = _TESTED
    return CheckResult("forward_parity", Status.FAIL, summary, where=where, hint=hint, details=details)


def _output_pattern(case: Case, outputs: Tuple[Any, Any], path: str,
                    tol: Optional[Tuple[float, float]] = None) -> Optional[Pattern]:
    lo, lr = dict(float_leaves(outputs[0])), dict(float_leaves(outputs[1]))
    if path not in lo or path not in lr:
        return None
    t = lo[path]
    tdim = time_dim(case.module, t) if t.dim() >= 2 and _is_sequence(case) else None
    if isinstance(unwrap(case.reference), (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d)) and t.dim() >= 2:
        tdim = t.dim() - 1  # (B, C, L): the position is the last dim
    return pattern(t, lr[path], sizes=_layer_sizes(case.module), time_dim=tdim, tol=tol)


def _is_sequence(case: Case) -> bool:
    return has_batch_first(case.module) or any(isinstance(m, nn.Conv1d) for m in case.module.modules()) or \
        any(t.dim() == 3 for a in case.args for _, t in flatten(a.value) if t.is_floating_point())


def _layer_sizes(module: nn.Module) -> List[int]:
    """Sizes a scale factor may be built from: the layer's int attributes and its parameters' dims."""
    sizes = {v for m in module.modules() for v in vars(m).values() if isinstance(v, int) and not isinstance(v, bool)}
    sizes |= {d for p in module.parameters() for d in p.shape}
    for m in module.modules():
        shape = getattr(m, "normalized_shape", None)
        if isinstance(shape, (tuple, list)) and shape:
            sizes.add(int(torch.Size(shape).numel()))
    return sorted(s for s in sizes if 1 < s <= 1 << 16)


def backward_parity(case: Case, opts: Any = None) -> CheckResult:
    """Input and parameter gradients equal the reference's for the same random grad_output (float64)."""
    early = _no_reference("backward_parity", case)
    if early:
        return early
    train = parity_mode(case)
    exact = exact_dtype(case)
    ours, ref, args, out_o, out_r, islands = _run_pair(case, exact.dtype, train, grad=True)
    rtol, atol = islands.tol or (None, None)
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
    rel: Dict[str, float] = {}
    got: Dict[str, Tuple[Optional[Tensor], Optional[Tensor]]] = {}
    for (name, _, _, transpose), go, gr in zip(pairs, grads_o, grads_r):
        if transpose and gr is not None:
            gr = gr.t()
        if exact.fallback:
            rtol, atol = exact.parity_tol(_scale(gr))
        comps.append(compare(go, gr, f"grad {name}", dtype=exact.dtype, rtol=rtol, atol=atol))
        rel[name] = _relative_error(go, gr)
        got[name] = (go, gr)
    bad = [c for c in comps if not c.ok and not (c.note == "neither has a value")]
    details = {"mode": mode_name(case, train), "grad_outputs": used, "dtype": str(exact.dtype).replace("torch.", ""),
               "comparisons": [c.to_dict() for c in comps], "not_compared": not_compared,
               "reference": case.reference_note}
    if islands.lowest is not None:
        details["low_precision"] = islands.to_dict()
    if bad:
        return _explain_backward(case, train, bad, rel, got, params_o, details, (out_o, out_r), islands)
    summary = (f"gradients of {len(inputs)} input(s) and {len(pairs) - len(inputs)} parameter(s) equal "
               f"{_against(case)}'s")
    if islands.lowest is not None:
        summary += f", {islands.note()}"
    if not_compared:
        summary += f"; not compared (no counterpart): {', '.join(not_compared)}"
    if exact.fallback:
        details["precision"] = exact.to_dict()
        summary += f"; {exact.note()}"
    return CheckResult("backward_parity", Status.PASS, summary, details=details)


def _relative_error(go: Optional[Tensor], gr: Optional[Tensor]) -> float:
    """‖ours − reference‖ / ‖reference‖ (a missing gradient counts as zeros)."""
    if go is None and gr is None:
        return 0.0
    go = torch.zeros_like(gr) if go is None else go.detach().double()
    gr = torch.zeros_like(go) if gr is None else gr.detach().double()
    if go.shape != gr.shape:
        return float("inf")
    diff, norm = float((go - gr).norm()), float(gr.norm())
    return diff / norm if norm > 0 else (float("inf") if diff > 0 else 0.0)


def _explain_backward(case: Case, train: Optional[bool], bad: List[Comparison], rel: Dict[str, float],
                      got: Dict[str, Tuple[Optional[Tensor], Optional[Tensor]]], params: Dict[str, Any],
                      details: Dict[str, Any], outputs: Tuple[Any, Any], islands: Islands) -> CheckResult:
    """Parameters ordered by relative gradient error (worst first), the pattern of the worst one,
    and the hypothesis forward parity would test (transposed weight, gate order)."""
    names = sorted((c.what[5:] for c in bad), key=lambda n: -rel[n])
    param_names = [n for n in names if n in params]
    focus = param_names[0] if param_names else names[0]
    details["mismatched"] = names
    details["relative_error"] = {n: rel[n] for n in names}
    listed = ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")
    worst = next(c for c in bad if c.what == f"grad {focus}")
    summary = (f"gradients differ from {_against(case)}'s for {listed}; worst (relative) grad {focus}: "
               f"‖Δ‖/‖ref‖ = {rel[focus]:.3g}; {worst.describe()}")
    if worst.note:
        summary += f" ({worst.note})"
    if islands.lowest is not None:
        summary += f" ({islands.note()})"
    where = ", ".join(param_names or names)
    hint = _backward_hint(bad, params)
    go, gr = got[focus]
    found = pattern(go, gr, sizes=_layer_sizes(case.module), gates=_gates_of(case, focus), tol=islands.tol)
    lo, lr = dict(float_leaves(outputs[0])), dict(float_leaves(outputs[1]))
    if not param_names and any(p in lr and lo[p].shape == lr[p].shape and mismatch(lo[p], lr[p], *(islands.tol or (1e-7, 1e-7))).any()
                                for p in lo):
        hint = "the forward already differs (see forward_parity): the input gradients differ because of it"
    hypothesis = counterfactual(case, train)
    origin = None if hypothesis or not param_names else first_divergent_submodule(case, train, islands.tol)
    if hypothesis:
        details["hypothesis"] = hypothesis
        summary += f"; {hypothesis['text']}"
        hint = hypothesis["hint"]
        where = ", ".join(dict.fromkeys(hypothesis["where"].split(", ") + param_names))
    elif origin and origin["kind"] == "submodule":
        # a forward divergence explains every gradient upstream of it: name its own parameters first
        details["divergence"] = origin
        inside = [n for n in param_names if n.startswith(origin["where"] + ".")]
        where = ", ".join(inside + [n for n in param_names if n not in inside])
        summary += f"; the forward already diverges in `{origin['where']}`"
        hint = (f"{origin['hint']}; the gradients of everything before it differ only because they flow back "
                "through it")
    elif _forward_pattern(case, outputs, islands.tol) and not hint.startswith("no gradient reaches"):
        path, seen = _forward_pattern(case, outputs, islands.tol)
        details["pattern"] = {**seen.to_dict(), "of": path}
        summary += f"; the forward {path} already differs so: {seen.text}"
        hint = seen.hint
    elif found:
        details["pattern"] = found.to_dict()
        summary += f"; grad {focus}: {found.text}"
        hint = found.hint if not hint.startswith("no gradient reaches") else hint
    else:
        details["tested"] = _TESTED
    return CheckResult("backward_parity", Status.FAIL, summary, where=where, hint=hint, details=details)


def _forward_pattern(case: Case, outputs: Tuple[Any, Any],
                     tol: Optional[Tuple[float, float]] = None) -> Optional[Tuple[str, Pattern]]:
    """The pattern of the first output that already differs in the forward pass (beyond ``tol``), if any."""
    for path, _ in float_leaves(outputs[0]):
        seen = _output_pattern(case, outputs, path, tol)
        if seen is not None:
            return path, seen
    return None


def _gates_of(case: Case, param: str) -> Optional[Tuple[str, ...]]:
    from layerlab.checks.patterns import GATES

    spec = case.param_map.get(param, "")
    leaf = spec.split(".")[-1]
    ref = unwrap(case.reference)
    if not leaf.startswith(("weight_ih", "weight_hh", "bias_ih", "bias_hh")):
        return None
    return GATES.get(type(ref).__name__)


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
    return ("the parameters named receive different gradients (worst first, by relative error) and none of the "
            "patterns layerlab tests for explains it: follow the worst one through the formula")
