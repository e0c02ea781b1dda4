"""The checks beside the gradient one: failed ranks, unused parameters, buffers, shapes per rank.

* **failed ranks** — the first cause is blamed, not its echoes: a rank whose own code raised, then
  a rank that hung (it was stopped; the frames say where it was), and only then ranks that raised
  because a peer went missing (a collective timing out, a monitored barrier naming the late rank, a
  connection closed by the peer).
* **unused parameters** — from each rank's own step: a trainable parameter with no gradient on
  every rank makes DDP (find_unused_parameters=False) raise at the next step ("Expected to have
  finished reduction in the prior iteration"), after a first step it silently leaves un-averaged
  (measured in :mod:`~layerlab.distributed.first_step`); one that gets a gradient on some ranks only means
  rank-dependent control flow, where DDP's buckets disagree and the all-reduce errors or hangs.
  Each is named with its module and whether that module's forward ran; when one process on the
  same shard skips the same parameters, the branch follows the data (data-dependent control flow),
  not the rank.
* **buffers** — after the DDP step: which ranks changed each buffer and whether the ranks agree.
* **shapes** — every rank's outputs against one process on the same shard (dtype and shape).
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from torch import nn

from layerlab.distributed.report import BufferRow, Finding

__all__ = ["failure_findings", "unused_findings", "buffer_rows", "buffer_findings", "shape_findings"]

#: what a rank says when it failed only because another rank went missing
_ECHO = ("monitoredbarrier", "timed out", "timeout", "connection closed by peer", "connection reset",
         "broken pipe", "econnreset", "socket", "peer")


def _echo(result: Dict[str, Any]) -> bool:
    return result["status"] == "raised" and any(k in (result.get("error") or "").lower() for k in _ECHO)


def failure_findings(results: List[Dict[str, Any]]) -> List[Finding]:
    failed = [r for r in results if r["status"] != "ok"]
    if not failed:
        return []
    first = ([r for r in failed if r["status"] == "raised" and not _echo(r)]
             or [r for r in failed if r["status"] in ("hung", "killed")] or failed)
    out = []
    for r in first:
        at = f" at {r['frames'][-1]}" if r.get("frames") else ""
        if r["status"] == "hung":
            title, msg = f"rank {r['rank']} hung", (f"rank {r['rank']} never reached the next collective and was "
                                                    f"stopped{at}")
        else:
            title, msg = f"rank {r['rank']} {r['status']}", f"rank {r['rank']} {r['status']}{at}: {r['error']}"
        out.append(Finding("ranks", "error", title, msg, where=[f"rank {r['rank']}", *r.get("frames", [])],
                           cause=None if r["status"] != "hung" else "a rank that stops taking part in collectives "
                           "leaves the others waiting: in training this is a hang",
                           fix="the frames show where; a rank must run the same collectives as the others"))
    echoes = [r for r in failed if r not in first]
    if echoes:
        out.append(Finding("ranks", "info", "other ranks stopped",
                           "; ".join(f"rank {r['rank']}: {r.get('error') or r['status']}" for r in echoes),
                           where=[f"rank {r['rank']}" for r in echoes],
                           cause="they waited on the failed rank until the timeout or were stopped"))
    return out


def unused_findings(module: nn.Module, results: List[Dict[str, Any]], find_unused: bool,
                    single: Any = None, first_step_unaveraged: bool = False) -> List[Finding]:
    """``single.shards[r]``: one process on rank r's shard; when it skips exactly what rank r skips, the
    branch follows the data (a parameter used only on some inputs), not the rank.
    ``first_step_unaveraged``: DDP's first step with the user's setting was measured leaving gradients
    un-averaged (:mod:`~layerlab.distributed.first_step`): the fix says so."""
    world = len(results)
    owners: Dict[str, Dict[str, Any]] = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        unused_on = [r["rank"] for r in results if r["local"]["grads"].get(name) is None]
        if unused_on:
            owner = name.rpartition(".")[0]
            entry = owners.setdefault(owner, {"params": [], "unused_on": set()})
            entry["params"].append(name)
            entry["unused_on"].update(unused_on)
    named = dict(module.named_modules())
    out = []
    for owner, entry in owners.items():
        cls = type(named.get(owner)).__name__
        ran_on = [r["rank"] for r in results if owner in r["local"]["ran"]]
        missing = sorted(entry["unused_on"])
        label = f"{owner or '(root)'} ({cls})"
        if len(missing) == world:
            # a forward that ran without its parameters reaching the loss was cut from the graph on the way
            why, cause, change = (
                ("its forward never ran", "a module built in __init__ but not used in forward",
                 "remove or freeze the module (requires_grad_(False))") if not ran_on else
                (f"its forward ran (ranks {_ranks(ran_on)}) but these parameters never reached the loss",
                 "its output is cut from the graph before the loss (.detach(), torch.no_grad(), .data, .item()) "
                 "or not used by the loss",
                 "remove the detach / no_grad if it should train, or freeze it (requires_grad_(False)) if not"))
            out.append(Finding(
                "unused", "info" if find_unused else "error", "unused parameters",
                f"{', '.join(entry['params'])} of {label} got no gradient on any rank: {why}",
                where=[owner, *entry["params"]], cause=cause,
                fix=("find_unused_parameters=True is set: DDP copes, at the cost of a graph traversal per step"
                     if find_unused else "DDP raises 'Expected to have finished reduction in the prior iteration' at "
                     "the next step" + (", after a first step that silently left the gradients un-averaged (below)"
                                         if first_step_unaveraged else "")
                     + f": {change}, or pass find_unused_parameters=True (a graph traversal per step), or "
                     "static_graph=True when the same parameters are unused every step")))
        elif _follows_data(entry["params"], missing, world, single.shards if single is not None else None):
            used = [r for r in range(world) if r not in missing]
            out.append(Finding(
                "unused", "info" if find_unused else "error", "data-dependent control flow",
                f"{', '.join(entry['params'])} of {label} got gradients on ranks {_ranks(used)} but not on "
                f"ranks {_ranks(missing)}; one process on the same samples skips them too, so the branch follows "
                "the data, not the rank",
                where=[owner, *entry["params"]],
                cause="parameters used only on some inputs (routing, a threshold, an early exit)",
                fix=("find_unused_parameters=True is set: DDP copes, at the cost of a graph traversal per step"
                     if find_unused else "without find_unused_parameters=True DDP waits for gradients these ranks "
                     "never produce (it raises at the next step, or hangs): pass find_unused_parameters=True, or "
                     "make every branch touch its parameters")))
        else:
            used = [r for r in range(world) if r not in missing]
            why = (f"its forward ran on ranks {_ranks(ran_on)} only" if ran_on and len(ran_on) < world else
                   "its forward never ran" if not ran_on else
                   "its forward ran on every rank, but a branch inside it skipped these parameters on some ranks")
            out.append(Finding(
                "unused", "warning" if find_unused else "error", "rank-dependent control flow",
                f"{', '.join(entry['params'])} of {label} got gradients on ranks {_ranks(used)} but not on "
                f"ranks {_ranks(missing)}: {why}",
                where=[owner, *entry["params"]], cause="a branch taken on some ranks only (a condition on the rank "
                "or on data that differs per shard)",
                fix=("DDP averages in zeros for the ranks that skipped it; make the branch the same on every rank"
                     if find_unused else "without find_unused_parameters=True the ranks' gradient buckets disagree "
                     "and the all-reduce errors or hangs: make the branch the same on every rank, or pass "
                     "find_unused_parameters=True")))
    return out


def _follows_data(params: List[str], missing: List[int], world: int, single_shards: Any) -> bool:
    """One process on each rank's shard gets no gradient for ``params`` exactly on the ranks in ``missing``."""
    if not single_shards:
        return False
    return all((single_shards[r].grads.get(p) is None) == (r in missing) for r in range(world) for p in params)


