"""Round-5 audit of ``layerlab inspect``'s failure blame (cases in :mod:`tests.probe.audit_round5_models`).

The text CNN pooled over the wrong axis is fixed: the blame is the reduction's ``dim``, not the
``in_features=L`` that would run and tie the model to one sequence length. So are the Swin window
partition, the seq-first bmm operand, the (B, T, 1) ids, the batch-first memory and the half-resolution
segmentation logits: each with a negative twin where the tempting fix would run and be wrong. The mixer
stays a strict xfail: its honest answer is "ambiguous".
"""

from __future__ import annotations

import warnings

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe.audit_round5_models import CASES, inputs


def _inspect(name):
    torch.manual_seed(0)
    model = CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = layerlab.inspect(model, *inputs(name), backward=False)
    assert report.failure is not None, f"{name} should fail"
    return model, report.failure


def test_text_cnn_pooled_over_filters_gets_the_reduction_dim_not_in_features():
    model, failure = _inspect("text_cnn")
    d = failure.diagnosis
    assert (failure.path, failure.class_name) == ("fc", "Linear")
    assert d.cause == "reduce-dim"
    assert d.fix.kind == "replace-op" and d.fix.code == "max(…, dim=2)"
    assert "in_features=18" not in d.hint
    assert d.verified.status == "runs" and d.verified.outputs == [[2, 4]]
    hand = CASES["text_cnn"](fixed=True)
    hand.load_state_dict(model.state_dict())
    (ids,) = inputs("text_cnn")
    fixed = apply_fixes(model, d.verified.steps)
    torch.testing.assert_close(fixed(ids), hand(ids))
    longer = torch.randint(0, 50, (2, 31))  # the right fix does not depend on the sequence length
    torch.testing.assert_close(fixed(longer), hand(longer))


def test_reduction_with_two_fitting_axes_is_not_rewritten():
    """(N, C, H, W).mean(dim=1) → Linear(C): no other reduction gives C last, so no dim is proposed."""
    class Pool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 6, 1), torch.nn.Linear(6, 2)

        def forward(self, x):
            return self.fc(self.conv(x).mean(dim=1))

    torch.manual_seed(0)
    report = layerlab.inspect(Pool(), torch.randn(2, 3, 5, 5), backward=False)
    assert report.failure.diagnosis is None or report.failure.diagnosis.cause != "reduce-dim"


_MISSES = [
    ("mixer", "token_mix", "in_features=16",
     "no mechanical fix: says it cannot tell the transpose from the layer size (see the test below); "
     "Linear(16, 16) is right"),
]


# each miss is a strict xfail, its evidence as the reason
MISSES = [pytest.param(*m, marks=pytest.mark.xfail(strict=True, reason=m[3]), id=m[0]) for m in _MISSES]


@pytest.mark.parametrize("name,path,first_fix,reason", MISSES)
def test_round5_miss(name, path, first_fix, reason):
    _, failure = _inspect(name)
    assert failure.path == path
    d = failure.diagnosis
    assert d is not None and first_fix in ((d.fix.code if d.fix else "") or "")


def test_a_linear_after_the_users_own_transpose_is_not_transposed_back():
    """Round 5 found the first fix x.transpose(1, 2) here: it runs, and mixes channels where the model
    mixes tokens. With the size sitting on the axis the user's transpose just moved, layerlab now says
    it cannot tell which is wrong, and names both options (the layer's size first)."""
    from tests.probe.audit_round5_models import Mixer

    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    with pytest.raises(RuntimeError):
        Mixer()(x)
    assert Mixer(fixed=True)(x).shape == (2, 16, 32)  # the right model: tokens mixed by Linear(16, 16)
    failure = layerlab.inspect(Mixer(), x, backward=False).failure
    d = failure.diagnosis
    assert failure.path == "token_mix" and d.cause == "ambiguous" and d.fix is None
    assert "in_features=16" in d.hint and "transpose" in d.message



def _hand_fixed_matches(name, model, d):
    """The verified fix, applied to a copy, computes what the hand-fixed twin (same weights) computes."""
    assert d.verified is not None and d.verified.status == "runs", d.verified
    hand = CASES[name](fixed=True)
    hand.load_state_dict(model.state_dict())
    fixed = apply_fixes(model, d.verified.steps)
    torch.testing.assert_close(fixed(*inputs(name)), hand(*inputs(name)))


