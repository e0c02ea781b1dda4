"""Two surviving fixes with different meanings are two readings, never one verified fix.

Meaning is decided by running: two fixed copies on the same weights and inputs that compute
different outputs are different readings; equal outputs are one fix written twice. Each case has
hand-fixed twins in plain torch (tests/engine/ambiguity_models.py) with the same parameter names.
"""

from __future__ import annotations

import torch

import layerlab
from layerlab.engine.fix_meaning import same_meaning
from layerlab.engine.fix_search import search
from layerlab.engine.oracles import Budget
from layerlab.probe.fixes import apply_fixes
from layerlab.probe.verify_fix import copy_model, location, traced_forward
from tests.engine.ambiguity_models import ExtraTranspose, PointTransform, TwoConvs


def _inspect(model, x):
    report = layerlab.inspect(model, x, backward=False)
    return report.failure.diagnosis


def _twin_output(twin, model, x):
    twin.load_state_dict(model.state_dict(), strict=True)
    twin.eval()
    with torch.no_grad():
        return twin(x)


def test_the_two_point_transform_readings_really_differ():
    """The premise: ``t @ x`` and ``(xᵀ t)ᵀ`` are two models on the same weights."""
    torch.manual_seed(0)
    model, x = PointTransform(), torch.randn(2, 3, 7)
    a, b = _twin_output(PointTransform("swap"), model, x), _twin_output(PointTransform("around"), model, x)
    assert a.shape == b.shape == (2, 8, 7) and not torch.allclose(a, b, atol=1e-3)


def test_bmm_orientation_claims_no_fix_and_names_both_readings():
    torch.manual_seed(0)
    model, x = PointTransform(), torch.randn(2, 3, 7)
    d = _inspect(model, x)
    assert d is not None and d.fix is None
    assert d.verified is None or d.verified.status != "runs"
    named = " ".join(d.alternatives)
    assert "swapped" in named and "transpose" in named, d.alternatives
    assert "which axis of `t` indexes the coordinates of `x`" in d.hint, d.hint
    assert d.verified.status == "ambiguous"


def test_each_bmm_reading_named_computes_its_twin():
    """Both readings are real: the swap computes ``t @ x``, and the rule's chain computes ``(xᵀ t)ᵀ``."""
    torch.manual_seed(0)
    model, x = PointTransform(), torch.randn(2, 3, 7)
    outcome = traced_forward(copy_model(model, None), (x,), {}, 0)
    found = [s for s in search(model, (x,), {}, 0, None, outcome.ctx, failed_at=location(outcome.ctx),
                               deadline=Budget(30)) if s.verdict.ok]
    swap = next(s for s in found if "swapped" in s.candidate.step.code)
    fixed = apply_fixes(model, [swap.candidate.step])
    fixed.eval()
    with torch.no_grad():
        torch.testing.assert_close(fixed(x), _twin_output(PointTransform("swap"), model, x))


def test_two_upstream_layers_that_both_fit_are_two_readings():
    """``c1`` or ``c2`` with ``padding=1``: both give the head its 784, and they differ."""
    torch.manual_seed(0)
    model, x = TwoConvs(), torch.randn(2, 3, 16, 16)
    one, two = _twin_output(TwoConvs(p1=1), model, x), _twin_output(TwoConvs(p2=1), model, x)
    assert not torch.allclose(one, two, atol=1e-3)
    d = _inspect(model, x)
    assert d.fix is None and d.verified.status == "ambiguous"
    assert "`c1` (padding=1)" in d.hint and "`c2` (padding=1)" in d.hint and "wrong argument" in d.hint, d.hint
    assert any("in_features=576" in a for a in d.alternatives), d.alternatives


def test_equivalent_edits_still_get_one_verified_fix():
    """Near miss: dropping the transpose and permuting the conv's input back compute the same output."""
    torch.manual_seed(0)
    model, x = ExtraTranspose(), torch.randn(3, 7, 11)
    outcome = traced_forward(copy_model(model, None), (x,), {}, 0)
    found = [s for s in search(model, (x,), {}, 0, None, outcome.ctx, failed_at=location(outcome.ctx),
                               deadline=Budget(30)) if s.verdict.ok]
    kinds = {s.candidate.step.kind for s in found}
    assert {"replace-op", "permute-input"} <= kinds, [(s.candidate.step.kind, s.candidate.step.code) for s in found]
    drop = next(s for s in found if s.candidate.step.kind == "replace-op")
    permute = next(s for s in found if s.candidate.step.kind == "permute-input")
    assert same_meaning(model, [drop.candidate.step], [permute.candidate.step], (x,), {}, 0)
    d = _inspect(model, x)
    assert d.fix is not None and d.verified.status == "runs"
    fixed = apply_fixes(model, d.verified.steps)
    fixed.eval()
    with torch.no_grad():
        torch.testing.assert_close(fixed(x), _twin_output(ExtraTranspose(True), model, x))


def test_different_outputs_are_different_meanings():
    """Near miss for the comparison itself: the swap and the rule's chain differ; a fix and itself agree."""
    torch.manual_seed(0)
    model, x = PointTransform(), torch.randn(2, 3, 7)
    outcome = traced_forward(copy_model(model, None), (x,), {}, 0)
    found = [s for s in search(model, (x,), {}, 0, None, outcome.ctx, failed_at=location(outcome.ctx),
                               deadline=Budget(30)) if s.verdict.ok]
    step = found[0].candidate.step
    assert same_meaning(model, [step], [step], (x,), {}, 0)
