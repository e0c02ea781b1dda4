"""Third audit of ``inspect``'s verdicts: 25 realistic broken models (forum-style one-line bugs),
graded on the blamed location, the cause, the exact first fix, and — where the fix is mechanical —
that the verified fix computes what the hand-fixed model computes on the same weights.

The models live in audit_round3_models.py (layers), audit_round3_ops.py (ops of the model's own
code, whose fixes name their source lines) and audit_round3_hf.py (Hugging Face models from tiny
configs). Where a tempting fix exists that would run with the wrong semantics, ``not_first`` names
it and the test asserts it is not the first suggestion.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe import audit_round3_models as M
from tests.probe import audit_round3_ops as O


@dataclass
class Expect:
    where: str                      # the failing module's path ("" with ``op``: the model's own code)
    cause: str
    fix: Optional[str]              # the first fix's code, exactly; None: no mechanical fix
    says: Tuple[str, ...] = ()      # phrases the explanation (message + hint) must contain
    op: Optional[str] = None        # the op that raised
    not_first: Tuple[str, ...] = ()  # tempting fixes that would run with the wrong semantics
    #: the hand-fixed model for fixes that change a layer's size (new weights): built here, then
    #: given the verified copy's weights, so both compute with the same numbers
    resized: Optional[Callable[[], nn.Module]] = None
    then: Tuple[str, ...] = field(default_factory=tuple)  # codes of the verification's later steps


def _resized(build, **changes):
    def make():
        model = build()
        for path, module in changes.items():
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, name, module)
        return model
    return make


EXPECT = {
    # the head was built for a padded conv (28 -> 28 -> 14): the conv's padding=1 keeps every
    # parameter as built and ranks before resizing the head (in_features=1352, the other reading)
    "c01_flatten_linear": Expect("fc", "size", "padding=1", ("1568", "1352", "in_features=1352"),
                                 resized=_resized(lambda: M.SmallCNN(8 * 14 * 14), conv=nn.Conv2d(1, 8, 3, padding=1))),
    "c02_nhwc_conv2d": Expect("conv", "layout", "x.permute(0, 3, 1, 2)", ("channels-last",), not_first=("in_channels=24",)),
    "c03_conv1d_btc": Expect("conv", "layout", "x.transpose(1, 2)", ("proj (Linear) puts its features last",),
                             not_first=("in_channels=50",)),
    "c04_gru_h0_swapped": Expect("gru", "layout", "h0.transpose(0, 1)", ("batch is dim 1 even with batch_first",)),
    "c05_mha_seq_first": Expect("mha", "layout", "batch_first=True", ("batch_first=False",)),
    "c06_kpm_int_meaning": Expect("mha", "mask-dtype", "mask == 0", ("int64", "1 reads as keep"), not_first=("mask.bool()",)),
    "c07_causal_mask_size": Expect("layer.self_attn", "mask-shape", "src_mask[:10, :10]",
                                   ("causal mask for 16 positions", "has 10")),
    "c08_embedding_float_ids": Expect("emb", "dtype", "ids.long()", ("integer ids",)),
    "c09_double_input": Expect("fc1", "dtype", "x.to(torch.float32)", ("float64",)),
    "c10_view_after_permute": Expect("", "non-contiguous", "reshape", ("permute(0, 2, 1)",), op="view"),
    "c11_cat_wrong_dim": Expect("", "cat-dim", "cat(…, dim=1)", ("dim 1: [8, 16]",), op="cat"),
    "c12_residual_width": Expect("", "broadcast", "out_features=32", ("32 vs 64", "came from `ff` (Linear)"), op="add",
                                 resized=_resized(O.ResBlock, ff=nn.Linear(32, 32))),
    "c13_bmm_transpose": Expect("", "inner-dim", "b.transpose(-2, -1)", ("(16) must equal", "(10)"), op="bmm"),
    "c14_einsum_layout": Expect("", "inner-dim", "k.transpose(1, 2)", ("k is laid out 'bkhd'",), op="einsum",
                                not_first=("q.transpose(1, 2)",)),
    "c15_embedding_oob": Expect("emb", "index-range", "num_embeddings=51", ("ids 0..49", "0..50"),
                                resized=_resized(M.TokenModel, emb=nn.Embedding(51, 8))),
    "c16_conv3d_btchw": Expect("conv", "layout", "x.transpose(1, 2)", ("(N, T, C, H, W)",), not_first=("in_channels=5",)),
    "c17_conv1d_missing_channel": Expect("conv", "rank", "x.unsqueeze(1)", ("lacking the channel dim",),
                                         not_first=("in_channels=4",)),
    "c18_pool_to_zero": Expect("11", "size", None, ("1×1 map", "8×8 → 4×4", "16×16", "AdaptiveAvgPool2d")),
    "c19_convtranspose_odd": Expect("", "size", "output_size=[15, 15]", ("up (ConvTranspose2d)", "[1, 1]"), op="cat",
                                    not_first=("cat(…, dim=2)",)),
    "c20_pixelshuffle": Expect("shuffle", "size", "out_channels=12", ("6 channels", "2² = 4", "conv (Conv2d)"),
                               resized=_resized(M.Upsampler, conv=nn.Conv2d(3, 12, 3, padding=1))),
    "c21_unflatten": Expect("1", "size", "out_features=1024", ("16 · 8 · 8 = 1024", "512"),
                            resized=lambda: nn.Sequential(nn.Linear(10, 1024), nn.Unflatten(1, (16, 8, 8)),
                                                          nn.ConvTranspose2d(16, 3, 4, 2, 1))),
}

HF_EXPECT = {
    "c22_hf_bert_float_ids": Expect("embeddings.word_embeddings", "dtype", "input_ids.long()", ("integer ids",)),
    "c23_hf_vit_nhwc": Expect("embeddings.patch_embeddings", "layout", "pixel_values.permute(0, 3, 1, 2)",
                              ("channels-last",), not_first=("num_channels=16",)),
    "c24_hf_float_labels": Expect("", "loss-target", "labels.long()", ("labels are float", "multi_label_classification"),
                                  op="F.binary_cross_entropy_with_logits"),
    "c25_hf_bert_too_long": Expect("embeddings", "sequence-length", "input_ids[:, :32]",
                                   ("40 tokens", "max_position_embeddings = 32"), op="expand"),
}

CASES = {**M.CASES, **O.CASES}


def _call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _main(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def _grade(name: str, expect: Expect, build) -> None:
    broken, inputs, hand = build()
    report = layerlab.inspect(broken, *(() if isinstance(inputs, dict) else inputs), backward=False,
                              **(inputs if isinstance(inputs, dict) else {}))
    failure = report.failure
    assert failure is not None, f"{name}: the forward should fail"
    assert failure.path == expect.where, failure
    if expect.op is not None:
        assert failure.op is not None and failure.op.op == expect.op, failure.op
    d = failure.diagnosis
    assert d is not None, f"{name}: no diagnosis for {failure.message}"
    assert d.cause == expect.cause, d
    said = f"{d.message} {d.hint}"
    for phrase in expect.says:
        assert phrase in said, f"{name}: {phrase!r} not in {said!r}"
    if expect.fix is None:
        assert d.fix is None, d.fix
        return
    assert d.fix is not None and d.fix.code == expect.fix, d.fix
    for tempting in expect.not_first:
        assert tempting not in d.fix.code and tempting not in (d.hint or "").split(" — ")[0], d.hint
    assert d.verified is not None and d.verified.status == "runs", d.verified
    assert tuple(s.code for s in d.verified.steps[1:]) == expect.then, d.verified.steps
    fixed = apply_fixes(broken, d.verified.steps)
    if expect.resized is not None:  # a layer's size changed: the hand-fixed model gets the copy's weights
        hand = expect.resized()
        hand.load_state_dict(fixed.model.state_dict())
    with torch.no_grad():
        got = _main(_call(fixed, inputs))
        want = _main(_call(hand, inputs))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_audit_round3(name):
    _grade(name, EXPECT[name], CASES[name])


@pytest.mark.parametrize("name", sorted(HF_EXPECT))
def test_audit_round3_hugging_face(name):
    pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    from tests.probe import audit_round3_hf as H

    if name == "c25_hf_bert_too_long":
        _too_long(HF_EXPECT[name], H.CASES[name])
        return
    _grade(name, HF_EXPECT[name], H.CASES[name])


def _too_long(expect: Expect, build) -> None:
    """Truncation's hand fix is the same model on the first 32 tokens."""
    broken, (ids,), _ = build()
    report = layerlab.inspect(broken, ids, backward=False)
    d = report.failure.diagnosis
    assert report.failure.path == expect.where and report.failure.op.op == expect.op
    assert d.cause == expect.cause and d.fix.code == expect.fix, d
    assert all(p in f"{d.message} {d.hint}" for p in expect.says), d
    assert d.alternatives and d.alternatives[0].startswith("not a larger max_position_embeddings")
    assert d.verified.status == "runs"
    with torch.no_grad():
        torch.testing.assert_close(apply_fixes(broken, d.verified.steps)(ids).last_hidden_state,
                                   broken(ids[:, :32]).last_hidden_state)


