"""The corpus of broken models (``tests/probe/corpus.py``) through ``layerlab.inspect``.

For every case: the blamed location, the cause, the exact fix, what verifying it gave — and, where
the fix is mechanical and the model then runs, that the fixed copy computes exactly what the same
model fixed by hand computes (weights copied across). A wrong confident fix is the worst outcome,
so layout cases also check that the tempting size change is not what comes first.

Each case is inspected once (:func:`run` caches it); the tests read that one report.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Dict, List

import pytest
import torch

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe.corpus import CASES, Case, site

BY_NAME = {c.name: c for c in CASES}

#: ``(test, case name) → reason`` for a right answer that needs a change outside the rule modules
#: (strict xfail: when the change lands, the entry must go).
KNOWN: Dict[tuple, str] = {}


def cases(test: str, where=lambda c: True) -> List[Any]:
    out = []
    for c in CASES:
        if where(c):
            why = KNOWN.get((test, c.name))
            marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
            out.append(pytest.param(c, id=c.name, marks=marks))
    return out


# -- one inspection per case ------------------------------------------------------------------------
def _state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same_state(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(m._backward_pre_hooks) for m in model.modules())


@dataclass
class Run:
    model: torch.nn.Module
    args: tuple
    kwargs: dict
    report: Any
    before: Dict[str, torch.Tensor]
    after: Dict[str, torch.Tensor]
    flags_before: List[bool]
    flags_after: List[bool]
    hooks_after: int
    modes_after: int

    @property
    def failure(self):
        return self.report.failure

    @property
    def diagnosis(self):
        return self.report.failure.diagnosis


@functools.lru_cache(maxsize=None)
def run(name: str) -> Run:
    case = BY_NAME[name]
    torch.manual_seed(0)
    model = case.model()
    args, kwargs = case.inputs()
    before, flags = _state(model), [m.training for m in model.modules()]
    report = layerlab.inspect(model, *args, forward_kwargs=kwargs)
    return Run(model, args, kwargs, report, before, _state(model), flags, [m.training for m in model.modules()],
               _hooks(model), torch._C._len_torch_function_stack())


def _fix(step):
    return (step.kind, step.where, step.code) if step is not None else None


def _expected(fix):
    return (fix[0], site(fix[1]), fix[2]) if fix is not None else None


# -- the corpus itself ------------------------------------------------------------------------------
def test_the_corpus_is_large_and_covers_every_cause():
    assert len(CASES) >= 30
    assert len(BY_NAME) == len(CASES), "case names must be unique"
    causes = {c.cause for c in CASES}
    assert {"layout", "size", "rank", "non-contiguous", "element-count", "cat-dim", "broadcast", "inner-dim",
            "mask-dtype", "mask-shape", "index-range", "dtype", "ambiguous"} <= causes
    for c in CASES:
        assert (c.fix is None) == (c.status is None), c.name
        if c.status == "runs":
            assert c.hand is not None, f"{c.name}: a fix that runs needs the model fixed by hand to compare"
        if c.cause == "ambiguous":
            assert c.fix is None, c.name


# -- per case ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", cases("blame"))
def test_blamed_location(case: Case):
    f = run(case.name).failure
    assert f is not None and f.phase == "forward"
    assert f.path == case.path
    if case.op is None:
        assert f.op is None, f"a torch.nn layer raised, not {f.op and f.op.label}"
    else:
        assert f.op is not None and (f.op.op, f.op.source) == (case.op[0], site(case.op[1]))
        assert f.op.status == "raised"


@pytest.mark.parametrize("case", cases("diagnosis"))
def test_cause_and_fix(case: Case):
    d = run(case.name).diagnosis
    assert d is not None, run(case.name).failure.message
    assert d.cause == case.cause, d.message
    assert _fix(d.fix) == _expected(case.fix), d.message
    assert d.message and d.hint
    if d.cause == "ambiguous":
        assert d.fix is None, "an ambiguous diagnosis must not carry a fix"


@pytest.mark.parametrize("case", cases("verification"))
def test_verification(case: Case):
    d = run(case.name).diagnosis
    v = d.verified
    if case.status is None:
        assert v is None
        return
    assert v is not None and v.status == case.status, (v and v.note, v and v.then)
    assert _fix(v.steps[0]) == _fix(d.fix)
    assert len(v.then) == len(case.then), [(s.where, s.message) for s in v.then]
    for step, (where, fix) in zip(v.then, case.then):
        assert where in step.where and step.message
        assert _fix(step.fix) == _expected(fix)
    assert [_fix(s) for s in v.steps] == [_fix(d.fix)] + [_expected(fix) for _, fix in case.then if fix is not None]
    if v.status == "runs":
        assert v.outputs and v.note is None


@pytest.mark.parametrize("case", cases("hand", lambda c: c.hand is not None))
def test_verified_fix_computes_what_the_hand_fix_computes(case: Case):
    r = run(case.name)
    v = r.diagnosis.verified
    assert v is not None and v.status == "runs"
    before = _state(r.model)
    fixed = apply_fixes(r.model, v.steps)
    assert _same_state(_state(r.model), before) and _hooks(r.model) == 0, "apply_fixes changed the user's model"
    hand = case.hand()
    hand.load_state_dict(fixed.model.state_dict(), strict=True)
    fixed.eval()
    hand.eval()
    want = hand(*r.args, **r.kwargs)
    torch.testing.assert_close(fixed(*r.args, **r.kwargs), want)
    assert v.outputs == [list(want.shape)]


@pytest.mark.parametrize("case", cases("untouched"))
def test_the_users_model_is_untouched(case: Case):
    r = run(case.name)
    assert _same_state(r.after, r.before)
    assert r.flags_after == r.flags_before
    assert r.hooks_after == 0
    assert r.modes_after == 0, "a TorchFunctionMode was left on"


# -- the tempting size change -----------------------------------------------------------------------
@pytest.mark.parametrize("case", cases("tempting", lambda c: c.tempting is not None))
def test_the_tempting_fix_is_not_first(case: Case):
    """``in_channels=10`` for Conv1d fed (B, T=10, E) runs — and convolves over the embedding."""
    d = run(case.name).diagnosis
    if d.fix is not None:
        assert case.tempting not in d.fix.code
    assert not d.hint.startswith(case.tempting) and not d.hint.startswith("set " + case.tempting)
    for alternative in d.alternatives:
        if case.tempting in alternative:
            assert re.search(r"\bif\b", alternative), f"no caveat: {alternative!r}"
    steps = d.verified.steps if d.verified is not None else []
    assert all(case.tempting not in s.code for s in steps)


@pytest.mark.parametrize("case", cases("origins", lambda c: c.op is not None))
def test_op_failures_say_where_operands_came_from(case: Case):
    f = run(case.name).failure
    assert f.origins and all(o.text.startswith(o.input) for o in f.origins)
    assert len(f.origins) == len(f.op.inputs[:4])


def test_a_parameter_operand_is_not_called_a_model_input():
    d = run("position_table_not_sliced").diagnosis
    assert "b [1, 12, 16] came from the parameter `pos`" in d.message
    assert "a [2, 8, 16] came from `emb` (Embedding)" in d.message
