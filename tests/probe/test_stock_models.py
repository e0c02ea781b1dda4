"""inspect's diagnosis on models nobody here wrote: torch.nn's transformer stack and Hugging Face
models built from a config (offline: no weights are downloaded; skipped without ``transformers``).

A model that runs must run under ``ops=True`` with no failure; a realistic mistake must get the
right cause and a fix that computes what the hand fix computes."""

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.probe.fixes import apply_fixes


def _encoder(batch_first: bool) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def test_torch_transformers_run_clean_with_the_op_trace():
    torch.manual_seed(0)
    for model, args in [(_encoder(True), (torch.randn(2, 7, 32),)),
                        (nn.Transformer(32, 4, 1, 1, 64, batch_first=True), (torch.randn(2, 7, 32), torch.randn(2, 5, 32))),
                        (nn.LSTM(8, 16, 2, batch_first=True), (torch.randn(2, 5, 8),))]:
        report = layerlab.inspect(model, *args, ops=True)
        assert report.ok and report.failure is None and report.ops == [], type(model).__name__


def test_seq_first_encoder_given_batch_first_data_gets_batch_first_verified():
    model, x = _encoder(False), torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    report = layerlab.inspect(model, x, src_key_padding_mask=pad)
    f, d = report.failure, report.failure.diagnosis
    assert f.path == "layers.0.self_attn" and d.cause == "layout"
    assert d.hint.startswith("construct layers.0 (TransformerEncoderLayer) with batch_first=True")
    v = d.verified
    assert v.status == "runs" and [s.where for s in v.steps] == ["layers.0.self_attn", "layers.1.self_attn"]
    fixed = apply_fixes(model, v.steps)
    hand = _encoder(True)
    hand.load_state_dict(model.state_dict())
    torch.testing.assert_close(fixed(x, src_key_padding_mask=pad), hand(x, src_key_padding_mask=pad))


def test_an_integer_hugging_face_style_padding_mask_becomes_mask_eq_0():
    model, x = _encoder(True), torch.randn(2, 7, 32)
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[1, 5:] = 0  # 1 = a real token, 0 = padding
    report = layerlab.inspect(model, x, src_key_padding_mask=keep)
    d = report.failure.diagnosis
    assert report.failure.path == "" and d.cause == "mask-dtype"
    assert d.fix.code == "mask == 0" and d.hint == "pass src_key_padding_mask=mask == 0 (bool, True = ignore)"
    assert d.verified.status == "runs"
    fixed = apply_fixes(model, d.verified.steps)
    torch.testing.assert_close(fixed(x, src_key_padding_mask=keep), model(x, src_key_padding_mask=keep == 0))


# -- Hugging Face transformers, built from small configs --------------------------------------------
def _hf():
    return pytest.importorskip("transformers", reason="Hugging Face transformers is not installed (pip install transformers)")


def _ids():
    return torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(0))


def test_hugging_face_models_run_clean_with_the_op_trace():
    tf = _hf()
    torch.manual_seed(0)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    models = [
        (tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)), {}),
        (tf.BertModel(tf.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                    intermediate_size=128, vocab_size=100)), {"attention_mask": mask}),
        (tf.LlamaModel(tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=100)), {}),
    ]
    for model, kwargs in models:
        report = layerlab.inspect(model, _ids(), ops=True, **kwargs)
        assert report.failure is None, (type(model).__name__, report.failure)
        assert report.ops, type(model).__name__  # their own code's ops are recorded
        assert all(o.status == "ok" for o in report.ops)


def test_hugging_face_gpt2_given_float_ids_gets_long_verified():
    tf = _hf()
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=100, n_positions=32)).eval()
    ids = _ids()
    report = layerlab.inspect(model, ids.float())
    f, d = report.failure, report.failure.diagnosis
    assert f.path == "wte" and d.cause == "dtype" and d.fix.code == "x.long()"
    assert d.verified.status == "runs" and d.verified.outputs[0] == [2, 10, 32]
    fixed = apply_fixes(model, d.verified.steps)
    torch.testing.assert_close(fixed(ids.float()).last_hidden_state, model(ids).last_hidden_state)


def test_hugging_face_embeddings_into_conv1d_get_a_transpose_not_a_size():
    tf = _hf()
    torch.manual_seed(0)
    bert = tf.BertModel(tf.BertConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=100))
    model = nn.Sequential(bert.embeddings, nn.Conv1d(64, 8, 3)).eval()
    report = layerlab.inspect(model, _ids())
    d = report.failure.diagnosis
    assert report.failure.path == "1" and d.cause == "layout"
    assert d.fix.code == "x.transpose(1, 2)" and "in_channels=10" not in d.hint
    assert d.verified.status == "runs" and d.verified.outputs == [[2, 8, 8]]
    fixed = apply_fixes(model, d.verified.steps)
    torch.testing.assert_close(fixed(_ids()), model[1](model[0](_ids()).transpose(1, 2)))
