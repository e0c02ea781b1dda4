"""No false alarms: stock torch.nn layers (tests/checks/stock_configs.py) and a tiny Hugging Face GPT-2
pass train-check, or pass with a warning whose reason is stated."""

import pytest
import torch

from layerlab.train.run import train_check
from tests.checks.stock_configs import ENTRIES

_BY_ID = {e[0]: e for e in ENTRIES}
CLEAN = ["Linear", "Conv2d", "LazyConv2d", "LSTM", "GRU-hx", "TransformerEncoderLayer", "BatchNorm2d",
         "Embedding-padding_idx", "MultiheadAttention-self"]


def _run(id_, **kw):
    _, build, inputs, kwargs, _ = _BY_ID[id_]
    torch.manual_seed(0)
    return train_check(build(), *inputs(), **kwargs, **kw)


@pytest.mark.parametrize("id_", CLEAN)
def test_stock_layer_passes_without_findings(id_):
    report = _run(id_)
    assert report.ok, [(f.code, f.where, f.message) for f in report.flags]
    assert report.flags == [], [(f.code, f.where) for f in report.flags]
    assert report.fit.verdict in ("overfits", "falls")
    assert report.losses[-1] < report.losses[0]


def test_rnn_cell_zero_state_is_a_warning_with_its_reason():
    # hx omitted → h0 = 0, so weight_hh multiplies zeros: its gradient is exactly 0, truly (not a bug)
    report = _run("RNNCell")
    assert report.ok
    (flag,) = report.flags
    assert flag.code == "zero-grad" and flag.severity == "warning"
    assert flag.data["params"] == ["weight_hh"] and "hidden state" in flag.message


def test_prelu_with_one_parameter_is_not_failed_for_a_flat_loss():
    report = _run("PReLU")
    assert report.ok
    assert [f.code for f in report.flags] in ([], ["loss-flat"], ["loss-slow"])
    for f in report.flags:
        assert f.severity == "warning" and "trainable values" in f.message


def _gpt2(tf):
    config = tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(config)


def test_hf_gpt2_with_labels_trains_on_its_own_loss():
    tf = pytest.importorskip("transformers", reason="needs Hugging Face transformers")
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    model = _gpt2(tf)
    report = train_check(model, input_ids=ids, labels=ids)
    assert report.loss == "model" and report.output == "output['loss']"
    assert report.ok, [(f.code, f.where, f.message) for f in report.flags]
    assert report.flags == []
    assert report.fit.verdict == "overfits"
    # the first loss is the model's own cross-entropy on its untouched weights (dropout off to compare)
    expected = _gpt2(tf).eval()(input_ids=ids, labels=ids).loss.item()
    assert report.losses[0] == pytest.approx(expected, rel=0.1)


def test_hf_gpt2_in_eval_mode_warns_that_dropout_is_off():
    tf = pytest.importorskip("transformers", reason="needs Hugging Face transformers")
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    report = train_check(_gpt2(tf).eval(), input_ids=ids, labels=ids, steps=10)
    assert report.ok
    assert [f.code for f in report.flags] == ["eval-mode"]
    assert "dropout is inactive" in report.flags[0].message
