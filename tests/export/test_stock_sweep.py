"""export-check on stock models nobody here wrote: each verdict checked against plain torch on the same model.

The truth is computed in each test with torch itself (``torch.jit.trace`` / ``script`` /
``torch.export`` on a copy, run on the example and compared with eager), never hard-coded. Where a
path fails in torch too, the test checks that layerlab says whose limitation it is (torch's or
transformers', not the user's) and that the fix it names works. ``torch.compile`` is left out: it
costs seconds per model here and the sweep in the audit found no disagreement on it.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from layerlab import export_check
from layerlab.checks.report import Status

FAST_PATHS = ["trace", "script", "export"]


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _flat(v)]
    return []


def _plain_torch(path: str, model: nn.Module, args: tuple, kwargs: dict) -> bool:
    """Does ``path`` build, run on the example and equal eager (layerlab's float32 tolerances), in plain torch?"""
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        expected = model(*args, **kwargs)
        try:
            if path == "trace":
                program = torch.jit.trace(model, args, check_trace=False)
            elif path == "script":
                program = torch.jit.script(model)
            else:
                program = torch.export.export(model, args, kwargs).module()
            got = program(*args, **kwargs)
        except Exception:
            return False
    pairs = list(zip(_flat(got), _flat(expected)))
    return len(_flat(got)) == len(_flat(expected)) and all(
        torch.allclose(a, e, rtol=1e-4, atol=1e-5) if e.is_floating_point() else torch.equal(a, e) for a, e in pairs)


class _EmbeddingAndBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8, padding_idx=0)
        self.bag = nn.EmbeddingBag(50, 8, mode="mean")

    def forward(self, ids):
        return self.emb(ids).sum(1) + self.bag(ids)


def _encoder():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)


STOCK = {
    "conv_bn_relu": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                           nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)),
                     lambda: (torch.randn(2, 3, 12, 12),)),
    "embedding_bag": (_EmbeddingAndBag, lambda: (torch.randint(0, 50, (2, 7)),)),
    "pixel_shuffle": (lambda: nn.Sequential(nn.Conv2d(3, 12, 3, padding=1), nn.PixelShuffle(2)),
                      lambda: (torch.randn(2, 3, 6, 6),)),
    "upsample_bilinear": (lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.Upsample(scale_factor=2, mode="bilinear")),
                          lambda: (torch.randn(2, 3, 6, 6),)),
    "groupnorm": (lambda: nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU()),
                  lambda: (torch.randn(2, 4, 6, 6),)),
    "gru_bidirectional": (lambda: nn.GRU(8, 16, batch_first=True, bidirectional=True), lambda: (torch.randn(2, 5, 8),)),
    "transformer_encoder": (_encoder, lambda: (torch.randn(2, 6, 16),)),
}


@pytest.mark.parametrize("name", sorted(STOCK))
def test_stock_verdicts_agree_with_plain_torch(name):
    build, inputs = STOCK[name]
    torch.manual_seed(0)
    model, args = build().eval(), inputs()
    report = export_check(model, *args, paths=FAST_PATHS)
    for cell in report.paths:
        works = _plain_torch(cell.path, model, args, {})
        if works:  # a path torch runs and that equals eager is never a failure (a warn says input-specific)
            assert cell.status in (Status.PASS, Status.WARN), (name, cell.path, cell.reason)
        else:
            assert cell.status == Status.FAIL, (name, cell.path, cell.reason)


def test_bare_lstm_script_failure_is_torchs_and_the_named_fix_works():
    torch.manual_seed(0)
    lstm, x = nn.LSTM(8, 16, batch_first=True, bidirectional=True).eval(), torch.randn(2, 5, 8)
    assert not _plain_torch("script", lstm, (x,), {})  # torch itself: the bare LSTM scripts but cannot run

    cell = export_check(lstm, x, paths=["script"]).paths[0]
    assert cell.status == Status.FAIL
    assert "bare torch.nn.LSTM" in cell.hint and "not your code" in cell.hint and "holds it" in cell.hint, cell.hint

    class Holder(nn.Module):  # the fix the hint names: script the model that holds the LSTM
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, x):
            return self.rnn(x)[0]

    assert _plain_torch("script", Holder(lstm), (x,), {})
    assert export_check(Holder(lstm), x, paths=["script"]).paths[0].status == Status.PASS


