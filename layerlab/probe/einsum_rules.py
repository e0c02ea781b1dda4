"""Why an ``einsum`` raised: one subscript letter with two sizes — and, where the sizes alone say
which operand has its axes in the wrong order and how, the permute that fixes it.

``torch.einsum("bhqd,bhkd->bhqk", q, k)`` with ``k`` laid out ``(b, k, h, d)`` gives ``h`` two sizes.
The fix permutes one operand so that every letter has one size. It is offered only when exactly
one (operand, permutation) does that: an operand whose permutation would just undo a
``transpose``/``permute`` the user wrote on purpose is not a candidate (that axis order was chosen),
and when two permutations remain (two axes of one size, or either operand could move) the rule
names them and offers none — a guess there runs with heads and positions swapped.
"""

from __future__ import annotations

import itertools
import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.layout import AXIS_MOVES, inverse
from layerlab.probe.report import Diagnosis, FixStep

#: Operands of higher rank are not searched (6! = 720 orders at most).
MAX_RANK = 6
_RULE = "einsum: one size per subscript letter (1 broadcasts)"


def _agrees(terms: Sequence[str], shapes: Sequence[Sequence[int]]) -> bool:
    seen: Dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        if len(term) != len(shape):
            return False
        for letter, n in zip(term, shape):
            if n == 1:
                continue
            if seen.setdefault(letter, n) != n:
                return False
    return True


def _undoes(ctx, t: torch.Tensor, perm: List[int]) -> bool:
    """Whether permuting ``t`` by ``perm`` undoes the transpose/permute that made it."""
    record = ctx.producer_op(t)
    if record is None or record.op not in AXIS_MOVES or not record.inputs:
        return False
    before, after = record.inputs[0].shape, list(t.shape)
    undo = [after[i] for i in perm] == before  # the sizes come back; check the made order, too
    if not undo:
        return False
    args = [v for k, v in sorted(record.args.items()) if k.isdigit()]
    if record.op in ("transpose", "swapaxes") and len(args) == 2:
        a, b = (int(v) % len(after) for v in args)
        made = list(range(len(after)))
        made[a], made[b] = made[b], made[a]
    elif record.op == "permute":
        made = [int(v) for v in (args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args)]
    else:
        return True  # sizes say so; movedim's dims are not parsed
    return [made[i] for i in perm] == list(range(len(after)))


def _operand_names(code: Optional[str], count: int) -> List[str]:
    """``["q", "k"]`` from ``torch.einsum("…", q, k)`` on the source line (else operand 0, 1 …)."""
    code = re.sub(r"\s+#[^'\"]*$", "", code or "")  # a trailing comment is not part of the call
    found = re.search(r"einsum\(\s*(['\"]).*?\1\s*,\s*\[?(.*?)\]?\s*\)\s*$", code)
    if found:
        names = [n.strip() for n in found.group(2).split(",")]
        if len(names) == count and all(re.fullmatch(r"[A-Za-z_][\w.]*", n) for n in names):
            return names
    return [f"operand {i}" for i in range(count)]


def _permute_code(name: str, perm: List[int]) -> str:
    moved = [i for i, p in enumerate(perm) if p != i]
    if len(moved) == 2:
        return f"{name}.transpose({moved[0]}, {moved[1]})"
    return f"{name}.permute({', '.join(map(str, perm))})"


def _candidates(ctx, terms, tensors) -> Tuple[List[Tuple[int, List[int]]], List[Tuple[int, List[int]]]]:
    """``(fits, undoing)``: the (operand, permutation) pairs that make the sizes agree."""
    shapes = [list(t.shape) for t in tensors]
    fits, undoing = [], []
    for i, t in enumerate(tensors):
        if t.dim() > MAX_RANK:
            continue
        for perm in itertools.permutations(range(t.dim())):
            perm = list(perm)
            if perm == sorted(perm):
                continue
            trial = [*shapes[:i], [shapes[i][p] for p in perm], *shapes[i + 1:]]
            if _agrees(terms, trial):
                (undoing if _undoes(ctx, t, perm) else fits).append((i, perm))
    return fits, undoing


@register_rule("einsum/letter-sizes", stage="op", on=ops.EINSUM, order=470)
def einsum(ctx) -> Optional[Diagnosis]:
    """An einsum letter with two sizes: the permute that fixes it, when exactly one does."""
    failed = ctx.failed_op
    from layerlab.probe.context import op_tensors

    eq = failed.args[0] if failed.args and isinstance(failed.args[0], str) else None
    tensors = op_tensors(failed)
    if eq is None or "->" not in eq and "," not in eq:
        return None
    terms = eq.split("->")[0].replace(" ", "").split(",")
    if len(terms) != len(tensors) or any("." in t for t in terms):
        return None
    sizes: Dict[str, list] = {}
    for i, (term, t) in enumerate(zip(terms, tensors)):
        for letter, n in zip(term, t.shape):
            sizes.setdefault(letter, []).append((i, n))
    clash = {c: v for c, v in sizes.items() if len({n for _, n in v if n != 1}) > 1}
    if not clash:
        return None
    letter, seen = next(iter(clash.items()))
    record = failed.record
    names = _operand_names(record.code, len(tensors))
    message = (f"einsum('{eq}'){op_at(record)}: subscript {letter} is " + " and ".join(f"{n} in {names[i]}" for i, n in seen)
               + "; " + ", ".join(f"{names[i]} {list(t.shape)} as '{term}'" for i, (term, t) in enumerate(zip(terms, tensors))))
    hint = f"every occurrence of {letter} must have one size: check the order of the subscripts against each operand's dims"
    fits, undoing = _candidates(ctx, terms, tensors)
    base = dict(expected=seen[0][1], got=seen[-1][1], cause="inner-dim", rule=_RULE)
    options = [_permute_code(names[i], perm) for i, perm in fits]
    if len(fits) == 1:
        (i, perm), code = fits[0], options[0]
        laid = "".join(terms[i][inverse(perm)[j]] for j in range(len(perm)))
        message += f"; {names[i]} is laid out '{laid}', not '{terms[i]}'"
        alternatives = [f"not {_permute_code(names[j], p)}: it would undo the axis order you chose at "
                        f"{ctx.producer_op(tensors[j]).source or 'its transpose'}" for j, p in undoing]
        return Diagnosis(message, hint=f"{hint}; {code}{op_at(record)} makes every size agree",
                         fix=FixStep("replace-op", record.source or "", code, op_site(record, operand=i, dims=perm)),
                         alternatives=alternatives, **base)
    if len(fits) > 1:
        hint += f"; {len(fits)} axis orders make the sizes agree ({', '.join(options)}): the sizes alone cannot tell which is meant"
    return Diagnosis(message, hint=hint, **base)
