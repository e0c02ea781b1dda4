"""Near misses of the round 5–7 failure-blame rules (cases in :mod:`tests.probe.near_miss_models`).

Each case raises the torch error a rule was written for, but its right fix is another one. Before the
review, 16 of 16 fired: 11 gave a wrong first fix that the verification re-ran and called "runs"
(the fixed model computed something else than the hand-fixed one), 2 a wrong fix that did not run, 3
a wrong hint. Now none gives its wrong fix. Each test checks first that the wrong fix really runs or
differs from the truth with plain torch where it matters, then that inspect does not offer it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import layerlab
from tests.probe import near_miss_models as M


def _diagnosis(name):
    model, inputs = M.CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = layerlab.inspect(model, *inputs, backward=False)
    assert report.failure is not None and report.failure.diagnosis is not None, f"{name}: no diagnosis"
    return report.failure.diagnosis


def _hand_fixed_runs(name):
    model, inputs = M.CASES[name](fixed=True)
    return model(*inputs)


# (case, the rule's cause, the wrong fix it gave before)
WRONG_FIRST_FIX = [
    ("trailing_query_mask", "broadcast", "m[:, :, None, None]"),
    ("edge_coordinates", "layout", "edge_index.t()"),
    ("cache_two_segments", "cat-dim", "cat(…, dim=0)"),
    ("cache_wide_query", "cat-dim", "cat(…, dim=1)"),
    ("einsum_value_from_query", "inner-dim", 'einsum("bhqk,bhqd->bhqd")'),
    ("reduced_unbatched", "reduced-batch", "cosine_similarity(…, dim=1)"),
    ("cat_wrong_anchor_count", "reshape-factor", "reshape(2, -1, 6)"),
    ("prefix_second_sequence", "mask-shape", "torch.cat([key_padding_mask, key_padding_mask.new_zeros(2, 3)], dim=1)"),
    ("short_seq_first_ids", "short-sequence", "F.pad(ids, (0, 1), value=0)"),
    ("split_two_views", "split-axis", "chunk(2, dim=-1)"),
    ("grid_three_coords", "layout", "grid.permute(0, 2, 3, 1)"),
    ("shortcut_fpn_merge", "shortcut-stride", "stride=2"),
    ("sequence_target_padded", "per-step-logits", "out[:, -1]"),
]


@pytest.mark.parametrize("name,cause,wrong", WRONG_FIRST_FIX, ids=[w[0] for w in WRONG_FIRST_FIX])
def test_the_rules_wrong_fix_is_not_the_first_suggestion(name, cause, wrong):
    _hand_fixed_runs(name)  # the truth runs
    d = _diagnosis(name)
    assert d.fix is None or d.fix.code != wrong, d.hint
    assert d.verified is None or d.verified.status != "runs", d.verified


# -- the wrong fixes compute something else (plain torch, same tensors) --------------------------------
def test_trailing_axes_on_a_query_mask_would_mask_heads_not_queries():
    scores = torch.randn(2, 4, 4, 6)
    qmask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    assert not torch.equal(scores * qmask[:, :, None, None], scores * qmask[:, None, :, None])
    d = _diagnosis("trailing_query_mask")
    assert "leading" not in d.message


def test_relabelled_value_sums_the_attention_alone():
    attn, v = torch.rand(2, 2, 5, 7).softmax(-1), torch.randn(2, 2, 5, 8)
    wrong = torch.einsum("bhqk,bhqd->bhqd", attn, v)
    assert torch.allclose(wrong, v)  # each row of weights sums to 1: the "attention" returns v itself
    d = _diagnosis("einsum_value_from_query")
    assert d.fix is None and "wrong tensor" in d.message and "'k' is 7 in operand 0 and 5 in operand 1" in d.message


def test_keep_columns_for_a_second_sequence_would_attend_to_its_padding():
    model, (question, context) = M.prefix_second_sequence()
    keep = torch.cat([question == 0, torch.zeros(2, 3, dtype=torch.bool)], dim=1)
    truth = torch.cat([question == 0, context == 0], dim=1)
    assert not torch.equal(keep, truth)
    d = _diagnosis("prefix_second_sequence")
    assert d.cause == "mask-shape" and "CLS" not in d.message


def test_padding_seq_first_ids_pads_the_batch():
    d = _diagnosis("short_seq_first_ids")
    assert d.fix is None and "seq-first (T, N)" in d.hint and "ids.t()" in d.hint


def test_last_step_of_a_padded_row_is_padding():
    model, (ids, _) = M.sequence_target_padded()
    assert (ids[:, -1] == 0).any()  # out[:, -1] reads a padding step of rows 0 and 2
    d = _diagnosis("sequence_target_padded")
    assert d.cause == "per-step-logits" and d.fix is None and "last real step" in d.hint


def test_strided_lateral_in_an_fpn_merge_runs_at_the_coarse_size():
    model, inputs = M.shortcut_fpn_merge(fixed=True)
    assert model(*inputs).shape == (2, 16, 16, 16)  # the truth keeps c4's resolution; stride=2 gives 8 × 8
    assert _diagnosis("shortcut_fpn_merge").cause != "shortcut-stride"


# -- hints that were wrong: now they name what is seen -------------------------------------------------
def test_a_token_sequence_joined_with_a_vector_is_repeated_not_flattened():
    d = _diagnosis("cat_sequence_with_vector")
    assert d.fix is None and "flatten the map" not in (d.hint or "")
    assert "expand(-1, 5, -1)" in d.hint and "12 = 8 + 4" in d.message


def test_a_conv_map_scaled_by_a_wide_linear_is_not_called_heads():
    d = _diagnosis("head_dim_not_heads")
    assert d.cause != "head-dim" and "heads ×" not in d.message


def test_a_channels_first_map_in_a_window_partition_is_not_padded_on_its_channels():
    d = _diagnosis("window_channels_first")
    assert d.fix is None and not d.hint.startswith("pad") and "permute(0, 2, 3, 1)" in d.hint
    assert "keeps axis 3 (14)" in d.message


def test_a_grid_not_of_the_image_size_gets_no_permute_fix():
    d = _diagnosis("grid_three_coords")
    assert d.fix is None and "cannot tell" in d.message


def test_the_hand_fixed_twins_compute_their_truth():
    """The twins are what the tests above call the truth: each runs, and the grid one is the 2-D sample."""
    for name in M.CASES:
        _hand_fixed_runs(name)
    model, (img, pts) = M.grid_three_coords(fixed=True)
    torch.testing.assert_close(model(img, pts), F.grid_sample(img, pts[..., :2], align_corners=False))
