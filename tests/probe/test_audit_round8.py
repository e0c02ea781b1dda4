"""Round-8 audit of ``layerlab inspect``'s failure blame (cases in :mod:`tests.probe.audit_round8_models`).

Before this round 4 of the 15 got the right first fix, and the PatchTST-style forecaster got a
confident wrong one, *verified*: ``in_features=1360`` for a head fed 85 overlapping windows where the
unfold's step should make 8 patches. Now: the overlapping unfold is named with both readings and no
size; the CTC log-probs get their transpose, the EmbeddingBag lengths become offsets, the forecast
target loses its trailing axis, the VAE's logvar head gets the latent width its decoder takes, the
GAN's flat output is viewed as the image — each checked against the hand-fixed model with the same
weights. The backbone fed 32 px, the decoder without output_padding, the FPN upsampled by 4, the
embeddings looked up by row and the ViT fed small images are strict xfails naming their first fix.
Near misses where a new rule must stay silent (or name both readings without a fix) come last.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe import audit_round8_models as M

_HF = ("bert_bilstm", "bert_vocab", "vit_small")


def _inspect(model, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return layerlab.inspect(model, *inputs, backward=False)


def _failure(build, name=""):
    if name in _HF:
        pytest.importorskip("transformers", reason="this case is built from transformers blocks")
    torch.manual_seed(0)
    model, inputs = build()
    report = _inspect(model, inputs)
    assert report.failure is not None and report.failure.diagnosis is not None, f"{name}: no diagnosis"
    return model, inputs, report.failure, report.failure.diagnosis


def _diagnosis(build, name=""):
    """The diagnosis, or ``None`` where no rule spoke (torch's message shown alone)."""
    if name in _HF:
        pytest.importorskip("transformers", reason="this case is built from transformers blocks")
    torch.manual_seed(0)
    model, inputs = build()
    failure = _inspect(model, inputs).failure
    assert failure is not None, f"{name} ran"
    return failure.diagnosis


def _same_as_hand_fixed(name, model, inputs, steps):
    """The verified fix applied to a copy computes what the hand-fixed twin computes with its weights."""
    fixed = apply_fixes(model, steps)
    hand, _ = M.CASES[name](fixed=True)  # the twin's fix is in its forward: it takes the same inputs
    hand.load_state_dict(fixed.model.state_dict())  # set-arg rebuilds a layer: carry its new weights over
    torch.manual_seed(1)
    got = fixed(*inputs)
    torch.manual_seed(1)
    want = hand(*inputs)
    torch.testing.assert_close(got, want)


# (name, failing module path, failing op or None, cause, fix's where ("line": a replace-op), fix's code)
EXPECTED = [
    ("mel_cnn", "conv", None, "rank", "conv", "x.unsqueeze(1)"),
    ("ctc_model", "", "F.ctc_loss", "layout", "line", "log_probs.transpose(0, 1)"),
    ("bag_model", "bag", None, "offsets", "bag", "torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])"),
    ("two_tower", "", "mul", "broadcast", "item.2", "out_features=16"),
    ("lstm_forecaster", "", "F.mse_loss", "rank", "line", "target.squeeze(-1)"),
    ("bert_bilstm", "emission", None, "size", "emission", "in_features=20"),
    ("vae", "", "mul", "size", "logvar", "out_features=4"),
    ("gan", "D", None, "rank", "D", "x.view(-1, 1, 16, 16)"),
]


@pytest.mark.parametrize("name, path, op, cause, where, code", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_blame_and_verified_fix(name, path, op, cause, where, code):
    model, inputs, failure, d = _failure(M.CASES[name], name)
    assert (failure.op.op if failure.op else None) == op, failure.op
    if op is None:
        assert failure.path.startswith(path) if path else failure.path == "", failure.path
    assert d.cause == cause, d.message
    assert d.fix is not None and d.fix.code == code, (d.fix, d.message)
    if where == "line":
        assert d.fix.kind == "replace-op" and d.fix.where == failure.op.source
    else:
        assert d.fix.where == where, d.fix
    assert d.verified is not None and d.verified.status == "runs", d.verified
    _same_as_hand_fixed(name, model, inputs, d.verified.steps)


def test_overlapping_unfold_names_both_readings_and_verifies_nothing():
    _, _, failure, d = _failure(M.CASES["patch_forecaster"])
    assert failure.path == "head" and d.cause == "ambiguous"
    assert "85 windows × 16" in d.message and "x.unfold(1, 12, 12)" in d.hint and "in_features=1360" in d.hint
    assert d.fix is None and (d.verified is None or d.verified.status != "runs")
    # the step the hint names makes the model run as designed: 8 patches × 16 = the head's 128
    hand, inputs = M.CASES["patch_forecaster"](fixed=True)
    assert hand(*inputs).shape == (5, 4)


def test_bert_vocab_blames_the_word_embeddings():
    _, _, failure, d = _failure(M.CASES["bert_vocab"], "bert_vocab")
    assert failure.path.endswith("embeddings.word_embeddings") and d.cause == "index-range"
    assert "118" in d.message and d.fix is not None and "num_embeddings=119" in d.fix.code


# -- misses: the first fix they should get ---------------------------------------------------------
XFAILS = [
    ("backbone", "interpolate", "a 32-px image into a backbone built for 224: resize the input "
                                "(F.interpolate(x, size=(224, 224))), not the layers"),
    ("conv_ae", "output_padding=1", "ConvTranspose2d(k=3, s=2, p=1) gives 2·H − 1: output_padding=1 on dec.0 "
                                    "and dec.2 (7 → 14 → 28), not a resize of the reconstruction"),
    ("tiny_fpn", "scale_factor=2", "the strides differ by 2: F.interpolate(p4, scale_factor=2) (or "
                                   "size=lat.shape[-2:]), not a crop"),
    ("tabular", "x_cat[:, i]", "x_cat[i] takes sample i's row: the embeddings want column i, x_cat[:, i]"),
    ("vit_small", "interpolate", "pixel_values 32 px for a ViT built for 64: resize them (or "
                                 "interpolate_pos_encoding=True)"),
]


@pytest.mark.parametrize("name, wanted", [
    pytest.param(name, wanted, marks=pytest.mark.xfail(strict=True, reason=reason), id=name)
    for name, wanted, reason in XFAILS])
def test_misses_get_their_first_fix(name, wanted):
    d = _diagnosis(M.CASES[name], name)
    assert d is not None and wanted in f"{d.hint} {d.fix.code if d.fix else ''}"


# -- near misses: the same torch error, another right fix ------------------------------------------
def test_unfold_with_patch_step_keeps_the_head_size_fix():
    model, inputs, failure, d = _failure(M.NEAR_MISSES["patch_wrong_head"])
    assert failure.path == "head" and d.fix is not None and d.fix.code == "in_features=128", d.message
    assert "windows" not in d.message


def test_vae_whose_decoder_takes_the_wide_latent_resizes_mu():
    model, inputs, _, d = _failure(M.NEAR_MISSES["vae_wide_latent"])
    assert d.fix is not None and (d.fix.where, d.fix.code) == ("mu", "out_features=32"), d.message
    fixed = apply_fixes(model, d.verified.steps)
    hand, _ = M.NEAR_MISSES["vae_wide_latent"](fixed=True)
    hand.load_state_dict(fixed.model.state_dict())
    torch.manual_seed(1)
    got = fixed(*inputs)
    torch.manual_seed(1)
    torch.testing.assert_close(got, hand(*inputs))


def test_heads_without_a_witness_name_both_and_fix_nothing():
    _, _, _, d = _failure(M.NEAR_MISSES["reparameterise"])
    assert d.cause == "ambiguous" and d.fix is None
    assert "logvar out_features=4" in d.hint and "mu out_features=32" in d.hint


def test_two_towers_on_different_inputs_keep_the_broadcast_rule():
    _, _, _, d = _failure(M.CASES["two_tower"])
    assert "both read the same input" not in d.message and d.cause == "broadcast"


def test_flat_input_that_is_no_square_map_gets_no_view():
    _, _, _, d = _failure(M.NEAR_MISSES["flat_rgb"])
    assert d.cause == "rank" and d.fix is None and "cannot tell its H × W" in d.message
    assert "unsqueeze(0)" not in (d.hint or "")


def test_ctc_lengths_for_another_batch_get_no_transpose():
    _, _, _, d = _failure(M.NEAR_MISSES["ctc_short_lengths"])
    assert d.fix is None and "transpose" not in (d.hint or "") and "2 entries" in d.message


def test_target_for_another_horizon_is_not_squeezed():
    d = _diagnosis(M.NEAR_MISSES["other_horizon"])  # torch's message alone is the honest answer here
    assert d is None or "squeeze" not in f"{d.hint} {d.fix.code if d.fix else ''}"


def test_offsets_that_are_not_lengths_get_no_fix():
    _, _, _, d = _failure(M.NEAR_MISSES["bag_bad_offsets"])
    assert d.cause == "offsets" and d.fix is None and "start" in d.message
