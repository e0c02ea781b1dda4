"""Every registered diagnosis rule, on a real failing model: the diagnosis names the rule that answered.

One row per rule id (the table must list every rule of :func:`layerlab.engine.rule_registry.all_rules`):
a broken model from the corpora the rule tests already use, or from :mod:`tests.probe.rule_id_models`.
The model must raise in plain torch; layerlab's diagnosis must then carry that rule's id (``rule_id``),
so the id in a hint leads to the rule that wrote it.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

import layerlab
from layerlab.engine.rule_registry import all_rules

A4, A6, A7, A8 = ("tests.probe.audit_round4_models", "tests.probe.audit_round6_models",
                  "tests.probe.audit_round7_models", "tests.probe.audit_round8_models")
NM = "tests.probe.near_miss_models"
HF3 = "tests.probe.audit_round3_hf"
LOCAL = "tests.probe.rule_id_models"
HF_CASES = {(HF3, "c24_hf_float_labels"), (HF3, "c25_hf_bert_too_long"), (A4, "hf_onehot_labels"),
            (A4, "hf_vit_nhwc"), (A4, "hf_vit_gray")}

#: rule id → where its broken model comes from: ("corpus", name), (module, name) or ("round5", name)
CASES = {
    # input stage
    "hf/float-class-labels": (HF3, "c24_hf_float_labels"),
    "hf/one-hot-labels": (A4, "hf_onehot_labels"),
    "hf/sequence-too-long": (HF3, "c25_hf_bert_too_long"),
    "autograd/input-requires-grad": ("wav2vec2", None),
    # op stage: upstream causes, then the per-op rules
    "join/cat-after-upsample": (A4, "unet_odd"),
    "residual/strided-shortcut": (A6, "resnet_down"),
    "einsum/operand-labels": (A7, "einsum"),
    "layout/grid-channels-first": (A7, "grid_sample"),
    "rnn/pack-padded-lengths": (A7, "packed"),
    "join/unflattened-map": (A7, "image_tabular"),
    "join/reshape-factor": (A7, "anchor_head"),
    "batch/reduced-over-batch": (A7, "siamese"),
    "broadcast/missing-trailing-axes": (A7, "unet_time"),
    "layout/edge-index-transposed": (A7, "gnn_edge_index"),
    "cache/cat-grew-wrong-axis": (A7, "kv_cache"),
    "broadcast/table-for-model-width": (A7, "rotary"),
    "heads/sibling-head-width": (A8, "vae"),
    "loss/ctc-batch-first": (A8, "ctc_model"),
    "loss/regression-target-trailing-axis": (A8, "lstm_forecaster"),
    "dtype/mixed-operands": ("corpus", "float64_input_to_user_matmul"),
    "view/window-partition": (NM, "window_channels_first"),
    "view/new-shape": ("corpus", "view_wrong_element_count"),
    "join/stack-for-cat": (A4, "stack_vs_cat"),
    "join/squeezed-batch": (A4, "squeeze_batch1"),
    "join/cat-sizes": ("corpus", "cat_sizes_mismatch_other_dim_works"),
    "mask/masked-fill-dtype": ("corpus", "masked_fill_int64_causal_mask"),
    "mask/sdpa-mask": ("corpus", "sdpa_int64_attention_mask"),
    "batch/seq-first-operand": ("round5", "bmm"),
    "matmul/inner-dims": ("corpus", "q_matmul_k_without_transpose"),
    "einsum/letter-sizes": ("corpus", "einsum_subscript_clash"),
    "loss/float-class-target": (LOCAL, "float_class_target_op"),
    "loss/target-shape": (A4, "ce_btc"),
    "index/out-of-range": ("corpus", "gather_ignore_index"),
    "broadcast/sizes": ("corpus", "residual_width_mismatch"),
    "loss/per-step-logits": (A6, "gru_ce"),
    # module stage
    "input/tuple-return-value": (LOCAL, "tuple_into_linear"),
    "device/module-input": (LOCAL, "input_on_meta"),
    "dtype/module-input": ("corpus", "float64_input_to_float32_linear"),
    "linear/in-features": ("corpus", "linear_after_flatten_in_features"),
    "layout/video-frames-first": (LOCAL, "conv3d_frames_first"),
    "conv/in-channels": ("corpus", "conv2d_fed_nhwc"),
    "rnn/trailing-one-ids": ("round5", "emb_trailing_one"),
    "rnn/initial-state": ("corpus", "lstm_h0_batch_first"),
    "rnn/input-size": ("corpus", "lstm_batch_first_fed_conv_features"),
    "attention/mixed-layouts": ("round5", "seq2seq"),
    "attention/mha-contract": ("corpus", "mha_batch_first_mismatch"),
    "mask/transformer-integer-mask": (LOCAL, "transformer_integer_mask"),
    "norm/layer-norm-shape": ("corpus", "layernorm_on_nchw"),
    "norm/batch-norm-features": ("corpus", "batchnorm2d_num_features"),
    "norm/group-norm-channels": ("corpus", "groupnorm_channels_last"),
    "embedding/ids": ("corpus", "embedding_index_out_of_range"),
    "embedding/bag-lengths-as-offsets": (A8, "bag_model"),
    "upstream/pixel-shuffle-channels": (A6, "pixelshuffle"),
    "upstream/unflatten-size": (LOCAL, "unflatten_wrong_size"),
    "upstream/pool-map-too-small": (A4, "pool_to_zero"),
    "loss/float-class-target-module": (LOCAL, "float_class_target_module"),
    "loss/target-shape-module": (LOCAL, "target_shape_module"),
    "loss/per-step-logits-module": (LOCAL, "per_step_logits_module"),
    "layout/pixels-channels-last": (A4, "hf_vit_nhwc"),
    "channels/gray-pixels": (A4, "hf_vit_gray"),
    "shape/layer-arithmetic": (LOCAL, "pool_padding_over_half_kernel"),
    # refine stage
    "order/sibling-call-order": (A4, "modulelist_index"),
    "size/built-for-other-image-size": (A4, "vae_size"),
    "batch/chunked-batch": (A6, "vae_chunk"),
    "mask/mask-before-prefix-token": (A6, "cls_mask"),
    "size/short-token-ids": (A6, "textcnn_short"),
    "layout/unfold-patch-features": (A7, "unfold"),
    "size/overlapping-windows": (A8, "patch_forecaster"),
    "layout/flat-image": (A8, "gan"),
}


def _build(source, name):
    """``(model, args, kwargs)`` of the broken model."""
    if (source, name) in HF_CASES or source == "wav2vec2":
        pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    if source == "corpus":
        from tests.probe.corpus import CASES as CORPUS

        case = next(c for c in CORPUS if c.name == name)
        args, kwargs = case.inputs()
        return case.model(), tuple(args), dict(kwargs)
    if source == "round5":
        from tests.probe.audit_round5_models import CASES as R5, inputs

        return R5[name](), inputs(name), {}
    if source == "wav2vec2":
        from tests.probe.test_leaf_input_rule import _wav2vec2

        return _wav2vec2(), (torch.randn(2, 400).requires_grad_(True),), {}
    built = importlib.import_module(source).CASES[name]()
    if source == HF3:  # (model, inputs, hand-fixed twin)
        model, inputs, _ = built
    elif len(built) == 3:
        return built
    else:
        model, inputs = built
    if isinstance(inputs, dict):
        return model, (), inputs
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), {}


def test_the_table_lists_every_registered_rule():
    assert set(CASES) == {r.id for r in all_rules()}


@pytest.mark.slow
@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_the_rule_that_answers_a_real_failure_is_named_in_the_diagnosis(rule_id):
    model, args, kwargs = _build(*CASES[rule_id])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception):  # the truth: plain torch raises on this model
            model(*args, **kwargs)
        report = layerlab.inspect(model, *args, forward_kwargs=kwargs or None, backward=False, ops=True, fix=False)
    assert report.failure is not None and report.failure.diagnosis is not None, rule_id
    d = report.failure.diagnosis
    assert d.rule_id == rule_id, f"{rule_id}: answered by {d.rule_id}: {d.message}"
    assert d.severity == "error" and "§" not in (d.rule or "") + d.message + (d.hint or "")