def test_a_bool_forward_argument_is_named_and_binding_it_makes_the_trace_work():
    torch.manual_seed(0)
    mha, q = nn.MultiheadAttention(16, 2, batch_first=True).eval(), torch.randn(2, 5, 16)
    with pytest.raises(RuntimeError, match="Got bool"):  # torch itself refuses the flag
        torch.jit.trace(mha, example_kwarg_inputs={"query": q, "key": q, "value": q, "need_weights": False})

    cell = export_check(mha, q, q, q, need_weights=False, paths=["trace"]).paths[0]
    assert cell.status == Status.FAIL and "need_weights=False" in cell.hint and "bind it" in cell.hint, cell.hint

    class Bound(nn.Module):  # the hint's fix: the flag bound before tracing
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, q, k, v):
            return functools.partial(self.inner, need_weights=False)(q, k, v)[0]

    assert _plain_torch("trace", Bound(mha), (q, q, q), {})
    assert export_check(Bound(mha), q, q, q, paths=["trace"]).paths[0].status in (Status.PASS, Status.WARN)


def test_nn_transformer_export_failure_points_into_torch_not_at_generated_code():
    torch.manual_seed(0)
    model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True).eval()
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 5, 16)
    kwargs = {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(5)}
    assert not _plain_torch("export", model, (src, tgt), kwargs)  # torch's own data-dependent guard

    cell = export_check(model, src, tgt, paths=["export"], **kwargs).paths[0]
    assert cell.status == Status.FAIL
    assert cell.where is None or not cell.where.startswith("<"), cell.where  # not "<string>:1"
    assert "torch.nn.Transformer is torch's own module" in cell.hint and "torch.cond" not in cell.hint, cell.hint


def test_a_user_module_failing_in_its_own_code_keeps_the_path_hint():
    class Branchy(nn.Module):  # the user's own data-dependent branch: the hint must not blame torch
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    x = torch.randn(2, 4)
    assert not _plain_torch("export", Branchy(), (x,), {})  # torch.export refuses the branch on a value
    cell = export_check(Branchy(), x, paths=["export"]).paths[0]
    assert cell.status == Status.FAIL and "own module" not in (cell.hint or ""), cell.hint
    assert cell.where and "test_stock_sweep.py" in cell.where, cell.where  # the user's line


def test_transformers_script_failure_is_attributed_to_transformers_and_export_agrees_with_torch():
    tf = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=32)
    model, ids = tf.BertModel(config).eval(), torch.randint(0, 100, (2, 7))
    report = export_check(model, ids, paths=["script", "export"])
    script, export = report.paths
    assert not _plain_torch("script", model, (ids,), {})
    assert script.status == Status.FAIL and "transformers model" in script.hint, script.hint
    assert "annotate arguments" not in script.hint  # not the user's code to annotate
    assert (export.status == Status.PASS) == _plain_torch("export", model, (ids,), {}), export.reason


def test_transformers_dict_output_trace_hint_offers_strict_false_and_it_works():
    tf = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    torch.manual_seed(0)
    config = tf.ViTConfig(image_size=8, patch_size=4, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64)
    model, pixels = tf.ViTModel(config).eval(), torch.randn(2, 3, 8, 8)
    cell = export_check(model, pixels, paths=["trace"]).paths[0]
    assert cell.status == Status.FAIL and "strict=False" in cell.hint, cell.hint  # torch's default strict trace fails
    with torch.no_grad():  # the fix the hint names, in plain torch: it traces and equals eager
        traced = torch.jit.trace(model, (pixels,), strict=False, check_trace=False)
        for got, want in zip(_flat(traced(pixels)), _flat(model(pixels))):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert "with strict=False it traces and equals eager on the example" in cell.reason, cell.reason
    assert cell.details["strict_false"].endswith("(checked)")


class _KeysBySign(torch.nn.Module):
    """A dict whose keys depend on the input: the strict=False trace bakes in one of them."""

    def forward(self, x):
        return {"pos": x * 2} if bool(x.sum() > 0) else {"neg": x * 3}


def test_strict_false_retry_says_when_the_relaxed_trace_is_input_specific():
    x = torch.ones(2, 3)
    with torch.no_grad():  # the truth: the relaxed trace runs, and returns "pos" for a negative input too
        traced = torch.jit.trace(_KeysBySign(), (x,), strict=False, check_trace=False)
        assert set(traced(-x)) == {"pos"} and set(_KeysBySign()(-x)) == {"neg"}
    cell = export_check(_KeysBySign(), x, paths=["trace"]).paths[0]
    assert cell.status == Status.FAIL
    assert "with strict=False it traces and equals eager on the example, but at " in cell.reason, cell.reason
    assert not cell.details["strict_false"].endswith("(checked)")
