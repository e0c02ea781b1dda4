"""DDP's first step when some parameters get no gradient and ``find_unused_parameters=False``.

DDP does not raise on that step. Its reducer averages a step's gradients only once every parameter
it tracks has one; a parameter that never gets one keeps the reduction from finishing, so backward
returns with gradients that were not averaged across ranks (on torch 2.13, gloo: each rank's own),
``optimizer.step()`` moves every rank's copy of the model differently, and only the next forward
raises "Expected to have finished reduction in the prior iteration". Nothing of this is inferred
here: the worker (:func:`~layerlab.distributed.worker.first_step`) runs that step with the user's
setting on a copy of the model and records the gradients after backward and what the next forward
raised; this module compares them, per parameter, with the mean of the ranks' own gradients (what
the all-reduce would have left, names as in :mod:`~layerlab.distributed.compare`):

    G1_r   rank r after DDP's first step with find_unused_parameters=False   (results[r]["first_step"])
    g_r    rank r's own step, before DDP                                      (results[r]["local"])
    ḡ      mean_r g_r

A parameter is *left un-averaged* when G1_r ≠ ḡ on some rank (the comparer's tolerance). One whose
own gradient already equals the mean on every rank cannot show it, and is not listed.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from layerlab.distributed.report import Finding

__all__ = ["first_step_findings", "not_measured", "unaveraged"]

_NEXT = "Expected to have finished reduction in the prior iteration"


def unaveraged(results: List[Dict[str, Any]], cmp: Any) -> Dict[str, Dict[str, float]]:
    """Parameter → ``{"off_mean", "ranks_diff", "own"}`` for those the measured first step left
    un-averaged (``own``: 1.0 when every rank kept exactly its own gradient)."""
    out = {}
    first = [r["first_step"]["grads"] for r in results]
    for name in first[0]:
        local = [r["local"]["grads"].get(name) for r in results]
        got = [f.get(name) for f in first]
        if all(g is None for g in local) or any(g is None for g in got):
            continue
        mean = torch.stack([torch.zeros_like(got[0], dtype=torch.float64) if g is None else g.double()
                            for g in local]).mean(0)
        if all(cmp.close(name, g, mean) for g in got):
            continue
        out[name] = {"off_mean": max(cmp.diff(g, mean) for g in got),
                     "ranks_diff": max(cmp.diff(g, got[0]) for g in got[1:]) if len(got) > 1 else 0.0,
                     "own": float(all(a is not None and torch.equal(a, b) for a, b in zip(local, got)))}
    return out


def first_step_findings(results: List[Dict[str, Any]], cmp: Any) -> List[Finding]:
    """The finding for the measured first step: an error when it left gradients un-averaged, else an
    info (nothing when it was not measured: :func:`not_measured` says why). ``results`` come from ranks
    that all finished."""
    steps = [r.get("first_step") for r in results]
    if not all(s and s["status"] == "measured" for s in steps):
        return []
    left = unaveraged(results, cmp)
    order = list(results[0]["local"]["grads"])
    unused = sorted(steps[0].get("unused") or [], key=lambda n: order.index(n) if n in order else len(order))
    nxt: Optional[str] = steps[0].get("next_forward")
    raised = f"the next forward raised: {_first_sentence(nxt)}" if nxt else "the next forward did not raise here"
    if not left:
        return [Finding(
            "unused", "info", "first step measured",
            f"DDP's first step with find_unused_parameters=False left no gradient measurably different from the "
            f"mean of the ranks' own gradients (each rank's own already equals it); {raised}", where=unused)]
    worst = max(left, key=lambda n: left[n]["off_mean"])
    own = all(v["own"] for v in left.values())
    return [Finding(
        "unused", "error", "gradients not averaged on the first step",
        f"measured in a DDP run with your setting (find_unused_parameters=False): after the first backward "
        f"{', '.join(left)} " + ("still hold each rank's own gradient" if own else "are not averaged across ranks")
        + f" (the ranks differ by up to {max(v['ranks_diff'] for v in left.values()):.3g}, the mean of their "
        f"gradients by up to {left[worst]['off_mean']:.3g}, worst {worst}). That step raises nothing: "
        "optimizer.step() would move each rank's weights differently, so the ranks' models silently diverge; "
        f"{raised}",
        where=list(left),
        cause=f"{', '.join(unused)} never get a gradient, and DDP finishes a step's all-reduce only once every "
              "parameter it tracks has one",
        fix="remove the unused parameters or use them in forward (or freeze them: requires_grad_(False) before "
            "wrapping); or DistributedDataParallel(..., find_unused_parameters=True), which copes at the cost of a "
            "traversal of the autograd graph after every forward; or static_graph=True if the same parameters are "
            "unused on every step")]


def not_measured(results: List[Dict[str, Any]]) -> Optional[str]:
    """Why the first step with the user's setting was not measured (a note: the unused / control-flow
    findings already carry the error), or ``None``."""
    steps = [r.get("first_step") for r in results]
    if not any(steps) or all(s and s["status"] == "measured" for s in steps):
        return None
    skipped = next((s for s in steps if s and s["status"] == "skipped"), None)
    if skipped is not None:
        per_rank = "; ".join(f"rank {r}: {', '.join(u) or 'none'}" for r, u in enumerate(skipped["unused"]))
        msg = (f"the ranks get no gradient for different parameters ({per_rank}), so under find_unused_parameters="
               "False their reducers would launch different all-reduces, which can pair wrongly or wait until the "
               "timeout; layerlab did not run that step, and can't tell whether your first step would hang, raise "
               "or leave gradients un-averaged")
    else:
        errors = sorted({s.get("error") or "no result" for s in steps if s and s["status"] != "measured"})
        msg = f"DDP's first step with find_unused_parameters=False raised ({'; '.join(errors)}); the check below " \
              "ran with find_unused_parameters=True"
    return "first step not measured: " + msg



def _first_sentence(text: str) -> str:
    """torch's message goes on for a paragraph after its first sentence (the fix, which the finding gives)."""
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")
