"""Round-7 audit of ``layerlab inspect``'s failure blame (cases in :mod:`tests.probe.audit_round7_models`).

Before this round 4 of the 15 got the right first fix, and the cross-attention einsum got a confident
wrong cause ("attn is laid out 'bhkq'", its fix a transpose of the attention weights). Now: the
einsum's value subscripts, the time embedding's missing trailing axes, the (E, 2) edge list, the head
reshape grouped by anchors instead of classes, the cosine similarity over the batch, the feature map
not flattened before the cat, the KV cache grown on the heads axis, the Unfold patch vector, the
channels-first flow grid — each checked against the hand-fixed model with the same weights — and, as
hints without a mechanical fix, the rotary table built for the model width and the unsorted lengths
of ``pack_padded_sequence``. Near misses where a rule must not give its fix come last.
"""

from __future__ import annotations

import linecache
import warnings

import pytest
import torch

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe import audit_round7_models as M

_HF = ("rotary", "siamese", "bert_float_ids")


def _inspect(model, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return layerlab.inspect(model, *inputs, backward=False)


def _failure(name, build=None):
    if name in _HF:
        pytest.importorskip("transformers", reason="this case is built from transformers blocks")
    model, inputs = (build or M.CASES[name])()
    report = _inspect(model, inputs)
    assert report.failure is not None and report.failure.diagnosis is not None, f"{name}: no diagnosis"
    return model, inputs, report.failure, report.failure.diagnosis


def _same_as_hand_fixed(name, model, inputs, steps):
    """The verified fix applied to a copy computes what the hand-fixed twin computes with its weights."""
    fixed = apply_fixes(model, steps)
    hand, hand_inputs = M.CASES[name](fixed=True)
    hand.load_state_dict(fixed.model.state_dict())  # set-arg rebuilds a layer: carry its new weights over
    torch.manual_seed(1)
    got = fixed(*inputs)
    torch.manual_seed(1)
    want = hand(*hand_inputs)
    got, want = (got, want) if isinstance(got, torch.Tensor) else (got[0], want[0])
    torch.testing.assert_close(got, want)


# (name, failing path, failing op or None, cause, fix's where (None: replace-op at the line holding
# `line_has`), fix's code, line_has)
EXPECTED = [
    ("unet_time", "", "add", "broadcast", None, "t[:, :, None, None]", "h = h + t"),
    ("gnn_edge_index", "", "mul", "layout", "", "edge_index.t()", None),
    ("anchor_head", "", "cat", "reshape-factor", None, "reshape(2, -1, 5)", "reshape(B, -1, last)"),
    ("siamese", "", "F.binary_cross_entropy_with_logits", "reduced-batch", None, "cosine_similarity(…, dim=1)",
     "F.cosine_similarity("),
    ("image_tabular", "", "cat", "rank", None, "tensors[0].flatten(1)", "torch.cat([f, self.tab(tab)]"),
    ("depthwise", "1.pw", None, "size", "1.pw", "in_channels=32", None),
    ("einsum", "", "einsum", "inner-dim", None, 'einsum("bhqk,bhkd->bhqd")', "torch.einsum(eq, attn, v)"),
    ("grayscale", "features.0", None, "rank", "features.0", "x.unsqueeze(1)", None),
    ("unfold", "proj", None, "size", "proj", "in_features=192", None),
    ("kv_cache", "", "matmul", "cat-dim", None, "cat(…, dim=2)", "k = torch.cat([cache[0], k]"),
    ("layernorm", "norm", None, "layout", "norm", "norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)", None),
    ("bert_float_ids", "bert.embeddings.word_embeddings", None, "dtype", "", "input_ids.long()", None),
    ("grid_sample", "", "F.grid_sample", "layout", None, "grid.permute(0, 2, 3, 1)", "F.grid_sample(img, grid"),
]


@pytest.mark.parametrize("name,path,op,cause,where,code,line_has", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_round7_blame_location_cause_and_verified_first_fix(name, path, op, cause, where, code, line_has):
    model, inputs, failure, d = _failure(name)
    assert failure.path == path
    assert (failure.op.op if failure.op is not None else None) == op
    assert d.cause == cause, d.message
    assert d.fix is not None and d.fix.code == code, d.hint
    if where is not None:
        assert d.fix.where == where
    else:  # a replace-op fix at the source line that holds the bug
        assert d.fix.kind == "replace-op"
        assert line_has in linecache.getline(d.fix.params["file"], d.fix.params["line"])
    assert d.verified is not None and d.verified.status == "runs", d.verified


@pytest.mark.parametrize("name", ["unet_time", "gnn_edge_index", "anchor_head", "siamese", "image_tabular",
                                  "depthwise", "einsum", "grayscale", "unfold", "kv_cache", "bert_float_ids",
                                  "grid_sample"])
def test_round7_verified_fix_computes_what_the_hand_fix_computes(name):
    model, inputs, _, d = _failure(name)
    _same_as_hand_fixed(name, model, inputs, d.verified.steps)


def test_einsum_blames_the_value_subscripts_not_the_attention_weights():
    _, _, _, d = _failure("einsum")
    assert "is 'bhkd', not 'bhqd'" in d.message
    assert "transpose" not in d.fix.code
    assert any(a.startswith("not a transpose of operand 0") for a in d.alternatives)


def test_kv_cache_fix_joins_keys_and_values_along_the_sequence():
    _, _, _, d = _failure("kv_cache")
    lines = [s.params["line"] for s in d.verified.steps]
    assert [s.code for s in d.verified.steps] == ["cat(…, dim=2)", "cat(…, dim=2)"] and len(set(lines)) == 2


def test_time_embedding_is_not_resized_to_the_map_width():
    _, _, _, d = _failure("unet_time")
    assert "out_features" not in d.hint and "out_features" not in d.fix.code


def test_rotary_table_built_for_the_model_width_names_the_head_dim_and_gives_no_slice():
    _, _, failure, d = _failure("rotary")
    assert failure.op is not None and failure.op.op == "mul"
    assert d.cause == "head-dim" and d.fix is None
    assert "64 = 4 heads × 16" in d.message and "head dim: 16" in d.hint
    assert any(a.startswith("not table[..., :16]") for a in d.alternatives)


def test_unsorted_lengths_get_enforce_sorted_false_never_a_sort_of_lengths_alone():
    _, _, failure, d = _failure("packed")
    assert failure.op is not None and "pack_padded_sequence" in failure.op.op
    assert d.cause == "order" and "[3, 5, 2, 4]" in d.message
    assert "enforce_sorted=False" in d.hint and "lengths.sort" not in d.hint
    assert d.fix is None  # a Python wrapper: the fix is stated, not verified
    assert all(a.startswith("not ") for a in d.alternatives if "lengths.sort" in a)
    hand, hand_inputs = M.CASES["packed"](fixed=True)
    assert hand(*hand_inputs).shape == (4, 2)  # the stated fix runs


def test_layernorm_names_the_norm_over_channels_height_and_width():
    _, _, _, d = _failure("layernorm")
    assert any("normalized_shape=[32, 8, 8]" in a for a in d.alternatives)


def test_unfold_patch_vector_is_not_transposed_back():
    _, _, _, d = _failure("unfold")
    assert "remove the transpose" not in d.hint and d.fix.kind == "set-arg"


# -- near misses ------------------------------------------------------------------------------------
def test_near_miss_time_embedding_as_wide_as_the_map_gets_no_trailing_axes():
    _, _, _, d = _failure("near_time", M.near_time_per_column)
    assert d.fix is None or "None" not in d.fix.code


def test_near_miss_flow_grid_with_the_pair_size_on_two_axes_gets_no_permute():
    _, _, failure, d = _failure("near_grid", M.near_grid_two_rows)
    assert failure.op.op == "F.grid_sample"
    assert d.fix is None and "cannot tell" in d.message


def test_near_miss_feature_map_for_a_pooled_head_is_not_flattened():
    _, _, _, d = _failure("near_pooled", M.near_image_tabular_pooled)
    assert d.cause == "rank" and d.fix is None
    assert "flatten" in d.hint and "pool" in d.hint
