"""Near misses of the round-8 failure-blame rules (cases in :mod:`tests.probe.near_miss_round8_models`).

Each case raises the torch error a round-8 rule was written for, but its right fix is another one.
Before this review 7 of 9 got a wrong first fix from the rule: 5 verified "runs" while computing
something else than the hand-fixed twin (a VAE critic and a CVAE's condition projection taken as the
latent's witness, global EmbeddingBag starts read as lengths, a flat channels-last image and a flat
4 × 16 mel patch viewed as square channels-first maps), 2 a CTC transpose of log-probs that were
time-first already. Now none gives its wrong fix. Each test checks with plain torch that the wrong
reading really computes something else (or the truth runs), then what inspect says.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import layerlab
from layerlab.probe.fixes import apply_fixes
from layerlab.probe.report import FixStep
from tests.probe import near_miss_round8_models as M


def _diagnosis(name):
    torch.manual_seed(0)
    model, inputs = M.CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = layerlab.inspect(model, *inputs, backward=False)
    assert report.failure is not None, f"{name} ran"
    return model, inputs, report.failure.diagnosis


# (case, the wrong first fix the rule gave before)
WRONG_FIRST_FIX = [
    ("ctc_time_first_mask_axis", "log_probs.transpose(0, 1)"),
    ("ctc_time_first_flat_targets", "log_probs.transpose(0, 1)"),
    ("latent_with_critic", "out_features=32"),
    ("cvae_conditioned", "out_features=8"),
    ("bag_sliced_offsets", "torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])"),
    ("flat_channels_last", "x.view(-1, 3, 4, 4)"),
    ("flat_spectrogram", "x.view(-1, 1, 8, 8)"),
]


@pytest.mark.parametrize("name,wrong", WRONG_FIRST_FIX, ids=[w[0] for w in WRONG_FIRST_FIX])
def test_the_rules_wrong_fix_is_not_offered(name, wrong):
    hand, inputs = M.CASES[name](fixed=True)
    hand(*inputs)  # the truth runs
    _, _, d = _diagnosis(name)
    assert d is not None
    assert d.fix is None or d.fix.code != wrong, d.hint


def test_ctc_lengths_summed_over_the_batch_axis_are_named_not_transposed():
    _, (feats, mask, targets, tgt_lens), d = _diagnosis("ctc_time_first_mask_axis")
    assert mask.sum(1).numel() == feats.shape[0] and mask.sum(0).numel() == feats.shape[1]
    assert d.fix is None and d.cause == "size" and "one entry per time step" in d.message
    assert "mask.sum(0)" in d.hint


def test_a_critic_of_h_is_no_witness_for_the_latent_width():
    model, (h,), d = _diagnosis("latent_with_critic")
    wrong = apply_fixes(model, [FixStep("set-arg", "mu", "out_features=32", {"name": "out_features", "value": 32})])
    assert wrong(h).shape == (5, 32)  # it runs, with a latent of the wrong width
    hand, _ = M.latent_with_critic(fixed=True)
    assert hand(h).shape == (5, 4)
    assert d.fix is None and d.cause == "ambiguous"
    assert "logvar out_features=4" in d.hint and "mu out_features=32" in d.hint


def test_cvae_resizes_the_head_the_decoder_takes():
    model, inputs, d = _diagnosis("cvae_conditioned")
    assert d.fix is not None and d.fix.where == "logvar" and d.fix.code == "out_features=4"
    assert d.verified is not None and d.verified.status == "runs"
    fixed = apply_fixes(model, d.verified.steps)
    hand, _ = M.cvae_conditioned(fixed=True)
    hand.load_state_dict(fixed.model.state_dict())
    torch.manual_seed(1)
    got = fixed(*inputs)
    torch.manual_seed(1)
    torch.testing.assert_close(got, hand(*inputs))


def test_global_starts_of_a_slice_are_not_read_as_lengths():
    weight, ids = torch.randn(50, 8), torch.arange(9)
    as_lengths = F.embedding_bag(ids, weight, torch.tensor([0, 2, 5]), mode="sum")
    as_starts = F.embedding_bag(ids, weight, torch.tensor([0, 1, 2]), mode="sum")
    assert not torch.allclose(as_lengths, as_starts)
    _, _, d = _diagnosis("bag_sliced_offsets")
    assert d.fix is None and d.cause == "ambiguous" and "offsets - offsets[0]" in d.hint and "cumsum" in d.hint


@pytest.mark.parametrize("name,wrong,right", [
    ("flat_channels_last", lambda x: x.view(-1, 3, 4, 4), lambda x: x.view(-1, 4, 4, 3).permute(0, 3, 1, 2)),
    ("flat_spectrogram", lambda x: x.view(-1, 1, 8, 8), lambda x: x.view(-1, 1, 4, 16)),
])
def test_a_flat_model_input_gets_no_square_view(name, wrong, right):
    model, (x,), d = _diagnosis(name)
    out_wrong, out_right = model.conv(wrong(x)), model.conv(right(x))
    assert out_wrong.shape != out_right.shape or not torch.allclose(out_wrong, out_right)
    assert d.fix is None and d.cause == "rank" and "x.view(-1," in d.hint


def test_half_overlapping_windows_keep_the_linear_size_fix():
    """step 2 < size 4 by design: no step = size makes 7 patches, so the window rule stays silent."""
    model, inputs, d = _diagnosis("windows_stride_two")
    assert d.fix is not None and d.fix.code == "in_features=184" and d.verified.status == "runs"
    fixed = apply_fixes(model, d.verified.steps)
    hand, _ = M.windows_stride_two(fixed=True)
    hand.load_state_dict(fixed.model.state_dict())
    torch.testing.assert_close(fixed(*inputs), hand(*inputs))


def test_a_flag_set_on_a_tensor_made_from_the_input_and_a_parameter_is_not_blamed_on_the_input():
    _, _, d = _diagnosis("leaf_from_both")
    assert d is None or d.cause != "input-requires-grad"
