"""Which tensors, and which of their entries, the numerical gradient check looks at in a big model.

Each checked tensor costs two forwards of the whole layer, so checking every parameter of a
124M-parameter model is hundreds of forwards. Above a budget (:attr:`GradcheckOptions.budget`,
in parameter-elements × forwards, a cost that is the same on every machine, so the choice is
reproducible) the check looks at:

* every input (they are few and cheap);
* every parameter fed straight into a custom ``torch.autograd.Function``: its gradient comes from
  a backward someone wrote by hand, where gradcheck finds bugs (a layer built from torch ops gets
  its backward from autograd, correct by construction);
* then a seeded random sample of the other parameters, up to the budget;

and in a tensor with more than ``max_entries`` entries, a random direction over that many
entries only. The plan records what was and was not checked so the report can say it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set

import torch
from torch import Tensor


@dataclass
class Plan:
    """What the check covers.

    Attributes:
        checked: indices of the tensors checked, in their original order.
        custom: indices fed straight into a custom autograd.Function (checked first).
        max_entries: directions cover at most this many entries of one tensor (``None``: all).
        sampled: whether anything was left out.
        reason: why the check was cut down (``None``: everything is checked).
    """

    checked: List[int]
    custom: List[int] = field(default_factory=list)
    max_entries: Optional[int] = None
    sampled: bool = False
    reason: Optional[str] = None


def plan(kinds: Sequence[str], numels: Sequence[int], custom: Set[int], budget: int, min_tensors: int,
         max_entries: int, gen: torch.Generator, max_tensors: Optional[int] = None) -> Plan:
    """Choose the tensors to check under ``budget`` (elements × forwards; see the module docstring)
    and, when given, at most ``max_tensors`` (what a time budget allows when one forward is slow:
    a ViT-B/16 at 224×224 has fewer parameters than GPT-2 but a forward 20× as long)."""
    total = sum(numels)
    n = len(numels)
    limit = max(min_tensors, min(budget // max(total, 1), max_tensors if max_tensors is not None else n))
    if n <= limit:
        return Plan(checked=list(range(n)), custom=sorted(custom))
    inputs = [i for i in range(n) if kinds[i] == "input"]
    first = [i for i in range(n) if kinds[i] != "input" and i in custom]
    rest = [i for i in range(n) if kinds[i] != "input" and i not in custom]
    order = torch.randperm(len(rest), generator=gen).tolist()
    room = max(limit - len(inputs) - len(first), 0)
    picked = set(inputs) | set(first) | {rest[k] for k in order[:room]}
    reason = (f"{n} tensors with {total:,} elements: checking every tensor would take {2 * n} forwards of the "
              f"whole layer; checked {len(picked)} (the inputs, the parameters behind a custom autograd.Function, "
              f"then a seeded random sample), each along a random direction over at most {max_entries:,} entries")
    return Plan(checked=sorted(picked), custom=sorted(custom), max_entries=max_entries, sampled=True, reason=reason)


#: autograd nodes that only reshape, view or cast: a parameter behind them is still a direct input
_PASS_THROUGH = ("TBackward", "ViewBackward", "ReshapeAliasBackward", "UnsafeViewBackward", "TransposeBackward",
                 "PermuteBackward", "ExpandBackward", "UnsqueezeBackward", "SqueezeBackward", "ToCopyBackward",
                 "CloneBackward", "AliasBackward", "SliceBackward", "SelectBackward")


def custom_function_leaves(outputs: Sequence[Tensor], tensors: Sequence[Tensor]) -> Set[int]:
    """Indices of ``tensors`` fed straight (through views and casts only) into a custom
    ``autograd.Function``: their gradient is the hand-written backward's output. A walk over the
    autograd graph from ``outputs`` (metadata only, nothing is computed)."""
    position = {id(t): i for i, t in enumerate(tensors)}
    found: Set[int] = set()
    seen: Set[Any] = set()
    stack = [y.grad_fn for y in outputs if y.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if _is_custom(node):
            found |= _direct_leaves(node, position)
        stack.extend(n for n, _ in node.next_functions)
    return found


def _direct_leaves(node: Any, position: Dict[int, int]) -> Set[int]:
    out: Set[int] = set()
    todo = [n for n, _ in node.next_functions]
    while todo:
        n = todo.pop()
        if n is None:
            continue
        variable = getattr(n, "variable", None)  # AccumulateGrad: a leaf tensor
        if variable is not None and id(variable) in position:
            out.add(position[id(variable)])
        elif type(n).__name__.startswith(_PASS_THROUGH):
            todo.extend(m for m, _ in n.next_functions)
    return out


def _is_custom(node: Any) -> bool:
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def describe(plan_: Plan, names: Sequence[str], numels: Sequence[int]) -> Dict[str, Any]:
    """The plan as JSON-ready details."""
    left = [names[i] for i in range(len(names)) if i not in set(plan_.checked)]
    out: Dict[str, Any] = {
        "sampled": plan_.sampled,
        "tensors_checked": len(plan_.checked),
        "tensors_total": len(names),
        "elements_total": sum(numels),
    }
    if plan_.custom:
        out["behind_custom_function"] = [names[i] for i in plan_.custom]
    if plan_.sampled:
        out.update(reason=plan_.reason, max_entries_per_tensor=plan_.max_entries,
                   not_checked=left[:20], not_checked_count=len(left))
    return out
