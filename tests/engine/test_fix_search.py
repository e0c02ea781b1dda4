"""The fix search: one edit grammar at the failure and upstream of it, judged by the oracles.

Each broken model (tests/engine/search_models.py) crashes in a different op; the search's best
candidate, applied to a copy, must compute what the model fixed by hand computes (same weights).
And whatever ``layerlab.inspect`` then offers as a verified fix must compute it too.
"""

from __future__ import annotations

import pytest
import torch

import layerlab
from layerlab.engine.fix_search import candidates, search
from layerlab.engine.oracles import Budget
from layerlab.probe.fixes import apply_fixes
from layerlab.probe.verify_fix import copy_model, location, traced_forward
from tests.engine.search_models import TWINS

BY_NAME = {t.name: t for t in TWINS}


def _failure(twin):
    torch.manual_seed(0)
    model = twin.broken()
    args, kwargs = twin.inputs()
    outcome = traced_forward(copy_model(model, None), args, kwargs, 0)
    assert not outcome.ok, f"{twin.name} must crash"
    return model, args, kwargs, outcome.ctx


def _computes_the_twin(model, steps, twin, args, kwargs) -> None:
    fixed = apply_fixes(model, steps)
    hand = twin.hand()
    hand.load_state_dict(fixed.model.state_dict(), strict=True)
    fixed.eval()
    hand.eval()
    with torch.no_grad():
        torch.testing.assert_close(fixed(*args, **kwargs), hand(*args, **kwargs))


def test_the_cases_cover_ten_different_ops():
    ops = set()
    for twin in TWINS:
        _, _, _, ctx = _failure(twin)
        ops.add(ctx.failed_op.record.op if ctx.failed_op is not None else type(ctx.module).__name__)
    assert len(TWINS) >= 10 and len(ops) >= 10, ops


@pytest.mark.parametrize("name", [t.name for t in TWINS])
def test_the_best_candidate_computes_the_hand_fixed_twin(name):
    twin = BY_NAME[name]
    model, args, kwargs, ctx = _failure(twin)
    found = search(model, args, kwargs, 0, None, ctx, failed_at=location(ctx), deadline=Budget(30))
    assert found and found[0].verdict.ok, [(s.candidate.step.code, s.verdict.failed) for s in found]
    _computes_the_twin(model, [found[0].candidate.step], twin, args, kwargs)


@pytest.mark.parametrize("name", [t.name for t in TWINS])
def test_a_verified_fix_from_inspect_computes_the_twin(name):
    """Whatever inspect offers (a rule's fix or the search's), "runs" means it computes the twin."""
    twin = BY_NAME[name]
    torch.manual_seed(0)
    model = twin.broken()
    args, kwargs = twin.inputs()
    report = layerlab.inspect(model, *args, forward_kwargs=kwargs, backward=False)
    d = report.failure.diagnosis
    if d is None or d.verified is None or d.verified.status != "runs":
        return  # no verified claim: nothing that can be wrong
    assert d.fix is not None and d.verified.steps[0] == d.fix
    _computes_the_twin(model, d.verified.steps, twin, args, kwargs)


def test_a_resize_ranks_after_the_edit_that_changes_no_parameter():
    """mean over the features where the time was meant: ``in_features=9`` runs too, and rebuilds ``fc``."""
    twin = BY_NAME["mean_axis"]
    model, args, kwargs, ctx = _failure(twin)
    found = search(model, args, kwargs, 0, None, ctx, failed_at=location(ctx), deadline=Budget(30))
    codes = [s.candidate.step.code for s in found]
    assert codes[0] == "mean(dim=1)" and "in_features=9" in codes[1:], codes


def test_upstream_sites_come_after_the_failure_and_carry_their_distance():
    twin = BY_NAME["squeeze_ate_batch"]
    _, _, _, ctx = _failure(twin)
    found = candidates(ctx)
    squeeze = [c for c in found if "squeeze(1)" in c.step.code]
    assert squeeze and squeeze[0].distance >= 1 and squeeze[0].step.kind == "replace-op"


def test_the_users_model_is_untouched_by_the_search():
    twin = BY_NAME["gather_index_rank"]
    model, args, kwargs, ctx = _failure(twin)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    search(model, args, kwargs, 0, None, ctx, failed_at=location(ctx), deadline=Budget(30))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError):
        model(*args)
