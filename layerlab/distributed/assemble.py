"""The ranks' results and the single-process runs → one :class:`~layerlab.distributed.report.DdpReport`.

Findings come in the issue's order: failed ranks (nothing else can be compared then), one rank
only (nothing cross-rank can show), unused parameters and rank-dependent control flow with DDP's first
step under the user's ``find_unused_parameters=False`` (:mod:`~layerlab.distributed.first_step`),
shapes per rank, gradients, buffers. ``raw`` keeps, per
rank, what ``--ranks-json`` prints: norms and sums of its tensors, never the tensors.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from layerlab.distributed import checks
from layerlab.distributed.compare import Comparer, gradient_findings, gradient_rows, tolerance_for
from layerlab.distributed.first_step import first_step_findings, not_measured
from layerlab.distributed.report import DdpReport, Finding, RankRow, TensorInfo

__all__ = ["assemble"]


def assemble(base: DdpReport, module: torch.nn.Module, single: Any, results: List[Dict[str, Any]],
             find_unused: bool) -> DdpReport:
    """Fill ``base`` (its run description) with rows and findings from ``single`` and ``results``."""
    report = base
    report.tolerance = tolerance_for(module)
    report.ranks = [_single_row(single)] + [_rank_row(r) for r in results]
    report.raw = [_raw(r) for r in results]
    failed = checks.failure_findings(results)
    if failed:
        report.findings = failed
        report.notes.append("a rank failed, so gradients, buffers and shapes were not compared")
        return report
    if len(results) == 1:
        report.findings.append(one_rank_finding())
    ran_with = any(r.get("find_unused_parameters") for r in results)
    report.options["find_unused_parameters_run"] = ran_with
    cmp = Comparer(single.full.grads, report.tolerance)
    first = first_step_findings(results, cmp)
    if ran_with and not find_unused:
        report.notes.append("some parameters got no gradient, so the gradients and buffers below come from a DDP step "
                            "run with find_unused_parameters=True (your setting, False, cannot finish that step)"
                            + ("; the first step with your setting is reported above" if first else ""))
    why_not = not_measured(results)
    if why_not:
        report.notes.append(why_not)
    unused = checks.unused_findings(module, results, find_unused, single,
                                    first_step_unaveraged=any(f.severity == "error" for f in first))
    report.findings += unused + first
    report.findings += checks.shape_findings(single, results)
    report.params = gradient_rows(single, results, cmp, {n: list(p.shape) for n, p in module.named_parameters()})
    flow = any(f.title == "rank-dependent control flow" for f in unused)
    report.findings += gradient_findings(module, single, results, report.params, cmp, flow)
    report.buffers = checks.buffer_rows(results)
    report.findings += checks.buffer_findings(module, report.buffers, len(results),
                                              bool(report.options.get("broadcast_buffers", True)))
    return report


def one_rank_finding() -> Finding:
    """One rank has no other process to all-reduce with: DDP's average is its own gradient."""
    return Finding(
        "ranks", "info", "one rank: no cross-rank check",
        "with 1 rank there is no other process: DDP's all-reduce averages this rank's gradient with nothing, so "
        "no bug that needs several ranks can show (rank-dependent control flow, per-rank BatchNorm statistics, a "
        "loss averaged per rank or not per sample, buffers that drift apart); this run only "
        "shows that the model takes a DDP step and matches one process",
        where=["rank 0"], fix="run with --nproc 2 or more (ddp_check(..., nproc=2)) to check the cross-rank behaviour")


def _infos(items: Optional[List[list]]) -> List[TensorInfo]:
    return [TensorInfo(p, d, list(s)) for p, d, s in (items or [])]


def _single_row(single: Any) -> RankRow:
    rec = single.full
    return RankRow(rank=-1, status="ok", inputs=rec.inputs, outputs=rec.outputs, ran=list(rec.ran),
                   unused=[k for k, g in rec.grads.items() if g is None], seconds=single.seconds)


def _rank_row(r: Dict[str, Any]) -> RankRow:
    if r["status"] != "ok":
        return RankRow(rank=r["rank"], status=r["status"], seconds=float(r.get("seconds", 0.0)),
                       error=r.get("error"), frames=list(r.get("frames", [])))
    local, ddp = r["local"], r["ddp"]
    return RankRow(rank=r["rank"], status="ok", inputs=_infos(ddp["inputs"]), outputs=_infos(ddp["outputs"]),
                   ran=list(local["ran"]), unused=[k for k, g in local["grads"].items() if g is None],
                   seconds=float(r["seconds"]))


def _norms(tensors: Dict[str, Optional[torch.Tensor]]) -> Dict[str, Optional[float]]:
    norm = torch.linalg.vector_norm  # summed in float64 without a float64 copy of the tensor
    return {k: None if t is None else float(norm(t, dtype=torch.float64)) for k, t in tensors.items()}


def _raw(r: Dict[str, Any]) -> Dict[str, Any]:
    out = {k: r.get(k) for k in ("rank", "status", "error", "frames", "seconds", "find_unused_parameters", "pid")}
    if r["status"] == "ok":
        for side in ("local", "ddp"):
            rec = r[side]
            out[side] = {"loss": rec["loss"], "grad_norms": _norms(rec["grads"]), "ran": rec["ran"],
                         "inputs": rec["inputs"], "outputs": rec["outputs"],
                         "buffer_sums": {k: float(v.double().sum()) for k, v in rec["buffers"].items()}}
        first = r.get("first_step")
        if first:
            out["first_step"] = {k: v for k, v in first.items() if k != "grads"}
            if "grads" in first:
                out["first_step"]["grad_norms"] = _norms(first["grads"])
    else:
        out["traceback"] = r.get("traceback")
        out["log_tail"] = r.get("log_tail")
    return out

