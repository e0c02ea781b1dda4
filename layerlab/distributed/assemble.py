"""The ranks' results and the single-process runs → one :class:`~layerlab.distributed.report.DdpReport`.

Findings come in the issue's order: failed ranks (nothing else can be compared then), unused
parameters and rank-dependent control flow, shapes per rank, gradients, buffers. ``raw`` keeps, per
rank, what ``--ranks-json`` prints: norms and sums of its tensors, never the tensors.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from layerlab.distributed import checks
from layerlab.distributed.compare import Comparer, gradient_findings, gradient_rows, tolerance_for
from layerlab.distributed.report import DdpReport, RankRow, TensorInfo

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
    ran_with = any(r.get("find_unused_parameters") for r in results)
    report.options["find_unused_parameters_run"] = ran_with
    if ran_with and not find_unused:
        report.notes.append("some parameters got no gradient, so the DDP step ran with find_unused_parameters=True "
                            "to finish the check (your setting, False, would raise or hang)")
    unused = checks.unused_findings(module, results, find_unused, single.shards)
    report.findings += unused
    report.findings += checks.shape_findings(single.shards, results)
    cmp = Comparer(single.full.grads, report.tolerance)
    report.params = gradient_rows(single, results, cmp)
    flow = any(f.title == "rank-dependent control flow" for f in unused)
    report.findings += gradient_findings(module, single, results, report.params, cmp, flow)
    report.buffers = checks.buffer_rows(results)
    report.findings += checks.buffer_findings(module, report.buffers, len(results),
                                              bool(report.options.get("broadcast_buffers", True)))
    return report


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
    return {k: None if t is None else float(t.double().norm()) for k, t in tensors.items()}


def _raw(r: Dict[str, Any]) -> Dict[str, Any]:
    out = {k: r.get(k) for k in ("rank", "status", "error", "frames", "seconds", "find_unused_parameters", "pid")}
    if r["status"] == "ok":
        for side in ("local", "ddp"):
            rec = r[side]
            out[side] = {"loss": rec["loss"], "grad_norms": _norms(rec["grads"]), "ran": rec["ran"],
                         "inputs": rec["inputs"], "outputs": rec["outputs"],
                         "buffer_sums": {k: float(v.double().sum()) for k, v in rec["buffers"].items()}}
    else:
        out["traceback"] = r.get("traceback")
        out["log_tail"] = r.get("log_tail")
    return out

