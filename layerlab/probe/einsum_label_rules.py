"""An ``einsum`` whose subscripts mislabel an operand, where another einsum fixed the other's axes.

In cross-attention, ``attn = einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)`` then
``einsum("bhqk,bhqd->bhqd", attn, v)`` gives ``q`` two sizes (Tq in attn, Tk in v). Sizes alone
(:mod:`einsum_rules`) would transpose ``attn`` — which runs the einsum and returns Tk rows where the
model wants Tq. But ``attn``'s axes are not in doubt: the einsum that made it wrote them as
``bhqk``. So the mistake is in the other operand's subscripts, and the fix relabels them
(``bhkd``), offered only when exactly one relabeling makes every letter one size.
"""

from __future__ import annotations

from typing import List, Optional

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


def relabel(ctx, failed) -> Optional[Diagnosis]:
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
                if _agrees(trial, shapes) and set(out) <= set("".join(trial)):
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
        return Diagnosis(message + "; layerlab cannot tell which subscript of the other operands is wrong",
                         hint="relabel the other operand's subscripts to its real axes", alternatives=not_moves, **base)
    j, trial = fits[0]
    new_eq = ",".join(trial) + "->" + out
    message += f"; {names[j]} {shapes[j]} is '{trial[j]}', not '{terms[j]}'"
    return Diagnosis(
        message, hint=f"relabel {names[j]}: torch.einsum(\"{new_eq}\", …){op_at(record)}",
        fix=FixStep("replace-op", record.source or "", f'einsum("{new_eq}")',
                    op_site(record, rewrite="equation", equation=new_eq)),
        alternatives=not_moves, **base)
