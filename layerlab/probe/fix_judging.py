"""A rule's fix judged by the oracles, and the fix search where the rule's fix is not enough.

"Verified" means the fixed copy computes a plausible model, not only that it runs. After
:func:`layerlab.probe.verify_fix.follow` made a copy run with a rule's fix (and the fixes of the
failures after it), :func:`judge_and_search`:

1. judges that copy with :func:`layerlab.engine.oracles.judge`; a fix that fails an oracle becomes
   ``implausible`` ("runs, but sample 0's output then depends on the other samples") and is never
   shown as *the* fix: it moves to the alternatives with that caveat;
2. searches the edit grammar (:mod:`layerlab.engine.fix_search`) when the rule's fix failed an
   oracle, did not make the model run, or changes parameters (a smaller edit may exist). A search
   candidate that passes every oracle replaces a rejected fix, or a larger one, or a resize where it
   keeps every parameter's shape (an upstream ``padding``: the parameters as built are the author's
   intent; the resize is named as the other reading);
3. never crowns one of two survivors that mean different things: "different" is decided by running
   both fixed copies on the same weights and inputs (:mod:`layerlab.engine.fix_meaning`). Different
   outputs: both are named, with the fact about the data that decides, and the verification is
   ``ambiguous`` (no fix). Equal outputs: one fix written twice, the smaller is kept.

:func:`search_diagnosis` is the same search for a failure no rule recognises. Everything here runs
on copies, under one time cap (:data:`ORACLE_BUDGET_S`).
"""

from __future__ import annotations

from typing import List, Optional

from layerlab.engine.oracles import Budget
from layerlab.probe.report import Diagnosis, Verification

#: The most time (CPU seconds of this process) the oracles and the search may add to one failure's diagnosis.
ORACLE_BUDGET_S = 2.0


def _base(module, args, kwargs, seed, mode, ctx):
    """The original failure with its op trace (the real run's, or a replay's)."""
    from layerlab.probe.verify_fix import copy_model, traced_forward

    if ctx is not None and ctx.trace is not None:
        return ctx
    clone = copy_model(module, mode)
    if clone is None:
        return None
    outcome = traced_forward(clone, args, kwargs, seed)
    return None if outcome.ok else outcome.ctx


def _verification(scored) -> Verification:
    return Verification("runs", [scored.candidate.step], outputs=scored.outputs, checks=list(scored.verdict.passed))


def _chain_code(v: Verification) -> str:
    return ", then ".join(f"`{s.code}`" for s in v.steps)


def judge_and_search(module, args, kwargs, seed, mode, first: Optional[Diagnosis], chained: Optional[Verification],
                     fixed, ctx=None, flattened=None) -> Optional[Verification]:
    """Judge the rule's fixed copy; search where it falls short (see the module doc). May change
    ``first.fix``, ``first.hint`` and ``first.alternatives``; returns the verification to report."""
    from layerlab.engine.fix_search import edited_sites, parameters_changed, resized_layers, search
    from layerlab.engine.oracle_sizes import flattened_inputs, original_free_axes
    from layerlab.engine.oracles import judge
    from layerlab.probe.verify_fix import location

    if first is None or first.fix is None or chained is None:
        return chained
    deadline = Budget(ORACLE_BUDGET_S)
    base = _base(module, args, kwargs, seed, mode, ctx)
    if base is None:
        return chained
    failed_at = location(base)
    free = original_free_axes(module, args, kwargs, seed, base, deadline)
    if chained.status == "runs" and fixed is not None:
        verdict = judge(fixed, module, args, kwargs, seed, failed_at=failed_at, edited=edited_sites(chained.steps),
                        trace=base.trace, budget_s=max(0.05, deadline.left() / 2), free=free,
                        resized=resized_layers(module, chained.steps), steps=chained.steps,
                        flattened={**flattened_inputs(base), **(flattened or {})})
        chained.checks = list(verdict.passed)
        if not verdict.ok:
            chained.status = "implausible"
            chained.failed_check, chained.note = verdict.failed[0]
    resized = parameters_changed(module, chained.steps)
    if chained.status == "runs" and not resized and len(chained.steps) == 1:
        return chained
    if first.cause == "ambiguous" or chained.status not in ("runs", "implausible"):
        return _demoted(first, chained)
    found = [s for s in search(module, args, kwargs, seed, mode, base, failed_at=failed_at, deadline=deadline,
                               exclude=tuple((s.where, s.code) for s in chained.steps), free=free) if s.verdict.ok]
    if chained.status == "implausible":
        if not found:
            return _demoted(first, chained)
        rival = _rival(module, args, kwargs, seed, found)
        if rival is not None:
            return _ambiguous(first, chained, (found[0], rival), rule_note=_rejected(chained))
        return _replace(first, chained, found[0], others=found[1:])
    # the rule's chain runs and passes. Against a chain that changes a parameter's shape, a smaller
    # edit that keeps every shape wins, and so does an upstream argument that keeps them at equal
    # size (the parameters as built are the author's intent; a permute of the failing layer's input
    # at equal size is the layout-against-size question the rules already weighed). Against a chain
    # that keeps them, a smaller edit wins only if the two fixed copies compute the same outputs
    from layerlab.engine.fix_meaning import reshapes

    chain_reshapes = reshapes(module, chained.steps)
    contenders = [s for s in found if s.candidate.keeps_shapes and (
        s.candidate.edits < len(chained.steps) or (chain_reshapes and s.candidate.keeps_layout))]
    if not contenders:
        return chained
    rival = _rival(module, args, kwargs, seed, contenders)
    if rival is not None:
        return _ambiguous(first, chained, (contenders[0], rival))
    if not chain_reshapes and not _same(module, args, kwargs, seed, chained.steps, [contenders[0].candidate.step]):
        return _ambiguous(first, chained, (contenders[0], chained))
    return _replace(first, chained, contenders[0], others=[], reshaped=chain_reshapes)


