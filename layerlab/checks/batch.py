"""Check 6: batch independence and batch consistency, in eval mode, float64 (float32 where refused).

*Independence*: ``∂out[i]/∂x[j] = 0`` for every ``j ≠ i`` — sample ``i``'s output must not depend
on another sample. A normalisation over the batch dimension, a ``mean(0)`` or a reshape that mixes
samples breaks it. On failure every submodule's output is tested the same way (in the order they
finish), and the first one that mixes the batch is named.

*Consistency*: running each sample alone gives what the batched run gives for it.

Every output is checked or listed (:mod:`layerlab.checks.batch_outputs`): an output batched
along one dim is checked per sample (gradients for floating inputs, replaced samples for token
ids); a pairwise ``(B, B)`` output (contrastive logits) is checked as pairwise, entry ``(i, j)``
reading sample ``i`` of the inputs on one axis and ``j`` of the others; when the inputs have a batch
but no output does, that is the finding ("the output lost the batch axis"), a FAIL when the output
ignores some samples (``out[-1]`` of a batch-first output), else a warning (a reduction), or a skip
for a loss that reduces by design. The checks run in float64, or float32 with measured tolerances
where a kernel refuses float64 (:mod:`layerlab.checks.exact_dtype`).

Which dim of each input is the batch comes from :mod:`layerlab.checks.layout` (the module's
contract, then the shapes; ``batch_dims`` first). An unbatched call (torch's documented unbatched
forms: ``(S, E)`` attention, ``(C, H, W)`` conv input) has no batch: both checks skip and say so.

Layers that mix the batch by design are skipped with the reason: a ``mixes_batch`` tag, BatchNorm
without running statistics, or (found when the check fails) a reference that mixes it too. The
check runs in eval mode, where BatchNorm uses its running statistics; in train mode it mixes the
batch on purpose.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    Arg, Case, batch_layout, call, cast_args, flatten, float_leaves, generator, grad_inputs, input_tensors, map_args,
    module_copy, rand_like, reference_copy, unbatched_reason,
)
from layerlab.checks.batch_outputs import (
    Axes, batched_leaks, dependence, output_axes, pairwise_verdict, perturbable,
)
from layerlab.checks.compare import compare
from layerlab.checks.exact_dtype import ExactDtype, exact_dtype
from layerlab.checks.mode_notes import train_differences
from layerlab.checks.report import CheckResult, Status

#: how many samples are tested (one backward each)
MAX_SAMPLES = 4


def _by_design(case: Case) -> Optional[str]:
    if "mixes_batch" in case.tags:
        return "the layer mixes the batch by design (tag mixes_batch)"
    for name, m in case.module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats:
            return (f"`{name or type(m).__name__}` is BatchNorm without running statistics: it normalises over "
                    "the batch in eval mode too, by design")
    return None


def _eval_note(case: Case) -> str:
    """Said in the summary, not only in the JSON: a train-mode BatchNorm model passes *in eval mode*."""
    return "".join(f"; {note}" for note in _notes(case))


def _notes(case: Case) -> List[str]:
    """The mode the check ran in, for a layer in train mode that behaves differently there
    (:func:`~layerlab.checks.mode_notes.train_differences`): BatchNorm, hand-written ones too, or dropout."""
    return train_differences(case) if case.module.training else []


def _setup(case: Case, grad: bool):
    dtype = exact_dtype(case).dtype  # float64, or float32 where a kernel refuses float64
    module = module_copy(case.module, dtype, train=False)
    args = cast_args(case.args, dtype, requires_grad=grad)
    B, dims = batch_layout(case, args)
    return module, args, B, dims


def _slice(args: Sequence[Arg], dims: Dict[int, Optional[int]], i: int) -> List[Arg]:
    def cut(t: Tensor) -> Tensor:
        d = dims.get(id(t))
        return t if d is None else t.narrow(d, i, 1)

    return map_args(args, cut)


def _precheck(case: Case, grad: bool, name: str):
    """A SKIP result, or ``(module, args, B, dims, axes)``: the exact-dtype eval copy, its inputs,
    the batch size, each input's batch dim and each output's batch layout (:class:`Axes`)."""
    reason = _by_design(case)
    if reason:
        return CheckResult(name, Status.SKIP, reason), None
    module, args, B, dims = _setup(case, grad)
    unbatched = unbatched_reason(case, args)
    if unbatched:
        return CheckResult(name, Status.SKIP, f"unbatched input: {unbatched}: no batch to check"), None
    if B < 2:
        return CheckResult(name, Status.SKIP, f"batch size {B}: need at least 2 samples to compare"), None
    with torch.no_grad():
        full = call(module, args)  # a raise here is no question of batch dims: the check's verdict says whose it is
    try:
        with torch.no_grad():
            single = call(module, _slice(args, dims, 0))
    except Exception as exc:
        batched = {p: dims.get(id(t)) for p, t in input_tensors(args)}
        return CheckResult(name, Status.SKIP,
                           f"one sample alone does not run ({type(exc).__name__}), though the batch does: are the "
                           f"inputs batched along {batched}? Pass batch_dims={{name: dim or None}} to say",
                           details={"guess": batched}), None
    return None, (module, args, B, dims, output_axes(full, single, B))


def _leaks(module: Any, args: Sequence[Arg], dims: Dict[int, Optional[int]], B: int, out_dims: Dict[str, int],
           seed: int, exact: ExactDtype) -> List[Dict[str, Any]]:
    """Every (output, sample i, input, sample j≠i) whose gradient is not zero."""
    out = call(module, args)
    inputs = [(n, t) for n, t in grad_inputs(args) if dims.get(id(t)) is not None and t.requires_grad]
    gen = generator(seed, 6)
    found = []
    for path, y in float_leaves(out):
        d = out_dims.get(path)
        if d is None or not y.requires_grad:
            continue
        for i in range(min(B, MAX_SAMPLES)):
            yi = y.select(d, i)
            grads = torch.autograd.grad((yi * rand_like(yi, gen)).sum(),
                                        [t for _, t in inputs], allow_unused=True, retain_graph=True)
            for (name, t), g in zip(inputs, grads):
                if g is None:
                    continue
                dn = dims[id(t)]
                own = float(g.select(dn, i).abs().max())
                for j in range(B):
                    if j == i:
                        continue
                    leak = float(g.select(dn, j).abs().max())
                    if exact.exceeds(leak, own):  # more than rounding next to its own sample's gradient
                        found.append({"output": path, "sample": i, "input": name, "other_sample": j,
                                      "max_abs_grad": leak, "own_max_abs_grad": own})
    return found


def batch_independence(case: Case, opts: Any = None) -> CheckResult:
    """∂out[i]/∂x[j] = 0 for j ≠ i (eval mode, float64): gradients for floating inputs, replaced
    samples for token ids and for pairwise (B, B) outputs (:mod:`layerlab.checks.batch_outputs`)."""
    early, ctx = _precheck(case, True, "batch_independence")
    if early:
        return early
    module, args, B, dims, axes = ctx
    exact = exact_dtype(case)
    details: Dict[str, Any] = {"batch_size": B, "mode": "eval", "dtype": _dtype_name(exact), "outputs": axes.to_dict(),
                               "output_batch_dims": dict(axes.batched), "notes": _notes(case)}
    if exact.fallback:
        details["precision"] = exact.to_dict()
    if not axes.batched and not axes.pairwise:
        return _lost_axis(case, module, args, dims, B, axes, exact, details)
    floats = [(n, t) for n, t in grad_inputs(args) if dims.get(id(t)) is not None and t.requires_grad]
    ids = perturbable(module, args, dims, floats=False)
    if not floats and not ids:
        return CheckResult("batch_independence", Status.SKIP,
                           "no batched input to differentiate or replace: batch consistency covers it",
                           details=details)
    leaks = _leaks(module, args, dims, B, axes.batched, case.seed, exact) if floats and axes.batched else []
    details["differentiated"] = [n for n, _ in floats] if axes.batched else []
    details["replaced_ids"] = [p.name for p in ids] if axes.batched else []
    if ids and axes.batched and not leaks:
        found = dependence(module, args, ids, B, list(axes.batched), exact, case.seed)
        leaks = batched_leaks(found, axes.batched)
    pair_leaks: List[Dict[str, Any]] = []
    if axes.pairwise:
        found = dependence(module, args, perturbable(module, args, dims), B, list(axes.pairwise), exact, case.seed)
        details["pairwise"] = {}
        for path, pd in axes.pairwise.items():
            feeds, found_leaks = pairwise_verdict(found, path, pd)
            details["pairwise"][path] = {"dims": list(pd), "input_axis": feeds}
            pair_leaks += found_leaks
    if not leaks and not pair_leaks:
        return CheckResult("batch_independence", Status.PASS, _pass_summary(B, axes, details) + _eval_note(case)
                           + _precision_note(exact), details=details)
    if not leaks:
        return _pairwise_fail(pair_leaks, details)
    details["leaks"] = leaks[:20]
    if isinstance(case.reference, nn.Module) and "max_abs_grad" in leaks[0]:
        ref = reference_copy(case.reference, exact.dtype, False)
        rargs = cast_args(case.args, exact.dtype, requires_grad=True)
        _, rdims = batch_layout(case, rargs)
        try:
            if _leaks(ref, rargs, rdims, B, axes.batched, case.seed, exact):
                return CheckResult("batch_independence", Status.SKIP,
                                   "mixes the batch, and so does the reference: by design", details=details)
        except Exception:
            pass
    first = leaks[0]
    culprit = (_mixing_submodule(case, module, args, dims, B, first["sample"], axes.batched, exact)
               if "max_abs_grad" in first else None)
    details["first_mixing_module"] = culprit
    where = culprit or f"{type(case.module).__name__}.forward"
    size = (f" (max |∂out[{first['sample']}]/∂x[{first['other_sample']}]| = {first['max_abs_grad']:.3g}, must be 0)"
            if "max_abs_grad" in first else f" (replacing sample {first['other_sample']} moves it)")
    return CheckResult(
        "batch_independence", Status.FAIL,
        f"sample {first['sample']}'s {first['output']} depends on sample {first['other_sample']} of "
        f"{first['input']!r}{size}{'; first mixed in `' + culprit + '`' if culprit else ''}",
        where=where,
        hint="something reduces over the batch dimension (a mean/var over dim 0, a norm over the wrong dims, a "
             "reshape that merges batch and features); normalise over the feature dims instead",
        details=details)


def _dtype_name(exact: ExactDtype) -> str:
    return str(exact.dtype).replace("torch.", "")


def _precision_note(exact: ExactDtype) -> str:
    return f"; {exact.note()}" if exact.fallback else ""


def _pass_summary(B: int, axes: Axes, details: Dict[str, Any]) -> str:
    n = min(B, MAX_SAMPLES)
    parts = []
    if details.get("differentiated"):
        parts.append(f"∂output[i]/∂input[j] = 0 for i ≠ j over {n} sample(s) of {B}")
    if details.get("replaced_ids"):
        parts.append(f"replacing sample j of {', '.join(details['replaced_ids'])} leaves output[i ≠ j] unchanged")
    text = "; ".join(parts) or f"over {B} sample(s)"
    for path, info in details.get("pairwise", {}).items():
        sides = {d: [name for name, a in info["input_axis"].items() if a in (d, "both")] for d in info["dims"]}
        row, col = (", ".join(sides[d]) or "nothing" for d in info["dims"])
        text += (f"; {path} is pairwise over the batch (B, B): entry (i, j) reads sample i of {row} and "
                 f"sample j of {col} only")
    if axes.none:
        text += "; not checked (no batch axis): " + ", ".join(f"{p} {why}" for p, why in axes.none.items())
    return text


def _pairwise_fail(leaks: List[Dict[str, Any]], details: Dict[str, Any]) -> CheckResult:
    first = leaks[0]
    details["leaks"] = leaks[:20]
    entry = ", ".join(map(str, first["entry"]))
    info = details["pairwise"][first["output"]]
    return CheckResult(
        "batch_independence", Status.FAIL,
        f"{first['output']} is pairwise over the batch (dims {tuple(info['dims'])}: entry (i, j) may read sample i of "
        f"one input and sample j of the other), but entry [{entry}] changes when sample {first['other_sample']} of "
        f"{first['input']!r} changes: it reads a sample outside its row and column",
        where=first["output"],
        hint="the two towers of a contrastive model must embed each sample alone before the (B, B) similarity: "
             "look for a mean/norm over the batch, or an index of the other tower's batch, before the product",
        details=details)


def _lost_axis(case: Case, module: nn.Module, args: Sequence[Arg], dims: Dict[int, Optional[int]], B: int,
               axes: Axes, exact: ExactDtype, details: Dict[str, Any]) -> CheckResult:
    """No output follows the batch though the inputs do: a reduction by design (a loss), or a finding."""
    reduction = getattr(case.module, "reduction", None)
    if isinstance(case.module, nn.modules.loss._Loss) and reduction in ("mean", "sum", "batchmean"):
        return CheckResult("batch_independence", Status.SKIP,
                           f"the loss reduces over the batch by design (reduction={reduction!r})", details=details)
    shapes = "; ".join(f"{p} {why}" for p, why in axes.none.items()) or "no floating output"
    inputs = perturbable(module, args, dims)
    found = dependence(module, args, inputs, B, list(axes.none), exact, case.seed) if inputs else {}
    reads: Dict[str, List[int]] = {}
    tried: Dict[str, List[int]] = {}
    for (name, k), moved in found.items():
        tried.setdefault(name, []).append(k)
        if any(bool(m.any()) for m in moved.values()):
            reads.setdefault(name, []).append(k)
    details["samples_read"] = reads
    details["samples_tried"] = tried
    ignored = {n: [k for k in ks if k not in reads.get(n, [])] for n, ks in tried.items()}
    partial = {n: ks for n, ks in ignored.items() if ks and reads.get(n)}
    lost = f"the output lost the batch axis: the inputs have {B} samples, but {shapes}"
    if partial:
        name, skipped = next(iter(partial.items()))
        return CheckResult(
            "batch_independence", Status.FAIL,
            f"{lost}; it reads only sample(s) {reads[name]} of {name!r} (changing sample(s) {skipped} leaves it "
            "unchanged)", where="output",
            hint="an index on the batch dim where another dim was meant: out[-1] of a batch-first (B, T, H) output "
                 "is the last *sample*; the last time step is out[:, -1] (or h_n[-1] for the last layer's state)",
            details=details)
    how = ("every sample moves it: it reduces over the batch (a loss or a batch statistic?), so per-sample "
           "independence cannot be checked" if reads else "no sample of any batched input moves it")
    return CheckResult("batch_independence", Status.WARN, f"{lost}; {how}", where="output",
                       hint="return per-sample outputs to check them, or tag the layer mixes_batch if the reduction is "
                            "intended", details=details)


def _mixing_submodule(case: Case, module: nn.Module, args: Sequence[Arg], dims: Dict[int, Optional[int]], B: int,
                      i: int, out_dims: Dict[str, int], exact: ExactDtype) -> Optional[str]:
    """The first submodule (in the order calls finish) whose own output mixes the batch."""
    seen: List[Tuple[str, Tensor]] = []
    names = set()
    handles = []
    for name, m in module.named_modules():
        if not name:
            continue

        def hook(mod, inp, out, _name=name):
            leaves = float_leaves(out)
            if _name not in names and leaves:
                names.add(_name)
                seen.append((_name, leaves[0][1]))

        handles.append(m.register_forward_hook(hook))
    try:
        fresh = cast_args(args, None, requires_grad=True)
        fdims = _same_dims(args, fresh, dims)
        call(module, fresh)
    finally:
        for h in handles:
            h.remove()
    inputs = [t for _, t in grad_inputs(fresh) if fdims.get(id(t)) is not None]
    root_dim = next(iter(out_dims.values()), 0)
    for name, y in seen:
        if not y.requires_grad:
            continue
        cands = [d for d in (root_dim, 0, 1) if d < y.dim() and y.shape[d] == B]
        if not cands:
            continue
        d = cands[0]
        grads = torch.autograd.grad(y.select(d, i).sum(), inputs, allow_unused=True, retain_graph=True)
        for t, g in zip(inputs, grads):
            if g is None:
                continue
            dn = fdims[id(t)]
            own = float(g.select(dn, i).abs().max())
            if any(exact.exceeds(float(g.select(dn, j).abs().max()), own) for j in range(B) if j != i):
                return name
    return None


def _same_dims(old: Sequence[Arg], new: Sequence[Arg], dims: Dict[int, Optional[int]]) -> Dict[int, Optional[int]]:
    out = {}
    for a, b in zip(old, new):
        for (_, t), (_, u) in zip(flatten(a.value), flatten(b.value)):
            out[id(u)] = dims.get(id(t))
    return out


def _one_by_one(module: Any, args: Sequence[Arg], dims: Dict[int, Optional[int]], B: int, axes: Axes,
                exact: ExactDtype) -> List[Any]:
    """One sample alone against its slice of the batch: entry ``i`` of a batched output, entry ``(i, i)``
    of a pairwise one (alone, the sample is its own only pair)."""
    with torch.no_grad():
        leaves = dict(flatten(call(module, args)))
        comps = []
        for i in range(min(B, MAX_SAMPLES)):
            one = dict(flatten(call(module, _slice(args, dims, i))))
            cuts = {p: [d] for p, d in axes.batched.items()}
            cuts.update({p: list(ds) for p, ds in axes.pairwise.items()})
            for path, ds in cuts.items():
                if path in leaves:
                    y = leaves[path]
                    for d in ds:
                        y = y.narrow(d, i, 1)
                    rtol, atol = exact.parity_tol(float(y.abs().max()) if y.numel() else 1.0) or (None, None)
                    comps.append(compare(one.get(path), y, f"sample {i}: {path}", dtype=exact.dtype,
                                         rtol=rtol, atol=atol))
    return comps


def batch_consistency(case: Case, opts: Any = None) -> CheckResult:
    """Each sample run alone equals its slice of the batched run (eval mode, float64)."""
    early, ctx = _precheck(case, False, "batch_consistency")
    if early:
        return early
    module, args, B, dims, axes = ctx
    exact = exact_dtype(case)
    details: Dict[str, Any] = {"batch_size": B, "mode": "eval", "dtype": _dtype_name(exact), "outputs": axes.to_dict(),
                               "notes": _notes(case)}
    if not axes.batched and not axes.pairwise:
        return CheckResult("batch_consistency", Status.SKIP, "no output follows the batch (see batch_independence): "
                           + ("; ".join(f"{p} {why}" for p, why in axes.none.items()) or "no output"), details=details)
    comps = _one_by_one(module, args, dims, B, axes, exact)
    details["comparisons"] = [c.to_dict() for c in comps if not c.ok][:10]
    bad = [c for c in comps if not c.ok]
    if bad and isinstance(case.reference, nn.Module):
        ref = reference_copy(case.reference, exact.dtype, False)
        try:
            if any(not c.ok for c in _one_by_one(ref, args, dims, B, axes, exact)):
                return CheckResult("batch_consistency", Status.SKIP,
                                   "one sample alone differs from the batch, and so it does for the reference: "
                                   "by design", details=details)
        except Exception:
            pass
    if bad:
        return CheckResult("batch_consistency", Status.FAIL,
                           f"running one sample alone differs from the batched run: {bad[0].what}: {bad[0].describe()}"
                           + _precision_note(exact), where=bad[0].what.split(": ", 1)[1],
                           hint="the output depends on the batch size or on the other samples (padding to the "
                                "longest sample, statistics over the batch, a broadcast over the wrong dim)",
                           details=details)
    pairs = f"; pairwise {', '.join(axes.pairwise)} compared at (i, i)" if axes.pairwise else ""
    unchecked = ("; not compared (no batch axis): " + ", ".join(axes.none)) if axes.none else ""
    return CheckResult("batch_consistency", Status.PASS,
                       f"each of {min(B, MAX_SAMPLES)} sample(s) run alone equals the batched run "
                       f"({_dtype_name(exact)})"
                       + pairs + unchecked + _eval_note(case) + _precision_note(exact), details=details)
