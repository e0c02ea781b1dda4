"""Where a call's input tensors came from, so "the same inputs in A and B" is not judged on
statistics alone.

A report keeps five statistics of each tensor (mean, std, min, max, fraction of zeros), not its
values. A reordering (a ``transpose`` of a square tensor, a ``flip``, a permutation of channels)
keeps all five, so a call whose input was reordered by its parent's code looks like a call with the
same input and different outputs — and would be named, wrongly, as where the forward starts to
differ. What the report does keep is each tensor's provenance: the call whose output it is
(``source``), or, for a tensor made by plain torch code, the first call that received it (its
``slot`` first seen as an input), whose parent's forward made it. Provenance decides how far equal statistics can be trusted:

* the input is a module call's output (the same call, by path and call number, in A and B) or a
  model input: equal statistics stand for equal tensors — a change to that tensor would have shown
  at the call that made it;
* the input was made by code (the parent's forward, between module calls), in A and in B: equal
  statistics are only a hint, since that code may reorder. The call is trusted as the origin only
  if it changed itself (its class, its parameter count or a parameter's value); otherwise the
  difference may come from the code that made its input, and the enclosing call is named instead;
* the input is the output of a parameter-free call that keeps its input's statistics (Identity,
  Flatten, a permute, ``ChannelShuffle``, dropout in eval mode): that call may reorder, and another
  reorder would look the same; it is treated as made by code;
* A's input and B's come from different places: nothing says they are the same.

This module never imports torch.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from layerlab.report_diff.collect import Collector

MODEL_INPUT = "model input"
OUTPUT_OF = "output of"
MADE_BY_CODE = "made by code"


class Provenance:
    """Provenance of the input tensors of one report's calls (see the module docstring)."""

    def __init__(self, calls: List[dict], quiet: Collector) -> None:
        self._by_index: Dict[int, dict] = {c["index"]: c for c in calls}
        self._quiet = quiet
        self._first_seen: Dict[int, dict] = {}
        for c in sorted(calls, key=lambda c: c["index"]):  # index order is the order calls started
            for t in c.get("inputs") or []:
                slot = t.get("slot")
                if slot is not None and t.get("source") is None and slot not in self._first_seen:
                    self._first_seen[slot] = c

    def of(self, t: Optional[dict]) -> Tuple[Any, ...]:
        """``(kind, (path, call))`` of one input tensor; ``("value",)`` for a non-tensor argument."""
        if t is None:
            return ("absent",)
        if t.get("shape") is None:
            return ("value",)
        source = self._by_index.get(t.get("source")) if t.get("source") is not None else None
        if source is not None:
            return (OUTPUT_OF, (source["path"], source["call"]))
        first = self._first_seen.get(t.get("slot"))
        if first is None or first.get("parent") is None:  # first seen by the root: the model's input
            return (MODEL_INPUT,)
        parent = self._by_index.get(first.get("parent"), {})
        return (MADE_BY_CODE, (parent.get("path", ""), parent.get("call", 1)))


    def reorders(self, t: Optional[dict]) -> bool:
        """Whether ``t`` is the output of a parameter-free call whose output keeps its first input's
        statistics (Identity, Flatten, a permute, a channel shuffle, dropout in eval mode …): equal
        statistics there cannot tell a changed reorder from an unchanged one."""
        call = self._by_index.get(t.get("source")) if t and t.get("source") is not None else None
        if call is None or call.get("params") or not call.get("inputs") or not call.get("outputs"):
            return False
        sa, sb = call["inputs"][0].get("stats") or {}, call["outputs"][0].get("stats") or {}
        if not sa or not sb:
            return False
        return not any(self._quiet.number("calls", "", key, sa.get(key), sb.get(key))
                       for key in ("mean", "std", "min", "max", "zeros"))


def inputs_trusted(prov_a: Provenance, prov_b: Provenance, inputs: List[Tuple[str, Optional[dict], Optional[dict]]],
                   ca: dict, cb: dict, params: Tuple[List[dict], List[dict]], quiet: Collector) -> Tuple[bool, str]:
    """Whether the inputs of call ``ca`` (A) and ``cb`` (B), paired by name in ``inputs`` and equal in
    their statistics, may be taken as the same tensors; with the reason when not."""
    weak = ""
    for name, ta, tb in inputs:
        pa, pb = prov_a.of(ta), prov_b.of(tb)
        if pa != pb:
            return False, (f"its input `{name or '?'}` comes from {_where(pa)} in A but from {_where(pb)} "
                           "in B (equal statistics do not make them the same tensor)")
        if pa[0] == MADE_BY_CODE:
            weak = weak or f"its input `{name or '?'}` was made by {_where(pa)}"
        elif pa[0] == OUTPUT_OF and (prov_a.reorders(ta) or prov_b.reorders(tb)):
            weak = weak or (f"its input `{name or '?'}` is {_where(pa)}, which has no parameters and keeps its "
                            "input's statistics (it may only reorder or reshape it)")
    if not weak or _changed_itself(ca, cb, params, quiet):
        return True, ""
    return False, (f"{weak}; such an input matches A's only in its statistics (a transpose, flip or shuffle "
                   "keeps them), and nothing in the module itself changed")


def _changed_itself(ca: dict, cb: dict, params: Tuple[List[dict], List[dict]], quiet: Collector) -> bool:
    """The call's class, parameter count, or the shape, dtype or norm of one of its parameters differ."""
    if ca.get("class_name") != cb.get("class_name") or ca.get("params") != cb.get("params"):
        return True
    prefix = ca["path"] + "." if ca["path"] else ""
    mine_a = {p["name"]: p for p in params[0] if p.get("name", "").startswith(prefix)}
    mine_b = {p["name"]: p for p in params[1] if p.get("name", "").startswith(prefix)}
    if set(mine_a) != set(mine_b):
        return True
    for name, pa in mine_a.items():
        pb = mine_b[name]
        if pa.get("shape") != pb.get("shape") or pa.get("dtype") != pb.get("dtype"):
            return True
        if quiet.number("params", name, "norm", pa.get("norm"), pb.get("norm")):
            return True
    return False


def _where(prov: Tuple[Any, ...]) -> str:
    if prov[0] == OUTPUT_OF:
        path, call = prov[1]
        return f"the output of {path or '(root)'}" + (f" (call {call})" if call != 1 else "")
    if prov[0] == MADE_BY_CODE:
        path, call = prov[1]
        return f"plain torch code in the forward of {path or '(root)'}" + (f" (call {call})" if call != 1 else "")
    return {"absent": "nowhere (absent)", "value": "a plain value", MODEL_INPUT: "the model's input"}[prov[0]]
