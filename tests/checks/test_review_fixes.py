"""False alarms a new-user review found on stock torch transformer layers, each checked against torch.

* `nn.TransformerDecoderLayer`'s `memory_key_padding_mask` pads `memory` (its own length), not `tgt`.
* `nn.TransformerEncoder` in eval mode with a padding mask has two eager behaviours: with no grad
  torch's nested-tensor fast path writes 0 at padded positions, with autograd on the regular path
  computes them. Finite differences and export comparisons must not mix the two.
"""

from __future__ import annotations

import torch
from torch import nn

import layerlab


def _padding(B, S, lengths):
    return torch.arange(S).expand(B, S) >= torch.tensor(lengths)[:, None]


def test_decoder_memory_padding_mask_is_measured_against_memory():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    tgt, memory = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    kw = dict(tgt_mask=nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.bool),
              tgt_key_padding_mask=_padding(2, 5, [5, 3]), memory_key_padding_mask=_padding(2, 6, [6, 4]))
    layer(tgt, memory, **kw)  # torch accepts these shapes
    report = layerlab.verify(layer, tgt, memory, **kw)
    assert [(c.name, c.summary) for c in report.checks if c.failed] == []
    assert report.check("masks").status.value == "pass"


def _encoder_eval():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    return nn.TransformerEncoder(layer, 2).eval(), torch.randn(3, 6, 16), _padding(3, 6, [6, 4, 2])


def test_the_two_eager_paths_really_differ_only_at_padded_positions():
    model, x, pad = _encoder_eval()
    with torch.no_grad():
        fast = model(x, src_key_padding_mask=pad)
    slow = model(x, src_key_padding_mask=pad).detach()
    assert (fast - slow).abs()[~pad].max() < 1e-5 and (fast - slow).abs()[pad].max() > 0.1


def test_gradcheck_of_an_eval_encoder_with_padding_is_not_a_wrong_gradient():
    model, x, pad = _encoder_eval()
    report = layerlab.verify(model, x, src_key_padding_mask=pad, only=["gradcheck"])
    assert report.check("gradcheck").status.value == "pass", report.check("gradcheck").summary


def test_export_paths_of_an_eval_encoder_with_padding_equal_eager():
    model, x, pad = _encoder_eval()
    report = layerlab.export_check(model, x, src_key_padding_mask=pad, paths=["trace", "compile", "export"])
    assert {p.path: p.status.value for p in report.paths} == {"trace": "pass", "compile": "pass", "export": "pass"}


class _SelfAttention(nn.Module):
    """Single-head self-attention over (B, T, E) with a torch-convention key_padding_mask."""

    def __init__(self, dim, use_mask=True):
        super().__init__()
        self.qkv, self.use_mask = nn.Linear(dim, 3 * dim), use_mask

    def forward(self, x, key_padding_mask=None):
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        if self.use_mask and key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
        return scores.softmax(-1) @ v


def test_a_padding_mask_the_layer_ignores_is_a_failure_and_a_used_one_passes():
    torch.manual_seed(0)
    x, pad = torch.randn(2, 6, 16), _padding(2, 6, [6, 3])
    ignored = layerlab.verify(_SelfAttention(16, use_mask=False), x, key_padding_mask=pad, only=["masks"])
    check = ignored.check("masks")
    assert check.status.value == "fail" and check.where == "key_padding_mask"
    assert "no effect" in check.summary
    used = layerlab.verify(_SelfAttention(16), x, key_padding_mask=pad, only=["masks"])
    assert used.check("masks").status.value == "pass", used.check("masks").summary


def test_hugging_face_attention_mask_read_or_dropped():
    import pytest

    tf = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    torch.manual_seed(0)
    bert = tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=100)).eval()
    ids = torch.randint(0, 100, (2, 7))
    mask = (~_padding(2, 7, [7, 4])).long()  # HF: 1 = token, 0 = pad

    class DropsMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask=None):
            return self.bert(input_ids=input_ids).last_hidden_state  # the bug: the mask is never passed on

    stock = layerlab.verify(bert, ids, attention_mask=mask, only=["masks"])
    assert stock.check("masks").status.value == "pass", stock.check("masks").summary
    dropped = layerlab.verify(DropsMask(), ids, attention_mask=mask, only=["masks"])
    assert dropped.check("masks").status.value == "fail" and dropped.check("masks").where == "attention_mask"


class _CellWithoutDefaultState(nn.Module):
    """A hand-written RNN cell whose forward has no default for hx (hx=None reaches an op)."""

    def __init__(self, n_in, hidden):
        super().__init__()
        self.input_size, self.hidden_size = n_in, hidden
        self.w_ih, self.w_hh = nn.Linear(n_in, hidden), nn.Linear(hidden, hidden)

    def forward(self, input, hx=None):
        return torch.tanh(self.w_ih(input) + hx @ self.w_hh.weight.T)


def test_a_cell_without_a_default_state_is_told_to_make_one_not_to_fix_a_dtype():
    x, h = torch.randn(3, 4), torch.randn(3, 5)
    report = layerlab.verify(_CellWithoutDefaultState(4, 5), x, h, tags=["recurrent"], only=["recurrent_state"])
    check = report.check("recurrent_state")
    assert check.status.value == "fail" and "NoneType" in check.summary
    assert "default" in check.hint and "when hx is None" in check.hint


class MultiheadAttention(nn.Module):
    """torch's MultiheadAttention layout (batch_first), hand-written; returns (out, None) as many do.
    ``scaled=False`` plants the classic bug: no 1/√d on the scores."""

    def __init__(self, embed_dim, num_heads, batch_first=True, scaled=True):
        super().__init__()
        self.embed_dim, self.num_heads, self.batch_first, self.scaled = embed_dim, num_heads, batch_first, scaled
        self.in_proj_weight = nn.Parameter(torch.randn(3 * embed_dim, embed_dim) / embed_dim ** 0.5)
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, need_weights=False):
        B, L, E = query.shape
        H, D = self.num_heads, E // self.num_heads
        q, k, v = (torch.nn.functional.linear(t, w, b).view(B, -1, H, D).transpose(1, 2) for t, w, b in
                   zip((query, key, value), self.in_proj_weight.chunk(3), self.in_proj_bias.chunk(3)))
        scores = q @ k.transpose(-1, -2) / (D ** 0.5 if self.scaled else 1.0)
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, E)), None


def test_an_attention_returning_none_weights_is_told_how_to_be_compared():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    silent = layerlab.verify(MultiheadAttention(16, 2, scaled=False), x, x, x)
    assert silent.reference is None and "need_weights=False" in silent.settings["reference_weights"]
    compared = layerlab.verify(MultiheadAttention(16, 2, scaled=False), x, x, x, need_weights=False)
    assert compared.reference == "torch.nn.MultiheadAttention"
    assert compared.check("forward_parity").status.value == "fail"
    correct = layerlab.verify(MultiheadAttention(16, 2), x, x, x, need_weights=False)
    assert correct.check("forward_parity").status.value == "pass", correct.check("forward_parity").summary