def _ranks(ranks: List[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


def buffer_rows(results: List[Dict[str, Any]]) -> List[BufferRow]:
    """Per buffer that some rank changed or that the ranks hold differently: the ranks' own updates
    (their step before DDP, from the same start) and what is left after the DDP step.

    A buffer no rank changes and every rank holds alike (a rotary ``inv_freq``, a causal mask) has
    nothing to show and no row. Each rank is compared with its own start (every buffer, persistent
    or not), so one that never changes is never counted as changed."""
    rows = []
    for name, b0 in results[0]["local"]["buffers"].items():
        own = [r["local"]["buffers"][name].double() for r in results]
        after = [r["ddp"]["buffers"][name].double() for r in results]
        starts = [r["start_buffers"].get(name) for r in results]
        changed = [r["rank"] for r, v, s in zip(results, own, starts) if s is None or not _same(v, s.double())]
        spread, spread_after = _spread(own), _spread(after)
        if not changed and spread == 0 and spread_after == 0:
            continue
        rows.append(BufferRow(name=name, shape=list(b0.shape), changed_on=changed, ranks_diff=spread,
                              after_diff=spread_after, status="ok" if spread == 0 else "ranks differ"))
    return rows


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN (a buffer holding NaN that nobody touched is unchanged)."""
    return a.shape == b.shape and bool(torch.equal(a, b) or torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def _spread(values: List[torch.Tensor]) -> float:
    return max((float((v - values[0]).abs().max()) for v in values[1:] if v.numel()), default=0.0)


def buffer_findings(module: nn.Module, rows: List[BufferRow], world: int, broadcast: bool) -> List[Finding]:
    named = dict(module.named_modules())
    apart = [r for r in rows if r.status != "ok"]
    norm = [r for r in apart if isinstance(named.get(r.name.rpartition(".")[0]), nn.modules.batchnorm._BatchNorm)]
    other = [r for r in apart if r not in norm]

    def then(rs: List[BufferRow]) -> str:
        if broadcast:
            return ("DDP hands rank 0's value to every rank at the start of each forward (broadcast_buffers=True), "
                    "so the other ranks' updates are thrown away")
        if all(r.after_diff == 0 for r in rs):
            return "after DDP's step they agree"
        return "with broadcast_buffers=False nothing brings them back together: they drift apart every step"

    out = []
    if norm:
        out.append(Finding(
            "buffers", "warning", "BatchNorm running stats differ between ranks",
            f"{', '.join(r.name for r in norm)}: each rank updates them from its own shard (max |Δ| between ranks "
            f"{max(r.ranks_diff for r in norm):.3g}); {then(norm)}",
            where=[r.name for r in norm], cause="BatchNorm without SyncBatchNorm",
            fix="nn.SyncBatchNorm.convert_sync_batchnorm(model) updates them from the whole batch"))
    for r in other:
        some = 0 < len(r.changed_on) < world
        rest = [i for i in range(world) if i not in r.changed_on]
        out.append(Finding(
            "buffers", "error", "buffer updated on some ranks only" if some else "buffer differs between ranks",
            f"{r.name} (max |Δ| between ranks {r.ranks_diff:.3g}): "
            + (f"ranks {_ranks(r.changed_on)} change it in their step, ranks {_ranks(rest)} do not"
               if some else "every rank changes it its own way") + f"; {then([r])}",
            where=[r.name], cause="an update that depends on the rank" if some else "an update from the rank's own shard",
            fix="update buffers the same way on every rank (or all_reduce them); SyncBatchNorm for BatchNorm"))
    return out


def shape_findings(single: Any, results: List[Dict[str, Any]]) -> List[Finding]:
    """Each rank's outputs against one process on its shard. When every rank returns what one shard's
    forward returned (:attr:`~layerlab.distributed.single.SingleRuns.shard_outputs`), no shard needs
    its own run."""
    first = {o.path: (o.dtype, o.shape) for o in single.shard_outputs}
    if first and all({p: (d, s) for p, d, s in r["ddp"]["outputs"]} == first for r in results):
        return []
    out = []
    for res, ref in zip(results, single.shards):
        got = {p: (d, s) for p, d, s in res["ddp"]["outputs"]}
        want = {o.path: (o.dtype, o.shape) for o in ref.outputs}
        if got != want:
            bad = sorted(set(got) ^ set(want) | {p for p in got if p in want and got[p] != want[p]})
            out.append(Finding(
                "shapes", "error", "outputs differ per rank",
                f"rank {res['rank']}'s outputs differ from one process on the same shard: "
                + "; ".join(f"{p}: {_fmt(got.get(p))} vs {_fmt(want.get(p))}" for p in bad),
                where=[f"rank {res['rank']}", *bad], cause="shape or dtype depends on the rank",
                fix="every rank must return the same structure; all_gather of different shapes hangs or fails"))
    return out


def _fmt(spec: Any) -> str:
    return "absent" if spec is None else f"{spec[0]}{list(spec[1])}"
