"""An ``einsum`` whose subscripts mislabel an operand, where another einsum fixed the other's axes.

In cross-attention, ``attn = einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)`` then
``einsum("bhqk,bhqd->bhqd", attn, v)`` gives ``q`` two sizes (Tq in attn, Tk in v). Sizes alone
(:mod:`einsum_rules`) would transpose ``attn`` — which runs the einsum and returns Tk rows where the
model wants Tq. But ``attn``'s axes are not in doubt: the einsum that made it wrote them as
``bhqk``. So the mistake is in the other operand's subscripts, and the fix relabels them
(``bhkd``), offered only when exactly one relabeling makes every letter one size *and* keeps every
summed letter in two operands. A relabeling that leaves a letter summed within one operand alone
(``bhqk,bhqd->bhqd`` sums the attention weights over the keys, by themselves) runs and computes
something else: when the equation is right and ``v`` was made from the wrong tensor (the query
stream instead of the context), that is the only relabeling that fits, and it is not offered.
"""

from __future__ import annotations

from typing import List, Optional

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site, op_tensors
from layerlab.probe.einsum_rules import _agrees, _operand_names
from layerlab.probe.op_walk import back_to
from layerlab.probe.report import Diagnosis, FixStep


def _made_as(ctx, t, term: str) -> Optional[str]:
    """The source of the einsum that made ``t`` with exactly the axes ``term`` (else ``None``)."""
    record, _ = back_to(ctx, t, {"einsum"})
    if record is None:
        return None
    eq = str(record.args.get("0", "")).replace(" ", "")
    return (record.source or "an einsum") if eq.partition("->")[2] == term else None


def _lone_sums(terms: List[str], out: str) -> bool:
    """A letter summed away inside one operand only (not in the output, in no other operand)."""
    return any(sum(letter in t for t in terms) == 1 for letter in set("".join(terms)) - set(out))


def _clash(terms: List[str], shapes: List[List[int]]) -> str:
    """``'k' is 7 in operand 0 and 5 in operand 1`` for the first letter given two sizes."""
    for letter in sorted(set("".join(terms))):
        sizes = [(i, s[t.index(letter)]) for i, (t, s) in enumerate(zip(terms, shapes)) if letter in t]
        if len({n for _, n in sizes}) > 1:
            return f"'{letter}' is " + " and ".join(f"{n} in operand {i}" for i, n in sizes)
    return ""


@register_rule("einsum/operand-labels", stage="op", on=ops.EINSUM, order=200)
def relabel(ctx) -> Optional[Diagnosis]:
    """An einsum operand mislabeled where another einsum fixed the other's axes: relabel its subscripts."""
    failed = ctx.failed_op
    eq = failed.args[0] if failed.args and isinstance(failed.args[0], str) else None
    if eq is None or "->" not in eq or "." in eq:
        return None
    tensors = op_tensors(failed)
    lhs, _, out = eq.replace(" ", "").partition("->")
    terms = lhs.split(",")
    shapes = [list(t.shape) for t in tensors]
    if len(terms) != len(tensors) or _agrees(terms, shapes):
        return None
    made = {i: _made_as(ctx, t, terms[i]) for i, t in enumerate(tensors)}
    fixed_by = {i: s for i, s in made.items() if s is not None}
    if not fixed_by:
        return None  # nothing says which operand's labels are right: the sizes rule decides
    letters = sorted(set(lhs) - {","})
    fits: List[tuple] = []
    for j, term in enumerate(terms):
        if j in fixed_by:
            continue
        for p, old in enumerate(term):
            for new in letters:
                if new == old or new in term:
                    continue
                trial = [*terms[:j], term[:p] + new + term[p + 1:], *terms[j + 1:]]
                if _agrees(trial, shapes) and set(out) <= set("".join(trial)) and not _lone_sums(trial, out):
                    fits.append((j, trial))
    record = failed.record
    names = _operand_names(record.code, len(tensors))
    kept = ", ".join(f"{names[i]} is '{terms[i]}' as the einsum at {s} made it" for i, s in fixed_by.items())
    message = (f"einsum('{eq}'){op_at(record)}: the subscripts do not fit the operands "
               + ", ".join(f"{names[i]} {shapes[i]} as '{terms[i]}'" for i in range(len(terms))) + f"; {kept}")
    base = dict(expected=[f"'{t}'" for t in terms], got=shapes, cause="inner-dim",
                rule="einsum: one size per subscript letter; an operand made by an einsum has that einsum's axes")
    not_moves = [f"not a transpose of {names[i]}: its axes are fixed by the einsum at {s}" for i, s in fixed_by.items()]
    if len(fits) != 1:
        clash = _clash(terms, shapes)
        return Diagnosis(message + "; no relabeling of the other operands both fits and keeps each summed letter "
                         "in two operands: layerlab cannot tell whether a subscript is wrong or an operand was made "
                         "from the wrong tensor" + (f" ({clash})" if clash else ""),
                         hint="check where the other operands were made (a tensor of the other stream, e.g. the "
                              "query instead of the context?), then their subscripts", alternatives=not_moves, **base)
    j, trial = fits[0]
    new_eq = ",".join(trial) + "->" + out
    message += f"; {names[j]} {shapes[j]} is '{trial[j]}', not '{terms[j]}'"
    return Diagnosis(
        message, hint=f"relabel {names[j]}: torch.einsum(\"{new_eq}\", …){op_at(record)}",
        fix=FixStep("replace-op", record.source or "", f'einsum("{new_eq}")',
                    op_site(record, rewrite="equation", equation=new_eq)),
        alternatives=not_moves, **base)