def _inspect_model(model, *args):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        failure = layerlab.inspect(model, *args, backward=False).failure
    assert failure is not None
    return failure


# -- swin: a window partition of a size the window does not divide ----------------------------------
def test_swin_partition_of_14_by_window_4_says_pad_to_16():
    model, failure = _inspect("swin")
    d = failure.diagnosis
    assert failure.path == "" and failure.op.op == "view"
    assert d.cause == "window-size" and d.fix is None and d.verified is None  # advice: nothing was re-run
    assert d.hint.startswith("pad axes 1, 2 up to a multiple of the window 4 (14 × 14 → 16 × 16)")
    assert "14 // 4 = 3 windows cover 12, 2 left over" in d.message
    pad = tuple(int(v) for v in re.search(r"F\.pad\(x, \(([\d, ]+)\)\)", d.hint).group(1).split(","))
    assert pad == (0, 0, 0, 2, 0, 2)
    hand = CASES["swin"](fixed=True)
    hand.load_state_dict(model.state_dict())
    (x,) = inputs("swin")
    # the advised pad, written before the partition, is what the hand-fixed model computes
    torch.testing.assert_close(model(F.pad(x, pad)), hand(x))


def test_a_head_split_that_does_not_divide_is_not_called_a_window():
    """(B, T, 30).view(B, T, 4, 30 // 4): the same floor arithmetic on one axis; padding the features
    to 32 would run and be wrong (num_heads must divide the width)."""
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(30, 30)

        def forward(self, x):
            B, T, D = x.shape
            return self.proj(x).view(B, T, 4, D // 4)

    d = _inspect_model(Heads(), torch.randn(2, 5, 30)).diagnosis
    assert d.cause == "element-count" and "F.pad" not in (d.hint or "") and "window" not in d.message


# -- bmm: k from a seq-first GRU --------------------------------------------------------------------
def test_bmm_with_k_from_a_seq_first_gru_transposes_k_and_computes_the_hand_fix():
    model, failure = _inspect("bmm")
    d = failure.diagnosis
    assert failure.path == "" and failure.op.op == "bmm"
    assert d.cause == "layout" and "`gru` (GRU, batch_first=False)" in d.message
    assert d.fix.kind == "replace-op" and d.fix.code == "k.transpose(0, 1)"
    assert "k.transpose(0, 1).transpose(1, 2)" in d.hint
    assert d.verified.outputs == [[2, 5, 8]]
    _hand_fixed_matches("bmm", model, d)


class _BmmOther(nn.Module):
    """q (2, 5, 8) batch-first against a GRU output whose first two axes do not say batch-first-vs-seq."""

    def __init__(self, batch_first):
        super().__init__()
        self.q, self.gru = nn.Linear(8, 8), nn.GRU(8, 8, batch_first=batch_first)

    def forward(self, x, y):
        q, (k, _) = self.q(x), self.gru(y)
        return torch.bmm(q, k.transpose(1, 2))


@pytest.mark.parametrize("batch_first,y_shape", [
    (True, (5, 2, 8)),   # a batch_first GRU given (T, B, D): k.transpose(0, 1) would run; the GRU's input is wrong
    (False, (5, 3, 8)),  # a seq-first GRU over another batch (3): the batches simply differ
], ids=["batch-first-gru", "other-batch"])
def test_bmm_batch_mismatch_without_seq_first_provenance_gets_no_transpose(batch_first, y_shape):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 5, 8, generator=g), torch.randn(*y_shape, generator=g)
    model = _BmmOther(batch_first)
    if batch_first:  # the tempting fix exists: it runs
        q, (k, _) = model.q(x), model.gru(y)
        assert torch.bmm(q, k.transpose(0, 1).transpose(1, 2)).shape == (2, 5, 5)
    d = _inspect_model(model, x, y).diagnosis
    assert d is not None and d.fix is None and "transpose(0, 1)" not in (d.hint or "")


# -- (B, T, 1) ids → Embedding → LSTM ---------------------------------------------------------------
def test_trailing_one_ids_squeeze_the_lstm_input_and_compute_the_hand_fix():
    model, failure = _inspect("emb_trailing_one")
    d = failure.diagnosis
    assert (failure.path, failure.class_name) == ("rnn", "LSTM")
    assert d.cause == "rank" and "ids [2, 6, 1]" in d.message
    assert d.fix.kind == "cast-input" and d.fix.where == "rnn" and d.fix.code == "x.squeeze(2)"
    assert d.verified.outputs == [[2, 6, 8]]
    _hand_fixed_matches("emb_trailing_one", model, d)


