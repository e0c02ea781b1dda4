"""Where the gradient stops: one finding for a chain of exactly-zero gradients, not one per module.

When one module's input gets exactly zero gradient while its output gets a non-zero one, every
parameter upstream of it gets exactly zero too, and the per-parameter view shows a flood of
"zero-grad" warnings whose single cause is never named (torchvision's ViT-B/16 zero-initialises
its head ``heads.head``: 150 of them). This module finds that root, the *sink*:

    sink      a finished call whose output gradient is non-zero and whose every input that
              requires grad got a gradient of exactly zero
    root      the innermost sink (a container holding the sink is one too) that finished last,
              i.e. the most downstream place where the gradient becomes zero

and explains it where the recorded values allow:

* a module whose ``weight`` is all zero (a zero-initialised head): a Linear's ``∂L/∂x = ∂L/∂y · W = 0``
  (a conv's or a norm's input gradient is likewise a multiple of its weight).
  If the weight's own gradient is non-zero the first optimiser step moves it and the gradient
  flows from then on, so this is a note (expected at init), not a warning;
* a ReLU-like module whose every input is ≤ 0: all its units are dead (a warning);
* anything else: what is seen, and that layerlab can't tell why (a warning).

The "zero-grad" warnings of parameters upstream of the root are folded into that one finding
(``data["folded"]``); their ``flags`` keep saying ``zero-grad``.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import torch
from torch import nn

from layerlab.errors import Problem
from layerlab.probe.report import CallRecord, ParamRecord

_RELU_LIKE = (nn.ReLU, nn.ReLU6, nn.Hardtanh)


def _is_sink(call: CallRecord) -> bool:
    if call.end is None:
        return False
    outs = [o.grad.norm for o in call.tensor_outputs if o.grad is not None and o.grad.finite]
    ins = [i for i in call.tensor_inputs if i.requires_grad]
    return (any(g > 0 for g in outs) and bool(ins)
            and all(i.grad is not None and i.grad.norm == 0 for i in ins))


def innermost_sinks(calls: List[CallRecord]) -> List[CallRecord]:
    """The sinks that hold no other sink (a container holding one is a sink too), in call order."""
    sinks = [c for c in calls if _is_sink(c)]
    holds_sink: Set[int] = set()
    for sink in sinks:
        parent = sink.parent
        while parent is not None and parent not in holds_sink:
            holds_sink.add(parent)
            parent = calls[parent].parent
    return [c for c in sinks if c.index not in holds_sink]


def find_root(calls: List[CallRecord]) -> Optional[CallRecord]:
    """The most downstream innermost sink (see the module docstring), or ``None``."""
    innermost = innermost_sinks(calls)
    return max(innermost, key=lambda c: c.end) if innermost else None


def _subtree_end(calls: List[CallRecord], root: CallRecord) -> int:
    """The largest call index inside ``root``'s call (its descendants start after it, in order)."""
    last = root.index
    inside = {root.index}
    for call in calls[root.index + 1:]:
        if call.parent in inside:
            inside.add(call.index)
            last = call.index
        else:
            break
    return last


def _calls_of(path: str, started: Dict[str, List[int]]) -> List[int]:
    """The calls of the module at ``path``, or of its nearest ancestor that ran (MultiheadAttention
    uses ``out_proj``'s parameters without calling it)."""
    while True:
        if path in started:
            return started[path]
        if not path:
            return []
        path = path.rpartition(".")[0]


def _fed_zeros_by(call: CallRecord, first: int, last: int) -> bool:
    """Whether the call's first input is all zero and made inside calls ``first..last``."""
    ins = call.tensor_inputs[:1]
    return (bool(ins) and ins[0].stats is not None and ins[0].stats.zeros == 1.0
            and ins[0].source is not None and first <= ins[0].source <= last)


def _zero_weight(module: nn.Module) -> Optional[str]:
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.numel() and not bool(torch.any(weight.detach())):
        return "weight"
    return None


def fold_zero_grads(problems: List[Problem], params: List[ParamRecord], calls: List[CallRecord],
                    modules: List[nn.Module]) -> Tuple[List[Problem], List[Problem]]:
    """Replace the "zero-grad" warnings caused by a sink with one finding per sink.

    A zero-gradient parameter is put down to the first sink that starts after its module's last
    call (a residual net with zero-initialised branches has one sink per branch, and the skip
    connections still carry gradient around each: blaming every parameter on the last sink would
    be wrong). Returns ``(problems, notes)``: ``problems`` without the folded warnings and with
    the findings that are warnings; ``notes`` with the expected ones (a zero-initialised weight
    whose own gradient is non-zero).
    """
    sinks = sorted(innermost_sinks(calls), key=lambda c: c.index)
    if not sinks:
        return problems, []
    started: Dict[str, List[int]] = {}
    for call in calls:
        started.setdefault(call.path, []).append(call.index)
    zero = {p.name for p in params if "zero-grad" in p.flags}
    lasts = {sink.index: _subtree_end(calls, sink) for sink in sinks}
    folded: Dict[int, List[str]] = {}
    fed: Dict[int, List[str]] = {}
    for p in problems:
        if p.code != "zero-grad" or p.where not in zero:
            continue
        ran = _calls_of(p.where.rpartition(".")[0], started)
        if not ran:
            continue
        after = [sink for sink in sinks if sink.index > max(ran)]
        if after:
            folded.setdefault(after[0].index, []).append(p.where)
            continue
        feeding = [sink for sink in sinks if all(_fed_zeros_by(calls[i], sink.index, lasts[sink.index]) for i in ran)]
        if feeding:
            fed.setdefault(feeding[-1].index, []).append(p.where)
    if not folded:
        return problems, []
    gone: Set[str] = set()
    warnings, notes = [], []
    for sink in sinks:
        if sink.index not in folded:
            continue
        finding = _finding(sink, modules[sink.index], params, calls, lasts[sink.index], folded[sink.index])
        gone.update(folded[sink.index])
        down = fed.get(sink.index, [])
        if down:
            finding.message += (f"; downstream, {', '.join(down)} get{'s' * (len(down) == 1)} zero gradient too: "
                                f"{'its' if len(down) == 1 else 'their'} input, the output of {sink.label}, is all zero")
            finding.data["folded_downstream"] = down
            gone.update(down)
        (notes if finding.severity == "info" else warnings).append(finding)
    kept = [p for p in problems if not (p.code == "zero-grad" and p.where in gone)]
    return kept + warnings, notes


