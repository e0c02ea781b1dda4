"""Round-6 audit of ``layerlab inspect``'s failure blame (cases in :mod:`tests.probe.audit_round6_models`).

Before this round 9 of the 15 got the right first fix; the MultiheadAttention fed (N, L, E) with
``batch_first=False`` got a *verified* crop of its causal mask to the batch size (attention across
the samples). Now: the batch_first fix, the shortcut's missing stride, the RNN's last step for a
per-sequence target, the chunk along the batch, the CLS column of the padding mask and the pad of
short token ids — each checked against the hand-fixed model with the same weights, and each with a
near miss where the fix must not be given.
"""

from __future__ import annotations

import linecache
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe.audit_round6_models import CASES, negative

_HF = ("bert_mean_axis",)


def _inspect(model, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return layerlab.inspect(model, *inputs, backward=False)


def _failure(name):
    if name in _HF:
        pytest.importorskip("transformers", reason="the BERT case needs transformers")
    model, inputs = CASES[name]()
    report = _inspect(model, inputs)
    assert report.failure is not None and report.failure.diagnosis is not None, f"{name}: no diagnosis"
    return model, inputs, report.failure, report.failure.diagnosis


def _same_as_hand_fixed(name, model, inputs, steps, hand_inputs=None):
    """The verified fix applied to a copy computes what the hand-fixed twin computes with its weights."""
    fixed = apply_fixes(model, steps)
    hand, _ = CASES[name](fixed=True)
    hand.load_state_dict(fixed.model.state_dict())  # set-arg rebuilds a layer: carry its new weights over
    torch.manual_seed(1)
    got = fixed(*inputs)
    torch.manual_seed(1)
    want = hand(*(hand_inputs or inputs))
    got, want = (got, want) if isinstance(got, torch.Tensor) else (got[0], want[0])
    torch.testing.assert_close(got, want)


# (name, failing path, op source line or None, cause, first fix's where, first fix's code)
EXPECTED = [
    ("unet", "", "cat", "size", "up", "output_size=[37, 37]"),
    ("resnet_down", "layer2.0", "add", "shortcut-stride", "layer2.0.downsample.0", "stride=2"),
    ("gru_ce", "", "F.cross_entropy", "per-step-logits", "fc", "out[:, -1]"),
    ("attn_view", "attn", "view", "non-contiguous", None, "reshape"),
    ("pixelshuffle", "shuffle", None, "size", "to_sub", "out_channels=27"),
    ("audio_no_channel", "net.0", None, "rank", "net.0", "x.unsqueeze(1)"),
    ("single_image", "4", None, "rank", "0", "x.unsqueeze(0)"),
    ("cls_mask", "encoder.layers.0.self_attn", None, "mask-shape", "encoder",
     "torch.cat([src_key_padding_mask.new_zeros(3, 1), src_key_padding_mask], dim=1)"),
    ("embedding_oob", "emb", None, "index-range", "emb", "num_embeddings=1024"),
    ("bert_mean_axis", "classifier", None, "reduce-dim", None, "mean(…, dim=1)"),
    ("vae_chunk", "dec.0", None, "split-axis", None, "chunk(2, dim=-1)"),
    ("densenet", "layers.2.norm", None, "size", "layers.2.norm", "num_features=32"),
    ("mha_batch_first", "attn", None, "layout", "attn", "batch_first=True"),
    ("bce_long", "", "F.binary_cross_entropy_with_logits", "dtype", None, "target.float()"),
    ("textcnn_short", "convs.2", None, "short-sequence", "", "F.pad(ids, (0, 1), value=0)"),
]


_REPLACED = {"attn_view": "y.view(B, T, C)", "bert_mean_axis": "h.mean(dim=-1)", "vae_chunk": "h.chunk(2,",
             "bce_long": "F.binary_cross_entropy_with_logits(logits, y"}


@pytest.mark.parametrize("name,path,op,cause,where,code", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_round6_blame_location_cause_and_verified_first_fix(name, path, op, cause, where, code):
    model, inputs, failure, d = _failure(name)
    assert failure.path == path
    assert (failure.op.op if failure.op is not None else None) == op
    assert d.cause == cause, d.message
    assert d.fix is not None and d.fix.code == code, d.hint
    if where is not None:  # a replace-op fix is placed at its source line instead
        assert d.fix.where == where
    else:  # the op at the line that holds the bug
        assert d.fix.kind == "replace-op" and d.fix.where.endswith(f"audit_round6_models.py:{d.fix.params['line']}")
        assert _REPLACED[name] in linecache.getline(d.fix.params["file"], d.fix.params["line"])
    assert d.verified is not None and d.verified.status == "runs", d.verified


@pytest.mark.parametrize("name", ["resnet_down", "gru_ce", "attn_view", "pixelshuffle", "audio_no_channel",
                                  "cls_mask", "embedding_oob", "bert_mean_axis", "vae_chunk", "densenet",
                                  "mha_batch_first", "bce_long", "textcnn_short"])
def test_round6_verified_fix_computes_what_the_hand_fix_computes(name):
    model, inputs, _, d = _failure(name)
    _same_as_hand_fixed(name, model, inputs, d.verified.steps)


def test_single_image_fix_is_the_batch_of_one():
    model, (x,), _, d = _failure("single_image")
    _same_as_hand_fixed("single_image", model, (x,), d.verified.steps, hand_inputs=(x.unsqueeze(0),))
    assert "in_features=49" not in d.hint  # one prediction per channel would run


def test_unet_output_size_fix_is_the_transposed_conv_told_its_size():
    model, (x,), _, d = _failure("unet")
    fixed = apply_fixes(model, d.verified.steps)
    skip = torch.relu(model.enc(x))
    y = model.up(torch.relu(model.mid(model.pool(skip))), output_size=skip.shape[-2:])
    want = model.out(torch.relu(model.dec(torch.cat([y, skip], dim=1))))
    torch.testing.assert_close(fixed(x), want)


def test_mha_batch_first_is_not_the_mask_cropped_to_the_batch():
    _, (x,), _, d = _failure("mha_batch_first")
    assert "attn_mask[:3, :3]" not in d.fix.code and "(N, L, E)" in d.message
    assert any("attn_mask[:3, :3]" in a and "across samples" in a for a in d.alternatives)
    assert d.verified.outputs == [list(x.shape)]


def test_mha_seq_first_input_with_a_max_len_mask_is_still_cropped():
    """(L, N, E) input, batch_first=False, causal mask built for max_len 8: the crop stays the fix."""
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(16, 2)
    x, mask = torch.randn(3, 5, 16), torch.ones(8, 8, dtype=torch.bool).triu(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = layerlab.inspect(attn, x, x, x, attn_mask=mask, backward=False).failure.diagnosis
    assert d.fix.code == "attn_mask[:3, :3]" and d.verified.status == "runs"


def test_bottleneck_without_main_stride_gets_no_stride_on_its_conv3():
    model, inputs = negative("bottleneck")
    d = _inspect(model, inputs).failure.diagnosis
    assert d is None or d.cause != "shortcut-stride"
    assert d is None or d.fix is None or "stride" not in d.fix.code


def test_bidirectional_gru_gets_both_final_states_not_the_last_step():
    model, inputs = negative("bigru")
    d = _inspect(model, inputs).failure.diagnosis
    assert d.cause == "per-step-logits" and d.fix is None
    assert "h_n[-2], h_n[-1]" in d.hint


def test_text_cnn_without_padding_idx_gets_no_pad_fix():
    model, inputs = negative("textcnn_nopad")
    d = _inspect(model, inputs).failure.diagnosis
    assert d.fix is None and "padding_idx" in d.hint and "kernel_size would run but change" in d.hint


def test_cross_entropy_loss_module_gets_the_same_last_step_fix():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.fc, self.loss = nn.LSTM(6, 10, batch_first=True), nn.Linear(10, 3), nn.CrossEntropyLoss()

        def forward(self, x, y):
            return self.loss(self.fc(self.lstm(x)[0]), y)

    torch.manual_seed(0)
    model, x, y = Tagger(), torch.randn(2, 5, 6), torch.tensor([0, 2])
    d = _inspect(model, (x, y)).failure.diagnosis
    assert (d.cause, d.fix.code, d.verified.status) == ("per-step-logits", "out[:, -1]", "runs")
    out, (h, _) = model.lstm(x)
    torch.testing.assert_close(apply_fixes(model, d.verified.steps)(x, y), F.cross_entropy(model.fc(h[-1]), y))


@pytest.mark.parametrize("name", sorted(CASES))
def test_round6_hand_fixed_models_raise_no_alarm(name):
    if name in _HF:
        pytest.importorskip("transformers", reason="the BERT case needs transformers")
    model, inputs = CASES[name](fixed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = layerlab.inspect(model, *inputs)
    assert report.ok and report.failure is None, name
