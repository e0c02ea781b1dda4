"""export-check verdicts that must not mislead: an output torch cannot flatten gets the real fix
(use_cache=False, or register the pytree), and "equals eager" against a constant output is not a
pass (the all-zero parameters of a copy are re-initialised so the comparison means something)."""

import importlib.util

import pytest
import torch
from rich.console import Console
from torch import nn

from layerlab.checks.report import Status
from layerlab.cli import render_export
from layerlab.deploy.run import export_check
from tests.export.modules import LengthScale, SignBranch

HAS_ORT = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime"))

pytestmark = pytest.mark.usefixtures("one_thread")


def _cells(report):
    return {p.path: p for p in report.paths}


def _tiny_gpt2(transformers):
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=50,
                                     bos_token_id=0, eos_token_id=0)
    assert config.use_cache  # the default: the model returns a DynamicCache
    torch.manual_seed(0)
    return transformers.GPT2Model(config)


def test_hf_kv_cache_output_says_use_cache_false():
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    model, ids = _tiny_gpt2(transformers), torch.randint(0, 50, (2, 8))
    cells = _cells(export_check(model, ids, paths=["trace", "export", "export_dynamic", "onnx"]))
    for path in ("export", "export_dynamic") + (("onnx",) if HAS_ORT else ()):
        cell = cells[path]
        assert cell.status == Status.FAIL, (path, cell.reason)
        assert "DynamicCache" in cell.reason  # torch's own words stay the reason
        assert "transformers.cache_utils.DynamicCache" in cell.hint and "use_cache=False" in cell.hint, cell.hint
        assert "register_pytree_node" in cell.hint
        assert "torch.cond" not in cell.hint and "ONNX translation" not in cell.hint
    assert cells["trace"].status == Status.FAIL and "use_cache=False" in cells["trace"].hint
    assert cells["trace"].reason.endswith("Tracer cannot infer type of BaseModelOutputWithPastAndCrossAttentions")
    # the hint's fix works: without the cache both exports pass
    fixed = _cells(export_check(model, ids, use_cache=False, paths=["export", "export_dynamic"]))
    assert fixed["export"].status == Status.PASS and fixed["export_dynamic"].status == Status.PASS


def test_encoder_decoder_cache_output_says_use_cache_false():
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    config = transformers.T5Config(d_model=16, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=8,
                                   vocab_size=50, decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 6))
    cell = export_check(transformers.T5Model(config), input_ids=ids, decoder_input_ids=ids, paths=["export"]).paths[0]
    assert cell.status == Status.FAIL
    assert "EncoderDecoderCache" in cell.hint and "use_cache=False" in cell.hint, cell.hint


def test_other_export_failures_keep_their_hint():
    torch.manual_seed(0)
    cell = export_check(SignBranch(), torch.randn(2, 4), paths=["export"]).paths[0]
    assert cell.status == Status.FAIL and "torch.cond" in cell.hint and "use_cache" not in cell.hint


def _zero_head():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    nn.init.zeros_(model[2].weight)
    nn.init.zeros_(model[2].bias)
    return model


def test_zero_initialised_head_is_checked_on_a_reinitialised_copy():
    model = _zero_head()
    x = torch.randn(2, 4)
    assert not model(x).any()  # eager's output ≡ 0: matching it would prove nothing
    report = export_check(model, x, paths=["trace", "script", "export", "export_dynamic"])
    assert report.settings["reinitialised"] == ["2.weight", "2.bias"]
    assert "constant (≡ 0)" in report.settings["notes"][0] and "re-initialised" in report.settings["notes"][0]
    for cell in report.paths:
        assert cell.status == Status.PASS, (cell.path, cell.reason)
        assert cell.details["reinitialised"] == ["2.weight", "2.bias"] and "re-initialised" in cell.reason
        # the comparisons were made on outputs that are not all zero
        assert any(c["expected_at_max"] not in (None, 0.0) for c in cell.comparisons), cell.comparisons
    assert not model[2].weight.any() and not model[2].bias.any()  # the user's module is left as it was
    console = Console(width=160, color_system=None, record=True)
    for part in render_export.report(report):
        console.print(part)
    assert "note: the layer's output is constant (≡ 0)" in console.export_text()


def test_reinitialising_exposes_what_a_zero_head_hides():
    """A trace that freezes the length (x / √T) equals eager at another length when the head is
    zero (0 = 0); with the head re-initialised the frozen length shows."""
    model = nn.Sequential(LengthScale(), nn.Linear(4, 3))
    nn.init.zeros_(model[1].weight)
    nn.init.zeros_(model[1].bias)
    cell = export_check(model, torch.randn(2, 5, 4), paths=["trace"]).paths[0]
    assert cell.status == Status.WARN and cell.reason.startswith("input-specific: at length 5 → 4"), cell.reason


def test_constant_output_without_zero_parameters_is_a_warning_not_a_pass():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Threshold(1e9, 0.0))  # every value below 1e9 becomes 0
    report = export_check(model, torch.randn(2, 4), paths=["trace", "export"])
    assert report.settings["constant_output"] == "≡ 0" and "reinitialised" not in report.settings
    for cell in report.paths:
        assert cell.status == Status.WARN, (cell.path, cell.reason)
        assert cell.matches_eager is True and "constant (≡ 0), so equal outputs prove nothing" in cell.reason
    assert report.ok and not report.ok_for(strict=True)


def test_a_varying_output_is_left_alone():
    torch.manual_seed(0)
    report = export_check(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), torch.randn(2, 4),
                          paths=["export"])
    assert report.paths[0].status == Status.PASS and "notes" not in report.settings
    assert "vacuous" not in report.paths[0].details


def test_a_dict_output_under_strict_tracing_gets_the_return_dict_hint_and_the_hint_works():
    tf = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    config = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 8))
    report = export_check(tf.BertModel(tf.BertConfig(**config)), ids, paths=["trace"])
    trace = report.paths[0]
    assert trace.status.value == "fail" and "return_dict=False" in trace.hint and "torch.cond" not in trace.hint
    fixed = export_check(tf.BertModel(tf.BertConfig(return_dict=False, **config)), ids, paths=["trace"])
    assert fixed.paths[0].status.value in ("pass", "warn"), fixed.paths[0].reason