def _finding(root: CallRecord, module: nn.Module, params: List[ParamRecord], calls: List[CallRecord],
             last: int, folded: List[str]) -> Problem:
    name = f"{root.label} ({root.class_name})"
    out = max(o.grad.norm for o in root.tensor_outputs if o.grad is not None and o.grad.finite)
    listed = ", ".join(folded[:6]) + (f" … ({len(folded)} in all)" if len(folded) > 6 else "")
    n = len(folded)
    upstream = (f"{n} parameter{'s' * (n != 1)} called before it get{'s' * (n == 1)} exactly zero gradient: "
                f"{listed}")
    data = {"call": root.index, "folded": folded, "output_grad_norm": out}
    weight = _zero_weight(module)
    if weight is not None:
        full = f"{root.path}.{weight}" if root.path else weight
        own = next((p for p in params if p.name == full), None)
        downstream = any(c.index > last and c.trainable and c.index not in _ancestors(calls, root)
                         for c in calls)
        what = "zero-initialised" + ("" if downstream else " head")
        bypass = _bypassed(root, params, calls)
        opening = (f"the gradient stops at {root.label}" if bypass
                   else f"everything upstream of {root.label} gets zero gradient")  # measured: nothing bypasses it
        message = (f"{opening} because {full} is all zero ({what}): its input reaches its output only "
                   f"through that weight, so the gradient w.r.t. its input is exactly 0; {upstream}{bypass}")
        moves = own is not None and own.trainable and own.grad_norm is not None and own.grad_norm > 0
        if moves:
            message += (f". {full}'s own gradient is non-zero (‖grad‖ = {own.grad_norm:.3g}), so the first "
                        "optimiser step makes it non-zero and gradient flows upstream from then on: "
                        "expected at init")
            return Problem("zero-grad-root", message, where=root.path or "(root)", severity="info", data=data)
        message += (f". {full} gets no gradient itself, so it stays zero and what feeds the loss only through "
                    f"{root.label} will never train")
        return Problem("zero-grad-root", message, where=root.path or "(root)", data=data,
                       hint=f"initialise {full} (or unfreeze it)")
    message = (f"the gradient stops at {name}: ‖∂L/∂out‖ = {out:.3g} but the gradient w.r.t. its input "
               f"is exactly 0, so what reaches the loss only through it does not learn; {upstream}"
               f"{_bypassed(root, params, calls)}")
    first = root.tensor_inputs[0] if root.tensor_inputs else None
    stats = first.stats if first is not None else None
    if isinstance(module, _RELU_LIKE) and stats is not None and stats.max <= _floor(module):
        source = f" (the output of {calls[first.source].label} ({calls[first.source].class_name}))" \
            if first.source is not None else ""
        message += (f". Every value of its input{source} is ≤ {_floor(module):g} (max = {stats.max:.3g}): "
                    "all its units are dead")
        hint = ("look at what feeds it: a large negative bias or a bad initialisation kills ReLU units; "
                "LeakyReLU or GELU never give an exactly zero gradient")
    else:
        message += ". layerlab can't tell why from the recorded values"
        hint = None
    return Problem("zero-grad-root", message, where=root.path or "(root)", hint=hint, data=data)


def _bypassed(root: CallRecord, params: List[ParamRecord], calls: List[CallRecord]) -> str:
    """", while X, called before it too, still gets gradient (by another path, e.g. a skip connection)"
    when a parameter whose module ran before ``root`` has a non-zero gradient; "" otherwise."""
    started: Dict[str, List[int]] = {}
    for call in calls:
        started.setdefault(call.path, []).append(call.index)
    for p in params:
        if p.trainable and p.grad_norm and "zero-grad" not in p.flags:
            ran = _calls_of(p.name.rpartition(".")[0], started)
            if ran and max(ran) < root.index and p.name.rpartition(".")[0] not in ("", root.path):
                return (f", while {p.name}, called before it too, still gets gradient by another path "
                        "(e.g. a skip connection around it)")
    return ""


def _floor(module: nn.Module) -> float:
    """Below this input value the activation's gradient is zero (Hardtanh: its min_val)."""
    return float(getattr(module, "min_val", 0.0))


def _ancestors(calls: List[CallRecord], call: CallRecord) -> Set[int]:
    out: Set[int] = set()
    parent = call.parent
    while parent is not None:
        out.add(parent)
        parent = calls[parent].parent
    return out
