"""Parameters as built are the author's intent: an upstream layer argument that keeps every
parameter's shape ranks above resizing the failing layer, and no size is invented.

Each case has a hand-fixed twin in plain torch (tests/engine/ambiguity_models.py); the first fix
``layerlab.inspect`` offers, applied to a copy, must compute the twin on the same weights.
"""

from __future__ import annotations

import torch

import layerlab
from layerlab.engine.upstream_args import upstream_candidates
from layerlab.probe.fixes import apply_fixes
from layerlab.probe.verify_fix import copy_model, traced_forward
from tests.engine.ambiguity_models import StridedImage, VideoHead, VideoPool, WrongHead


def _diagnosis(model, x):
    return layerlab.inspect(model, x, backward=False).failure.diagnosis


def _computes_the_twin(model, steps, twin, x):
    fixed = apply_fixes(model, steps)
    twin.load_state_dict(fixed.model.state_dict(), strict=True)
    fixed.eval()
    twin.eval()
    with torch.no_grad():
        torch.testing.assert_close(fixed(x), twin(x))


def test_conv_padding_ranks_before_the_heads_in_features():
    torch.manual_seed(0)
    model, x = VideoHead(), torch.randn(2, 3, 5, 14, 14)
    d = _diagnosis(model, x)
    assert d.fix is not None and d.fix.code == "padding=1" and d.fix.where == "conv1", (d.fix, d.hint)
    assert d.verified.status == "runs"
    assert any("in_features=1728" in a for a in d.alternatives) or "in_features=1728" in d.hint, d.alternatives
    _computes_the_twin(model, d.verified.steps, VideoHead(padding=1), x)


def test_the_video_conv_padding_is_the_fix_and_the_resize_the_other_reading():
    """588 features for a head built for 1024: ``conv1`` ``padding=1`` first, ``in_features=588`` named."""
    torch.manual_seed(0)
    model, x = VideoPool(), torch.randn(2, 3, 8, 16, 16)
    d = _diagnosis(model, x)
    assert d.fix is not None and (d.fix.where, d.fix.code) == ("conv1", "padding=1"), d.hint
    assert d.verified.status == "runs" and "in_features=588" in d.alternatives[0], d.alternatives
    _computes_the_twin(model, d.verified.steps, VideoPool(conv_padding=1), x)


def test_a_pool_padding_that_only_happens_to_fit_is_not_proposed():
    """Near miss: the pool's ``padding=1`` gives 1024 too, but an even kernel has no size-keeping padding."""
    torch.manual_seed(0)
    model, x = VideoPool(), torch.randn(2, 3, 8, 16, 16)
    outcome = traced_forward(copy_model(model, None), (x,), {}, 0)
    assert [(c.step.where, c.step.code) for c in upstream_candidates(model, (x,), {}, 0, None, outcome.ctx)] == [
        ("conv1", "padding=1")]


def test_a_stride_that_halves_the_map_is_undone():
    torch.manual_seed(0)
    model, x = StridedImage(), torch.randn(2, 3, 9, 9)
    d = _diagnosis(model, x)
    assert d.fix is not None and d.fix.code == "stride=1", (d.fix, d.hint)
    _computes_the_twin(model, d.verified.steps, StridedImage(stride=1), x)


def test_no_size_is_invented_when_no_argument_reaches_the_built_size():
    """Near miss: 144 features into ``Linear(150)``; no padding/stride of the conv gives 150."""
    torch.manual_seed(0)
    model, x = WrongHead(), torch.randn(2, 3, 8, 8)
    outcome = traced_forward(copy_model(model, None), (x,), {}, 0)
    assert upstream_candidates(model, (x,), {}, 0, None, outcome.ctx) == []
    d = _diagnosis(model, x)
    assert d.fix is not None and d.fix.code == "in_features=144", (d.fix, d.hint)
    assert d.verified.status == "runs"
    _computes_the_twin(model, d.verified.steps, WrongHead(in_features=144), x)


def test_every_proposed_value_gives_exactly_the_built_size():
    torch.manual_seed(0)
    model, x = VideoHead(), torch.randn(2, 3, 5, 14, 14)
    outcome = traced_forward(copy_model(model, None), (x,), {}, 0)
    found = upstream_candidates(model, (x,), {}, 0, None, outcome.ctx)
    assert [c.step.code for c in found] == ["padding=1"] and found[0].keeps_shapes
    fixed = apply_fixes(model, [found[0].step])
    with torch.no_grad():
        assert torch.relu(fixed.model.conv1(x)).flatten(1).shape[1] == model.head.in_features


def test_the_users_model_keeps_its_arguments():
    torch.manual_seed(0)
    model, x = VideoHead(), torch.randn(2, 3, 5, 14, 14)
    _diagnosis(model, x)
    assert model.conv1.padding == (0, 0, 0)
