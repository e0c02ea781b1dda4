"""The gradient check: DDP's all-reduced gradient against one process, and why they differ.

Names used below, per trainable parameter:

    S      the gradient one process gets on the whole batch          (single.full)
    s_r    one process on rank r's shard alone                        (single.shards[r])
    g_r    rank r's own step, before DDP (its process group is live)  (results[r]["local"])
    G_r    rank r after DDP's all-reduce                              (results[r]["ddp"])

A correct step has G_r = G_0 for every r (the all-reduce leaves one value), and G_0 = S within
tolerance. When G_0 ≠ S, the evidence narrows the cause, in this order:

1. g_r ≠ s_r for some rank: the rank computes something else from the same samples than one
   process does, so the code depends on the rank. If g_r = c·s_r for one constant c ≠ 1 the loss
   (or the model) is scaled per rank; if a module ran on some ranks only, it is that control flow.
2. G_0 ≠ mean_r g_r: DDP's result is not the average of what the ranks computed (cause unknown).
3. mean_r s_r ≠ S: each shard is right alone but the samples interact across the batch. If
   mean_r s_r = c·S for one constant c ≠ 1, the loss is not a per-sample mean (a sum: c = 1/world);
   if S = Σ_r c_r·s_r with unequal c_r, each rank's loss is a mean over its own count of items (masked
   tokens) where the whole batch divides by the total; else a module ran on the whole batch but not
   on a shard (a branch on a batch-level quantity), BatchNorm in train mode (per-shard
   statistics), random draws (dropout), else unknown.

Tolerances (|a − b| ≤ atol·scale + rtol·|b|, scale the largest |S| of the parameter, at least 0.1
of the largest over all: float32 rounding follows the size of the terms summed, and a gradient that
cancels to ~0 — a bias before BatchNorm — carries the rounding of its neighbours): float64 rtol 1e-9 atol 1e-10; float32 rtol 1e-4 atol 1e-5; 16-bit 1e-2/1e-3.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import nn

from layerlab.distributed.report import Finding, ParamRow

__all__ = ["tolerance_for", "gradient_rows", "gradient_findings"]

Grads = Dict[str, Optional[torch.Tensor]]

_TOL = {torch.float64: (1e-9, 1e-10), torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-3),
        torch.bfloat16: (1e-2, 1e-3)}


def tolerance_for(module: nn.Module) -> Dict[str, float]:
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    rtol, atol = _TOL.get(dtype, _TOL[torch.float32])
    return {"rtol": rtol, "atol": atol}


class Comparer:
    """``close(name, a, b)`` with the tolerance scaled by parameter (see module docstring)."""

    def __init__(self, reference: Grads, tol: Dict[str, float]) -> None:
        self.tol = tol
        peaks = {k: float(v.abs().max()) if v is not None and v.numel() else 0.0 for k, v in reference.items()}
        top = max(peaks.values(), default=0.0)
        self.scale = {k: max(p, 0.1 * top, 1e-30) for k, p in peaks.items()}

    def diff(self, a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> float:
        return self.measure("", a, b)[0]

    def close(self, name: str, a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
        return self.measure(name, a, b)[1]

    def measure(self, name: str, a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> tuple:
        """``(max |a − b|, whether a is close to b)`` in one pass over the elements.

        In float32 when neither is float64: the difference of two float32 values close enough to
        compare is exact (Sterbenz), and elsewhere rounds by 6e-8 relative, far inside any tolerance;
        a float64 copy of a 124M-parameter model's gradients was most of the comparison's time."""
        if a is None and b is None:
            return 0.0, True
        x, y = _z(a, b), _z(b, a)
        if not x.numel():
            return 0.0, True
        x, y = _common(x, y)
        delta = (x - y).abs()
        allowed = self.tol["atol"] * self.scale.get(name, 1.0) + self.tol["rtol"] * y.abs()
        return float(delta.max()), bool((delta <= allowed).all())


def _common(x: torch.Tensor, y: torch.Tensor) -> tuple:
    dtype = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float32)
    return x.to(dtype), y.to(dtype)


def _z(a: Optional[torch.Tensor], other: Optional[torch.Tensor]) -> torch.Tensor:
    """``a``, or zeros shaped like ``other`` where ``a`` got no gradient (DDP counts it as 0)."""
    return a if a is not None else torch.zeros_like(other)


def _z64(a: Optional[torch.Tensor], other: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`_z` in float64: the fits below sum products over every element."""
    return _z(a, other).double()