def test_a_size_one_axis_from_a_conv_is_not_squeezed_into_an_lstm():
    """Conv2d → (N, C=8, 1, L=6) into LSTM(6): x.squeeze(2) runs, and reads the 8 channels as time steps."""
    class ConvRnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.rnn = nn.Conv2d(1, 8, (3, 1)), nn.LSTM(6, 4, batch_first=True)

        def forward(self, x):
            return self.rnn(self.conv(x))[0]

    model, x = ConvRnn(), torch.randn(2, 1, 3, 6)
    assert model.rnn(model.conv(x).squeeze(2))[0].shape == (2, 8, 4)  # the tempting fix runs
    d = _inspect_model(model, x).diagnosis
    assert d.fix is None or "squeeze" not in d.fix.code


# -- seq2seq: a batch_first GRU's memory into a seq-first decoder layer ------------------------------
def test_batch_first_memory_into_a_seq_first_decoder_is_transposed_where_passed():
    model, failure = _inspect("seq2seq")
    d = failure.diagnosis
    assert (failure.path, failure.class_name) == ("dec.multihead_attn", "MultiheadAttention")
    assert d.cause == "layout" and "`enc` (GRU, batch_first=True)" in d.message
    assert d.fix.kind == "cast-input" and d.fix.where == "dec" and d.fix.code == "memory.transpose(0, 1)"
    assert d.verified.outputs == [[5, 2, 16]]
    _hand_fixed_matches("seq2seq", model, d)


def test_memory_from_a_seq_first_gru_is_not_transposed():
    """The GRU is seq-first, so its memory (2, 7, 16) is (S, N): its *input* was batch-first. The memory
    transposed would run — attention over the wrong axis."""
    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.dec = nn.GRU(16, 16), nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0)

        def forward(self, src, tgt):
            return self.dec(tgt, self.enc(src)[0])

    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randn(2, 7, 16, generator=g), torch.randn(5, 2, 16, generator=g)
    model = Seq2Seq()
    assert model.dec(tgt, model.enc(src)[0].transpose(0, 1)).shape == (5, 2, 16)  # the tempting fix runs
    failure = _inspect_model(model, src, tgt)
    d = failure.diagnosis
    assert failure.path == "dec.multihead_attn" and d.fix is None and "batch_first=False" in d.message


# -- seg: half-resolution logits against a full-size mask -------------------------------------------
def test_half_resolution_logits_are_upsampled_to_the_mask_and_compute_the_hand_fix():
    model, failure = _inspect("seg")
    d = failure.diagnosis
    assert failure.path == "" and failure.op.op == "F.cross_entropy"
    assert d.cause == "resolution"
    assert d.fix.code.startswith("F.interpolate(logits, size=(16, 16), mode='bilinear'")
    assert "mode='nearest'" in d.alternatives[0] and "size=(8, 8)" in d.alternatives[0]
    assert d.verified.outputs == [[]]
    _hand_fixed_matches("seg", model, d)


def test_logits_a_few_pixels_short_are_neither_resized_nor_the_mask_cropped():
    """An unpadded 3×3 conv: 16 → 14. Upsampling the logits or cropping the mask would both run."""
    class Valid(nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = nn.Conv2d(3, 4, 3)

        def forward(self, x, mask):
            return F.cross_entropy(self.cls(x), mask)

    g = torch.Generator().manual_seed(0)
    x, mask = torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 4, (2, 16, 16), generator=g)
    d = _inspect_model(Valid(), x, mask).diagnosis
    assert d.cause == "resolution" and d.fix is None and "padding" in d.hint
    assert "interpolate" not in d.hint and not d.alternatives


def test_a_tagger_shortened_by_its_conv_gets_no_interpolation():
    """(N, C, 10) logits from an unpadded Conv1d against a (N, 12) target: the fix is padding=1."""
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(8, 5, 3)

        def forward(self, x, tags):
            return F.cross_entropy(self.conv(x), tags)

    g = torch.Generator().manual_seed(0)
    x, tags = torch.randn(2, 8, 12, generator=g), torch.randint(0, 5, (2, 12), generator=g)
    d = _inspect_model(Tagger(), x, tags).diagnosis
    assert d is None or d.fix is None or "interpolate" not in d.fix.code
