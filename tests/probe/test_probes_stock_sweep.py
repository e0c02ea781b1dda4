"""No false alarms: ``attention, sparsity, dead, rank`` over torch's stock modules (train and eval)
and tiny Hugging Face models warn about nothing (notes, which need no action, are allowed)."""

from __future__ import annotations

import pytest
import torch

import layerlab
from tests.checks.stock_configs import ENTRIES

PROBES = ["attention", "sparsity", "dead", "rank"]
PROBE_CODES = {"dead-units", "saturated-units", "rank-collapse"}


def _probe_warnings(report):
    ours = {f.code for r in report.probes for f in r.findings}
    return [f"{p.code} at {p.where}: {p.message}" for p in report.problems if p.code in ours | PROBE_CODES]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_no_probe_warning_on_stock_torch_modules(mode):
    found = {}
    for id_, build, inputs, kwargs, _ in ENTRIES:
        torch.manual_seed(0)
        module = build().train(mode == "train")
        report = layerlab.inspect(module, *inputs(), probes=PROBES, fix=False, **kwargs)
        assert len(report.probes) == 4, id_
        warnings = _probe_warnings(report)
        if warnings:
            found[id_] = warnings
    assert found == {}


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_no_probe_warning_on_tiny_hugging_face_models(kind, attn):
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=100, attn_implementation=attn))
    else:
        model = transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=100,
            max_position_embeddings=64, attn_implementation=attn))
    ids = torch.randint(0, 100, (4, 32), generator=torch.Generator().manual_seed(0))
    for mode in ("train", "eval"):
        report = layerlab.inspect(model, ids, probes=PROBES, mode=mode, fix=False)
        assert len(report.probe("attention").rows) == 2
        assert _probe_warnings(report) == []
