"""Broken models from an independent audit of ``inspect``'s causes and fixes (not the corpus's
authors): each asserts the blamed location, the cause, the exact first fix, and — where the fix is
mechanical — that the verified fix computes what the same model fixed by hand computes (same
weights). Where a tempting size fix would run with the wrong number of samples, it must not come
first; where the right fix can't be known from what inspect sees, no fix is offered.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from layerlab.probe.fixes import apply_fixes


def _diagnose(model, *args, **kwargs):
    report = layerlab.inspect(model, *args, **kwargs)
    assert not report.ok and report.failure is not None and report.failure.diagnosis is not None
    return report.failure, report.failure.diagnosis


def _fixed_output(model, d, *args, **kwargs):
    assert d.verified is not None and d.verified.status == "runs", d.verified
    return apply_fixes(model, d.verified.steps)(*args, **kwargs)


def _line(fn, text: str) -> int:
    """The source line of ``text`` inside ``fn`` (so a test never hard-codes a line number)."""
    import inspect as pyinspect

    lines, start = pyinspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


# -- batch axis: a size fix would run with the wrong rows ---------------------------------------------
def test_single_image_without_batch_dim_adds_it_instead_of_resizing_the_linear():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    img = torch.randn(3, 8, 8)  # one image, no batch dim: Conv2d reads it as unbatched (C, H, W)
    failure, d = _diagnose(model, img)
    assert failure.path == "3" and d.cause == "rank"
    assert "got a 3-D input [3, 8, 8]" in d.message and "the batch dim is missing" in d.message
    assert (d.fix.kind, d.fix.where, d.fix.code) == ("reshape-input", "0", "x.unsqueeze(0)")
    assert d.alternatives[0].startswith("set in_features=36 — only if")
    torch.testing.assert_close(_fixed_output(model, d, img), model(img.unsqueeze(0)), rtol=0, atol=0)


class StackedEncoders(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim
        self.encoders = nn.ModuleList(nn.Linear(5, 6) for _ in range(3))
        self.head = nn.Linear(3 * 6, 2)

    def forward(self, x):
        feats = torch.stack([e(x) for e in self.encoders], dim=self.dim)
        return self.head(feats.flatten(1))


def test_stack_along_the_batch_dim_gets_no_size_fix():
    torch.manual_seed(0)
    model = StackedEncoders(dim=0)
    x = torch.randn(4, 5)
    with pytest.raises(RuntimeError):
        model(x)
    fixed = copy.deepcopy(model)
    fixed.dim = 1
    assert fixed(x).shape == (4, 2)  # the hand fix
    failure, d = _diagnose(model, x)
    assert failure.path == "head" and d.cause == "batch-axis"
    assert d.fix is None and d.verified is None  # in_features=24 would run: 3 outputs for 4 samples
    assert "exactly 4 rows of in_features" in d.message and "`stack(dim=0)`" in d.message
    assert "set in_features=24 — only if each of the 3 rows is one sample" in d.alternatives[0]


def test_flatten_size_for_another_image_size_still_sets_in_features():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 16 * 16, 10))
    failure, d = _diagnose(model, torch.randn(2, 1, 28, 28))
    assert failure.path == "3" and d.cause == "size"
    assert (d.fix.kind, d.fix.code, d.verified.status) == ("set-arg", "in_features=784", "runs")


# -- layout -------------------------------------------------------------------------------------------
class PILToConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)

    def forward(self, img):  # img (N, H, W, C)
        return self.conv(img.permute(0, 2, 3, 1))


def test_permute_in_the_wrong_order_is_redone_not_transposed_after():
    torch.manual_seed(0)
    model, img = PILToConv(), torch.randn(2, 10, 12, 3)
    failure, d = _diagnose(model, img)
    assert failure.path == "conv" and d.cause == "layout"
    line = _line(PILToConv.forward, "img.permute(0, 2, 3, 1)")
    assert (d.fix.kind, d.fix.code, d.fix.params["line"]) == ("replace-op", "x.permute(0, 3, 1, 2)", line)
    # the tempting x.transpose(1, 2) on the conv input runs too, on an image with H and W swapped
    out = _fixed_output(model, d, img)
    torch.testing.assert_close(out, model.conv(img.permute(0, 3, 1, 2)), rtol=0, atol=0)
    assert not torch.allclose(out.transpose(2, 3), model.conv(img.permute(0, 2, 3, 1).transpose(1, 2)))


class GRUWithState(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(5, 7)  # batch_first forgotten

    def forward(self, x, h0):
        return self.gru(x, h0)[0]


def test_gru_fed_batch_first_data_with_a_batched_h0_sets_batch_first():
    torch.manual_seed(0)
    model, x, h0 = GRUWithState(), torch.randn(3, 8, 5), torch.randn(1, 3, 7)
    failure, d = _diagnose(model, x, h0)
    assert failure.path == "gru" and d.cause == "layout"
    assert (d.fix.kind, d.fix.code) == ("set-attr", "batch_first=True")
    assert "torch.zeros(1, 8, 7)" not in d.hint  # the old hint: time read as the batch
    hand = copy.deepcopy(model)
    hand.gru.batch_first = True
    torch.testing.assert_close(_fixed_output(model, d, x, h0), hand(x, h0), rtol=0, atol=0)


def test_residual_block_that_widens_gets_no_width_fix():
    class WideningBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(8, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            return x + self.conv2(F.relu(self.conv1(x)))

    failure, d = _diagnose(WideningBlock(), torch.randn(2, 8, 6, 6))
    assert failure.op.op == "add" and d.cause == "broadcast"
    assert d.fix is None  # out_channels=8 on conv2 would run as a bottleneck the author did not write
    assert "projection of the shortcut to 16" in d.hint


# -- masks ----------------------------------------------------------------------------------------------
def test_mha_mask_per_sequence_is_repeated_per_head_in_sequence_major_order():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(3, 4, 8)
    mask = torch.rand(3, 4, 4) > 0.6
    mask[..., 0] = False  # every query keeps one key
    failure, d = _diagnose(mha, x, x, x, attn_mask=mask)
    assert failure.path == "" and d.cause == "mask-shape"
    assert (d.fix.kind, d.fix.code) == ("reshape-input", "attn_mask.repeat_interleave(2, dim=0)")
    out = _fixed_output(mha, d, x, x, x, attn_mask=mask)[0]
    torch.testing.assert_close(out, mha(x, x, x, attn_mask=mask.repeat_interleave(2, dim=0))[0], rtol=0, atol=0)
    # .repeat would pair the sequences' masks with the wrong samples
    assert not torch.allclose(out, mha(x, x, x, attn_mask=mask.repeat(2, 1, 1))[0])


def test_stock_transformer_encoder_with_an_expanded_causal_mask():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    failure, d = _diagnose(model, x, mask=causal.expand(2, 5, 5))
    assert failure.path == "layers.0.self_attn" and d.cause == "mask-shape"
    assert d.fix.code == "attn_mask.repeat_interleave(4, dim=0)" and "attn_mask[0] (L, S) would do too" in d.hint
    torch.testing.assert_close(_fixed_output(model, d, x, mask=causal.expand(2, 5, 5)), model(x, mask=causal),
                               rtol=1e-6, atol=1e-6)


# -- dtypes ---------------------------------------------------------------------------------------------
def test_integer_counts_into_linear_are_cast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(6, 4), nn.ReLU()), nn.Linear(4, 1))
    counts = torch.randint(0, 9, (3, 6))
    failure, d = _diagnose(model, counts)
    assert failure.path == "0.0" and d.cause == "dtype" and "an input is int64" in d.message
    assert (d.fix.kind, d.fix.code) == ("cast-input", "x.to(torch.float32)")
    torch.testing.assert_close(_fixed_output(model, d, counts), model(counts.float()), rtol=0, atol=0)


def test_integer_ids_into_linear_point_to_embedding_without_a_cast():
    failure, d = _diagnose(nn.Linear(50, 8), torch.randint(0, 50, (2, 7)))
    assert d.cause == "dtype" and "ids need an nn.Embedding" in d.message
    assert d.fix is None and d.hint.startswith("look up integer ids with nn.Embedding")


class LSTMZeroState(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)

    def forward(self, x):
        h0 = torch.zeros(1, x.size(0), 6)
        c0 = torch.zeros(1, x.size(0), 6)
        return self.lstm(x, (h0, c0))[0]


def test_state_created_inside_forward_names_the_line_that_made_it():
    model = LSTMZeroState().double()
    failure, d = _diagnose(model, torch.randn(2, 5, 4, dtype=torch.float64))
    assert failure.path == "lstm" and d.cause == "dtype"
    line = _line(LSTMZeroState.forward, "h0 = torch.zeros")
    assert "an input is float32 (hx[0] [1, 2, 6])" in d.message and f"test_audit_cases.py:{line}" in d.message
    assert d.hint.startswith("create it with the input's dtype and device: zeros(…, dtype=x.dtype, device=x.device)")
    assert d.fix is None  # the tensor is made inside forward: no argument to convert


# -- a tuple where a tensor goes ------------------------------------------------------------------------
class LSTMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(self.lstm(x))


def test_lstm_return_value_passed_whole_to_linear():
    torch.manual_seed(0)
    model, x = LSTMHead(), torch.randn(2, 5, 4)
    failure, d = _diagnose(model, x)
    assert failure.path == "fc" and d.cause == "tuple" and "(output, (h_n, c_n))" in d.message
    assert (d.fix.kind, d.fix.code) == ("reshape-input", "x[0]")
    torch.testing.assert_close(_fixed_output(model, d, x), model.fc(model.lstm(x)[0]), rtol=0, atol=0)