def mean_of(grads: List[Grads]) -> Grads:
    out: Grads = {}
    for name in grads[0]:
        present = [g[name] for g in grads if g.get(name) is not None]
        out[name] = None if not present else sum(p.double() for p in present) / len(grads)
    return out


def factor(a: Grads, b: Grads, cmp: Comparer) -> Optional[float]:
    """``c`` with ``a = c·b`` for every parameter (within tolerance), else ``None``."""
    names = [k for k in b if b[k] is not None or a.get(k) is not None]
    num = sum(float((_z64(a[k], b[k]) * _z64(b[k], a[k])).sum()) for k in names)
    den = sum(float((_z64(b[k], a[k]) ** 2).sum()) for k in names)
    if den == 0:
        return None
    c = num / den
    scaled = {k: None if b[k] is None else b[k].double() * c for k in names}
    return c if all(cmp.close(k, a[k], scaled[k]) for k in names) else None


def rank_weights(S: Grads, shards: List[Grads], cmp: Comparer) -> Optional[List[float]]:
    """``c`` with ``S = Σ_r c_r·s_r`` for every parameter (least squares, then within tolerance), else
    ``None``. Only claimed with many more gradient elements than ranks, so that a fit cannot be exact
    by having as many unknowns as equations."""
    names = [k for k in S if S[k] is not None]
    if not names:
        return None
    vecs = [torch.cat([_z64(s.get(k), S[k]).reshape(-1) for k in names]) for s in shards]
    target = torch.cat([S[k].double().reshape(-1) for k in names])
    if target.numel() < 8 * len(shards):
        return None
    basis = torch.stack(vecs, dim=1)
    c = torch.linalg.lstsq(basis, target.unsqueeze(1)).solution.squeeze(1)
    fit = {k: sum(float(c[r]) * _z64(shards[r].get(k), S[k]) for r in range(len(shards))) for k in names}
    return [float(v) for v in c] if all(cmp.close(k, fit[k], S[k]) for k in names) else None


def gradient_rows(single: Any, results: List[Dict[str, Any]], cmp: Comparer,
                  shapes: Optional[Dict[str, List[int]]] = None) -> List[ParamRow]:
    """One row per parameter; ``shapes`` (name → the parameter's shape) gives the shape of a parameter
    that got no gradient anywhere (an unused one), which no gradient can tell."""
    S = single.full.grads
    shapes = shapes or {}
    rows = []
    G = [r["ddp"]["grads"] for r in results]
    for name, s in S.items():
        unused_on = [r["rank"] for r in results if r["local"]["grads"].get(name) is None]
        g0 = G[0].get(name)
        between = [cmp.measure(name, g.get(name), g0) for g in G[1:]]
        single_diff, single_close = cmp.measure(name, g0, s)
        shape = shapes.get(name) or list((s if s is not None else g0 if g0 is not None else torch.empty(0)).shape)
        row = ParamRow(name=name, shape=shape,
                       unused_on=unused_on, ranks_diff=max((d for d, _ in between), default=0.0),
                       single_diff=single_diff,
                       single_scale=(float(s.abs().max()) if s.numel() else 0.0) if s is not None else None)
        if not all(ok for _, ok in between):
            row.status = "ranks differ"
        elif not single_close:
            row.status = "differs from single"
        elif s is None and g0 is None:
            row.status = "unused"
        rows.append(row)
    return rows