def test_random_square_mask_is_not_cropped():
    """Only a causal mask's corner is the shorter sequence's mask: any other oversized mask gets
    no slicing fix (it would run and attend with the wrong pattern)."""
    torch.manual_seed(0)
    m = M.CausalEnc()
    m.causal = torch.rand(16, 16) > 0.5
    d = layerlab.inspect(m, torch.randn(2, 10, 32), backward=False).failure.diagnosis
    assert d.cause == "mask-shape" and d.fix is None


def test_bce_class_indices_outside_hugging_face_offers_no_cast():
    """Plain BCE-with-logits on class indices: cross-entropy or a one-hot target — layerlab cannot tell which."""
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x, y):
            return nn.functional.binary_cross_entropy_with_logits(self.fc(x), y)

    d = layerlab.inspect(Head(), torch.randn(2, 4), torch.tensor([0.0, 2.0]), backward=False).failure.diagnosis
    assert d.cause == "loss-target" and d.fix is None
    assert "F.cross_entropy(logits, target.long())" in d.hint and "F.one_hot" in d.hint


def test_upsampled_map_larger_than_skip_gets_no_output_size():
    """output_size can only add rows a stride dropped; a larger upsampled map is another bug."""
    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)

        def forward(self, x, skip):
            return torch.cat([self.up(x), skip], 1)

    d = layerlab.inspect(Up(), torch.randn(1, 4, 8, 8), torch.randn(1, 4, 15, 15), backward=False).failure.diagnosis
    assert d.fix is None and "output_size" not in (d.hint or "")


