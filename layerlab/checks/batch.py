"""Check 6: batch independence and batch consistency, in eval mode, float64.

*Independence*: ``∂out[i]/∂x[j] = 0`` for every ``j ≠ i`` — sample ``i``'s output must not depend
on another sample. A normalisation over the batch dimension, a ``mean(0)`` or a reshape that mixes
samples breaks it. On failure every submodule's output is tested the same way (in the order they
finish), and the first one that mixes the batch is named.

*Consistency*: running each sample alone gives what the batched run gives for it.

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
from layerlab.checks.compare import compare
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
    module = module_copy(case.module, torch.float64, train=False)
    args = cast_args(case.args, torch.float64, requires_grad=grad)
    B, dims = batch_layout(case, args)
    return module, args, B, dims


def _slice(args: Sequence[Arg], dims: Dict[int, Optional[int]], i: int) -> List[Arg]:
    def cut(t: Tensor) -> Tensor:
        d = dims.get(id(t))
        return t if d is None else t.narrow(d, i, 1)

    return map_args(args, cut)


def _output_dims(full: Any, single: Any, B: int) -> Dict[str, int]:
    """The batch dim of each output: the dim that is ``B`` in the batched run and 1 in a one-sample run."""
    one = dict(flatten(single))
    out: Dict[str, int] = {}
    for path, y in flatten(full):
        s = one.get(path)
        if s is None or s.dim() != y.dim():
            continue
        for d in range(y.dim()):
            if y.shape[d] == B and s.shape[d] == 1 and all(y.shape[k] == s.shape[k] for k in range(y.dim()) if k != d):
                out[path] = d
                break
    return out


def _precheck(case: Case, grad: bool, name: str):
    """A SKIP result, or ``(module, args, B, dims, out_dims)``: the float64 eval copy, its inputs,
    the batch size, each input's batch dim and each output's (empty when no output has one)."""
    reason = _by_design(case)
    if reason:
        return CheckResult(name, Status.SKIP, reason), None
    module, args, B, dims = _setup(case, grad)
    unbatched = unbatched_reason(case, args)
    if unbatched:
        return CheckResult(name, Status.SKIP, f"unbatched input: {unbatched}: no batch to check"), None
    if B < 2:
        return CheckResult(name, Status.SKIP, f"batch size {B}: need at least 2 samples to compare"), None
    try:
        with torch.no_grad():
            single = call(module, _slice(args, dims, 0))
    except Exception as exc:
        batched = {p: dims.get(id(t)) for p, t in input_tensors(args)}
        return CheckResult(name, Status.SKIP,
                           f"one sample alone does not run ({type(exc).__name__}): are the inputs batched along "
                           f"{batched}? Pass batch_dims={{name: dim or None}} to say", details={"guess": batched}), None
    with torch.no_grad():
        out_dims = _output_dims(call(module, args), single, B)
    return None, (module, args, B, dims, out_dims)


def _leaks_into(grad: float, own: float) -> bool:
    """Is a gradient of ``grad`` on another sample more than rounding, next to ``own`` on its own sample?"""
    return grad > 1e-12 + 1e-9 * own


def _leaks(module: Any, args: Sequence[Arg], dims: Dict[int, Optional[int]], B: int, out_dims: Dict[str, int],
           seed: int) -> List[Dict[str, Any]]:
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
                    if _leaks_into(leak, own):
                        found.append({"output": path, "sample": i, "input": name, "other_sample": j,
                                      "max_abs_grad": leak, "own_max_abs_grad": own})
    return found


def batch_independence(case: Case, opts: Any = None) -> CheckResult:
    """∂out[i]/∂x[j] = 0 for j ≠ i (eval mode, float64)."""
    early, ctx = _precheck(case, True, "batch_independence")
    if early:
        return early
    module, args, B, dims, out_dims = ctx
    details: Dict[str, Any] = {"batch_size": B, "mode": "eval", "dtype": "float64", "output_batch_dims": out_dims,
                               "notes": _notes(case)}
    if not out_dims:
        return CheckResult("batch_independence", Status.SKIP, "no output has a batch dimension", details=details)
    if not any(dims.get(id(t)) is not None and t.requires_grad for _, t in grad_inputs(args)):
        return CheckResult("batch_independence", Status.SKIP,
                           "no floating batched input to differentiate (integer ids?): batch consistency covers it",
                           details=details)
    leaks = _leaks(module, args, dims, B, out_dims, case.seed)
    if not leaks:
        return CheckResult("batch_independence", Status.PASS,
                           f"∂output[i]/∂input[j] = 0 for i ≠ j over {min(B, MAX_SAMPLES)} sample(s) of {B}"
                           + _eval_note(case), details=details)
    details["leaks"] = leaks[:20]
    if isinstance(case.reference, nn.Module):
        ref = reference_copy(case.reference, torch.float64, False)
        rargs = cast_args(case.args, torch.float64, requires_grad=True)
        _, rdims = batch_layout(case, rargs)
        try:
            if _leaks(ref, rargs, rdims, B, out_dims, case.seed):
                return CheckResult("batch_independence", Status.SKIP,
                                   "mixes the batch, and so does the reference: by design", details=details)
        except Exception:
            pass
    first = leaks[0]
    culprit = _mixing_submodule(case, module, args, dims, B, first["sample"], out_dims)
    details["first_mixing_module"] = culprit
    where = culprit or f"{type(case.module).__name__}.forward"
    return CheckResult(
        "batch_independence", Status.FAIL,
        f"sample {first['sample']}'s {first['output']} depends on sample {first['other_sample']} of "
        f"{first['input']!r} (max |∂out[{first['sample']}]/∂x[{first['other_sample']}]| = {first['max_abs_grad']:.3g}, "
        f"must be 0){'; first mixed in `' + culprit + '`' if culprit else ''}",
        where=where,
        hint="something reduces over the batch dimension (a mean/var over dim 0, a norm over the wrong dims, a "
             "reshape that merges batch and features); normalise over the feature dims instead",
        details=details)


def _mixing_submodule(case: Case, module: nn.Module, args: Sequence[Arg], dims: Dict[int, Optional[int]], B: int,
                      i: int, out_dims: Dict[str, int]) -> Optional[str]:
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
            if any(_leaks_into(float(g.select(dn, j).abs().max()), own) for j in range(B) if j != i):
                return name
    return None


def _same_dims(old: Sequence[Arg], new: Sequence[Arg], dims: Dict[int, Optional[int]]) -> Dict[int, Optional[int]]:
    out = {}
    for a, b in zip(old, new):
        for (_, t), (_, u) in zip(flatten(a.value), flatten(b.value)):
            out[id(u)] = dims.get(id(t))
    return out


def _one_by_one(module: Any, args: Sequence[Arg], dims: Dict[int, Optional[int]], B: int,
                out_dims: Dict[str, int]) -> List[Any]:
    with torch.no_grad():
        leaves = dict(flatten(call(module, args)))
        comps = []
        for i in range(min(B, MAX_SAMPLES)):
            one = dict(flatten(call(module, _slice(args, dims, i))))
            for path, d in out_dims.items():
                if path in leaves:
                    comps.append(compare(one.get(path), leaves[path].narrow(d, i, 1), f"sample {i}: {path}",
                                         dtype=torch.float64))
    return comps


def batch_consistency(case: Case, opts: Any = None) -> CheckResult:
    """Each sample run alone equals its slice of the batched run (eval mode, float64)."""
    early, ctx = _precheck(case, False, "batch_consistency")
    if early:
        return early
    module, args, B, dims, out_dims = ctx
    details: Dict[str, Any] = {"batch_size": B, "mode": "eval", "dtype": "float64", "notes": _notes(case)}
    if not out_dims:
        return CheckResult("batch_consistency", Status.SKIP, "no output has a batch dimension", details=details)
    comps = _one_by_one(module, args, dims, B, out_dims)
    details["comparisons"] = [c.to_dict() for c in comps if not c.ok][:10]
    bad = [c for c in comps if not c.ok]
    if bad and isinstance(case.reference, nn.Module):
        ref = reference_copy(case.reference, torch.float64, False)
        try:
            if any(not c.ok for c in _one_by_one(ref, args, dims, B, out_dims)):
                return CheckResult("batch_consistency", Status.SKIP,
                                   "one sample alone differs from the batch, and so it does for the reference: "
                                   "by design", details=details)
        except Exception:
            pass
    if bad:
        return CheckResult("batch_consistency", Status.FAIL,
                           f"running one sample alone differs from the batched run: {bad[0].what}: {bad[0].describe()}",
                           where=bad[0].what.split(": ", 1)[1],
                           hint="the output depends on the batch size or on the other samples (padding to the "
                                "longest sample, statistics over the batch, a broadcast over the wrong dim)",
                           details=details)
    return CheckResult("batch_consistency", Status.PASS,
                       f"each of {min(B, MAX_SAMPLES)} sample(s) run alone equals the batched run (float64)"
                       + _eval_note(case), details=details)