def gradient_findings(module: nn.Module, single: Any, results: List[Dict[str, Any]], rows: List[ParamRow],
                      cmp: Comparer, rank_dependent_flow: bool) -> List[Finding]:
    """The gradient findings: ranks that disagree after the all-reduce, and a DDP step that misses
    the single-process one, with its most likely cause (module docstring)."""
    out: List[Finding] = []
    world = len(results)
    apart = [r.name for r in rows if r.status == "ranks differ"]
    if apart:
        out.append(Finding(
            "gradients", "error", "gradients differ between ranks",
            f"after DDP's all-reduce, {_names(apart)} still differ between ranks (max "
            f"{max(r.ranks_diff or 0 for r in rows):.3g}): the ranks' models drift apart from this step on",
            where=apart, cause="a gradient changed after the all-reduce (a hook, a manual .grad edit) or a parameter "
            "DDP does not manage (created in forward, or in _ddp_params_and_buffers_to_ignore)",
            fix="change gradients before DDP reduces them (register_comm_hook), and register every parameter in __init__"))
    off = [r for r in rows if r.status == "differs from single"]
    if not off:
        return out
    where = [r.name for r in off]
    worst = max(off, key=lambda r: (r.single_diff or 0) / max(r.single_scale or 0, 1e-30))
    size = (f"where |grad| ≤ {worst.single_scale:.3g}" if single.full.grads.get(worst.name) is not None
            else "where one process gives it no gradient")
    seen = (f"DDP's gradient differs from one process on the whole batch for {_names(where)} (worst "
            f"{worst.name}: max |Δ| {worst.single_diff:.3g} {size})")
    S = single.full.grads
    # 1. a rank computes something else than one process on the same samples
    local = [r["local"]["grads"] for r in results]
    odd = [r for r in range(world) if not all(cmp.close(k, local[r][k], single.shards[r].grads[k]) for k in S)]
    if odd:
        factors = {r: factor(local[r], single.shards[r].grads, cmp) for r in odd}
        if all(c is not None for c in factors.values()):
            said = ", ".join(f"rank {r}: ×{c:.4g}" for r, c in factors.items())
            out.append(Finding(
                "gradients", "error", "loss scaled per rank",
                f"{seen}. Each rank's own gradient is a constant multiple of what one process gets on the same "
                f"samples ({said}), so the loss or the model is scaled by something that depends on the rank",
                where=[f"rank {r}" for r in odd], cause="a factor that depends on the rank (dist.get_rank(), a "
                "per-rank sample count) multiplies the loss",
                fix="scale the loss the same way on every rank (a mean over the rank's samples); DDP already "
                    "averages over ranks"))
        else:
            out.append(Finding(
                "gradients", "error", "rank-dependent computation",
                f"{seen}. Rank(s) {', '.join(map(str, odd))} compute other gradients from their samples than one "
                "process does on the same samples" + (", and modules ran on some ranks only (see rank-dependent "
                                                      "control flow)" if rank_dependent_flow else ""),
                where=[f"rank {r}" for r in odd],
                cause="control flow that depends on the rank" if rank_dependent_flow else
                "the model or the loss depends on the rank (dist.get_rank(), a per-rank seed or state); "
                "layerlab cannot tell where",
                fix="make every rank run the same code on its samples; keep rank checks to logging and saving"))
        return out
    # 2. DDP's result is not the average of the ranks' own gradients
    avg = mean_of(local)
    if not all(cmp.close(k, results[0]["ddp"]["grads"].get(k), avg[k]) for k in S):
        out.append(Finding("gradients", "error", "DDP gradient is not the ranks' average",
                           f"{seen}. Every rank's own gradient matches one process on its shard, but DDP's all-reduced "
                           "gradient is not their average; layerlab cannot tell why", where=where,
                           fix="look for gradient hooks, comm hooks or no_sync() around the step"))
        return out
    # 3. right on each shard alone, wrong together: the samples interact across the batch
    shard_avg = mean_of([s.grads for s in single.shards])
    c = factor(shard_avg, S, cmp)
    if c is not None:
        out.append(Finding(
            "gradients", "error", "loss not a per-sample mean",
            f"{seen}: it is {c:.4g} × the single-process gradient on every parameter"
            + (f" (1/{world}: the world size)" if abs(c * world - 1) < 1e-3 else
               f" ({world}: the world size)" if abs(c - world) < 1e-3 * world else ""),
            where=where, cause="the loss sums over the rank's samples (or divides by a fixed count): DDP averages "
            "gradients over ranks, so a per-rank sum loses a factor of the world size against one process",
            fix="average the loss over the rank's samples (reduction='mean'), or multiply it by the world size "
                "if you want the sum"))
        return out
    weights = rank_weights(S, [s.grads for s in single.shards], cmp)
    if weights is not None:
        said = ", ".join(f"{w:.3g}" for w in weights)
        out.append(Finding(
            "gradients", "error", "loss averaged per rank over unequal counts",
            f"{seen}. The whole batch's gradient is Σ c_r × shard r's gradient with c = ({said}), but DDP gives "
            f"every rank 1/{world}: each rank's loss divides by its own count of items, and the counts differ",
            where=where, cause="a per-rank mean over a count that differs per rank (masked or padded tokens, "
            "ignore_index, a per-rank number of valid samples): the mean of the ranks' means is not the global mean",
            fix="divide by the global count: all_reduce the number of items, then loss = sum / global_count × "
                "world_size (DDP divides by the world size again)"))
        return out
    causes = []
    branch = _batch_decided_branch(single)
    if branch:
        causes.append(Finding(
            "gradients", "error", "control flow decided by the whole batch",
            f"{seen}. Each shard alone matches one process, but {_names(branch)} ran in one process on the whole "
            "batch and not on every shard (or the reverse): a condition computed over the batch picks the branch, "
            "so the ranks take other branches than one process does", where=branch,
            cause="a branch on a batch-level quantity (x.mean() > 0, a batch statistic, the batch size)",
            fix="decide per sample (torch.where, masking) or all_reduce the quantity so every rank decides alike"))
    norms = _batchnorms_in_train(module)
    if norms:
        causes.append(Finding(
            "gradients", "warning", "BatchNorm without SyncBatchNorm",
            f"{seen}. Each shard alone matches one process, but BatchNorm {_names(norms)} normalises each rank's shard with "
            "its own mean and variance while one process uses the whole batch's", where=norms,
            cause="batch statistics differ per shard",
            fix="nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP (CUDA/NCCL) for whole-batch statistics; "
                "or keep per-rank statistics knowingly (common with large per-GPU batches)"))
    dropouts = _dropouts_in_train(module)
    if single.stochastic or dropouts:  # the seed probe can miss a draw that the structure shows
        if dropouts:  # name what draws; anything else (torch.randn in a forward) is only "random numbers"
            cause = f"dropout in train mode ({_names(dropouts)})"  # stochastic depth included: named by path
            fix = "check in eval mode (--mode eval) or with dropout p=0; in training seed ranks so masks differ"
        else:
            cause = "random numbers drawn in the forward (torch.randn, rand, bernoulli, … — no nn.Dropout here)"
            fix = ("check with the random draw switched off (eval mode, or a flag); in training seed ranks so their "
                   "draws differ")
        causes.append(Finding(
            "gradients", "warning", "random draws in the step",
            f"{seen}. The step draws random numbers"
            + (" (two seeds give two gradients)" if single.stochastic else "") + ": one process on the whole batch "
            "and the ranks on their shards draw different numbers, so their gradients cannot be compared",
            where=where, cause=cause, fix=fix))
    if causes:
        return out + causes
    out.append(Finding(
        "gradients", "error", "samples interact across the batch",
        f"{seen}. Each shard alone matches one process, but their average misses the whole batch's gradient: "
        "something couples the samples (in-batch statistics, a loss normalised by a batch-level quantity); "
        "layerlab cannot tell which", where=where,
        fix="make the loss a mean over samples and normalisations per sample, or synchronise the batch-level "
            "quantity across ranks (all_reduce)"))
    return out