def _same(module, args, kwargs, seed, a_steps, b_steps) -> bool:
    from layerlab.engine.fix_meaning import same_meaning

    return same_meaning(module, a_steps, b_steps, args, kwargs, seed)


def _rival(module, args, kwargs, seed, survivors, compared: int = 2):
    """The first survivor after the best whose fixed copy computes other outputs than the best's, among
    those of the best's class (both keep every parameter's shape, or neither does); ``None``: one meaning."""
    best = survivors[0]
    tier = [s for s in survivors[1:] if s.candidate.keeps_shapes == best.candidate.keeps_shapes][:compared]
    for other in tier:
        if not _same(module, args, kwargs, seed, [best.candidate.step], [other.candidate.step]):
            return other
    return None


def _reading(r) -> str:
    """```code`` (right if …)` for a search survivor or a rule's chain."""
    if isinstance(r, Verification):
        return f"{_chain_code(r)} (the rule's fix)"
    c = r.candidate
    where = "" if not c.step.where else f" at {c.step.where}" if c.step.kind == "replace-op" else f" on `{c.step.where}`"
    return f"`{c.step.code}`{where} (right if {c.meaning})"


def _decides(pair) -> str:
    from layerlab.engine.fix_meaning import deciding_fact

    steps = [r.candidate.step for r in pair if not isinstance(r, Verification)]
    if len(steps) == 2 and all(s.kind == "set-attr" for s in steps) and steps[0].where != steps[1].where:
        return "which layer was built with the wrong argument: " + " or ".join(f"`{s.where}` ({s.code})" for s in steps)
    return deciding_fact(*[getattr(getattr(r, "candidate", None), "decides", "") for r in pair])


def _rejected(chained: Verification) -> str:
    return f"{_chain_code(chained)} runs, but {chained.note}: not a fix"


def _ambiguous(first: Diagnosis, chained: Verification, pair, rule_note: Optional[str] = None) -> Verification:
    """Two readings that both run and pass every check but compute different outputs: both named,
    none is *the* fix, and the fact about the data that decides between them is said."""
    fact = _decides(pair)
    a, b = (_reading(r) for r in pair)
    first.hint = (f"two readings run and pass every check but compute different outputs on the same weights: "
                  f"{a}; or {b}. What decides: {fact}")
    if rule_note is None and chained.status == "runs" and not any(r is chained for r in pair):
        rule_note = f"{_chain_code(chained)} also runs and passes the checks: right only if the layer's size is what is wrong"
    first.alternatives[:0] = [a, b] + ([rule_note] if rule_note else [])
    first.fix = None
    return Verification("ambiguous", [], note=f"two readings compute different outputs on the same weights; "
                                              f"what decides: {fact}")