def test_hugging_face_problem_type_mutation_is_undone_in_the_chain():
    """HF stores problem_type on the config during the call; inspect puts it back, so the model as
    handed back needs only labels.long()."""
    pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    from tests.probe import audit_round3_hf as H

    broken, inputs, _ = H.CASES["c24_hf_float_labels"]()
    fresh = copy.deepcopy(broken)
    d = layerlab.inspect(broken, backward=False, **inputs).failure.diagnosis
    # HF stored "multi_label_classification" on the config during the run; inspect put back what was there
    assert broken.config.problem_type is None
    fixed = apply_fixes(fresh, d.verified.steps[:1])
    with torch.no_grad():
        out = fixed(**inputs)
    assert fixed.model.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, nn.functional.cross_entropy(out.logits, inputs["labels"].long()))


def test_a_problem_type_left_by_the_users_earlier_call_is_reset_by_the_fix():
    """The user's own earlier forward with float labels left multi_label_classification on the config;
    now the labels are class indices: the fix resets problem_type, and inspect leaves it as it found it."""
    pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    from tests.probe import audit_round3_hf as H

    model, inputs, _ = H.CASES["c24_hf_float_labels"]()
    model.config.problem_type = "multi_label_classification"
    inputs = dict(inputs, labels=inputs["labels"].long())
    d = layerlab.inspect(model, backward=False, **inputs).failure.diagnosis
    assert d.cause == "loss-target" and d.fix.code == "config.problem_type='single_label_classification'"
    assert d.verified.status == "runs" and d.verified.then == []
    assert model.config.problem_type == "multi_label_classification"  # handed back as it came
    fixed = apply_fixes(copy.deepcopy(model), d.verified.steps)
    with torch.no_grad():
        out = fixed(**inputs)
    torch.testing.assert_close(out.loss, nn.functional.cross_entropy(out.logits, inputs["labels"]))


def test_too_long_cuts_the_attention_mask_with_the_ids():
    """Cutting input_ids alone would leave a 40-long mask beside 32 tokens: every per-token input is cut."""
    pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    from tests.probe import audit_round3_hf as H

    broken, (ids,), _ = H.CASES["c25_hf_bert_too_long"]()
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0  # padding inside the first 32: a misaligned mask would change the output
    d = layerlab.inspect(broken, backward=False, input_ids=ids, attention_mask=mask).failure.diagnosis
    assert d.fix.code == "input_ids[:, :32], attention_mask[:, :32]"
    with torch.no_grad():
        got = apply_fixes(broken, d.verified.steps)(input_ids=ids, attention_mask=mask).last_hidden_state
        want = broken(input_ids=ids[:, :32], attention_mask=mask[:, :32]).last_hidden_state
    torch.testing.assert_close(got, want)