def _batch_decided_branch(single: Any) -> List[str]:
    """Modules whose forward ran on the whole batch but not on some shard, or on a shard but not on
    the whole batch (one process each time: no rank involved)."""
    full = set(single.full.ran)
    odd = set()
    for shard in single.shards:
        odd |= full ^ set(shard.ran)
    return sorted(odd)


def _dropouts_in_train(module: nn.Module) -> List[str]:
    """Layers that draw masks here (train mode): the nn.Dropout family with p > 0, and a module holding a
    float rate > 0 named like a drop (stochastic depth: Hugging Face's ``BeitDropPath.drop_prob``, timm's
    ``DropPath``; ``layerdrop``; a rate passed to ``F.dropout``). The seed probe alone can miss them: on
    a one-sample shard BEiT's drop path keeps every path at both seeds about 4 times in 10."""
    found = []
    for name, m in module.named_modules():
        if isinstance(m, (nn.modules.dropout._DropoutNd, nn.AlphaDropout)):
            draws = m.training and m.p > 0
        else:
            draws = m.training and any("drop" in k and isinstance(v, float) and v > 0 for k, v in vars(m).items())
        if draws:
            found.append(name or type(m).__name__)
    return found


def _batchnorms_in_train(module: nn.Module) -> List[str]:
    """BatchNorm layers that use batch statistics here (train mode, or no running stats), not synced."""
    found = []
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm):
            if m.training or m.running_mean is None:
                found.append(name or type(m).__name__)
    return found


def _names(names: List[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