def _demoted(first: Diagnosis, chained: Verification) -> Verification:
    """A rule's fix that runs but fails an oracle: no longer *the* fix, kept as an alternative."""
    if chained.status != "implausible":
        return chained
    caveat = f"{_chain_code(chained)} runs, but {chained.note}: not a fix"
    first.alternatives.insert(0, caveat)
    first.hint = f"no verified fix: {caveat}" + (f" (the rule suggested: {first.hint})" if first.hint else "")
    first.fix = None
    return chained


def _replace(first: Diagnosis, chained: Verification, best, others: List, reshaped: Optional[bool] = None) -> Verification:
    """``best`` (a search candidate that passes every oracle) becomes the fix; the rule's is named after it."""
    c = best.candidate
    at = f" at {c.step.where}" if c.step.kind == "replace-op" and c.step.where else (
        f" before `{c.step.where}`" if c.step.kind.endswith("-input") else f" on `{c.step.where}`")
    if chained.status == "implausible":
        rule = f"{_chain_code(chained)} runs, but {chained.note}: not a fix"
        head = f"`{c.step.code}`{at} (found by the fix search: runs and passes every check; {c.meaning})"
    elif parameters_changed_any(chained) if reshaped is None else reshaped:
        rule = (f"{_chain_code(chained)} also runs and passes the checks, with another meaning: right only if "
                f"the layer's size is what is wrong")
        kind = ("smaller edit: no parameter changes" if c.edits < len(chained.steps)
                else "edit that keeps every parameter as built")
        head = (f"`{c.step.code}`{at} (the fix search's {kind}; right if {c.meaning}); "
                f"or {_chain_code(chained)} if the layer's size is what is wrong")
    else:
        rule = f"{_chain_code(chained)} also runs and passes the checks, in {len(chained.steps)} edits, not one"
        head = f"`{c.step.code}`{at} (the fix search's one edit: runs and passes every check; {c.meaning})"
    first.alternatives.insert(0, rule)
    for other in others[:2]:
        first.alternatives.insert(1, f"`{other.candidate.step.code}` also runs and passes every check: "
                                     f"right if {other.candidate.meaning}")
    first.hint = head
    first.fix = c.step
    return _verification(best)


def parameters_changed_any(v: Verification) -> bool:
    return any(s.kind == "set-arg" for s in v.steps)


def search_diagnosis(module, args, kwargs, seed, mode, ctx) -> Optional[Diagnosis]:
    """For a failure no rule recognises: the search's fix, when the best survivor's meaning is the only
    one of its class (two whose fixed copies compute different outputs are both named, none is *the* fix)."""
    from layerlab.engine.fix_search import search
    from layerlab.probe.verify_fix import _first_line, location

    deadline = Budget(ORACLE_BUDGET_S)
    base = _base(module, args, kwargs, seed, mode, ctx)
    if base is None:
        return None
    found = [s for s in search(module, args, kwargs, seed, mode, base, failed_at=location(base), deadline=deadline)
             if s.verdict.ok]
    if not found:
        return None
    message = f"{type(base.exc).__name__}: {_first_line(base.exc)}"
    rival = _rival(module, args, kwargs, seed, found)
    if rival is not None:
        pair = (found[0], rival)
        a, b = (_reading(r) for r in pair)
        return Diagnosis(message, cause="ambiguous", rule="fix search (no rule recognises this failure)",
                         hint=f"two edits make it run and pass every check but compute different outputs on the "
                              f"same weights: {a}; or {b}. What decides: {_decides(pair)}",
                         alternatives=[a, b])
    best = found[:1]
    c = best[0].candidate
    where = f" at {c.step.where}" if c.step.where else ""
    d = Diagnosis(message, cause="search", rule="fix search (no rule recognises this failure)",
                  hint=f"`{c.step.code}`{where} — the smallest edit that runs and passes every check ({c.meaning})",
                  fix=c.step, alternatives=[f"`{s.candidate.step.code}` (runs and passes too; right if "
                                            f"{s.candidate.meaning})" for s in found[1:3]])
    d.verified = _verification(best[0])
    return d
