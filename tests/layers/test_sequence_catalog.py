"""The sequence entries of the registry: each builds, runs on its default inputs and equals its reference."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from layerlab.catalog.sequence import ENTRIES
from tests.layers._seq_helpers import F64


def _make_inputs(spec: dict) -> dict:
    """The registry's input mapping, read the simple way: randn shapes, same_as, float causal masks."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, item in spec.items():
        if "same_as" in item:
            out[name] = out[item["same_as"]]
        elif "causal" in item:
            L = item["causal"]
            out[name] = torch.zeros(L, L, dtype=F64).masked_fill(torch.ones(L, L).triu(1).bool(), float("-inf"))
        else:
            out[name] = torch.randn(item["shape"], generator=g, dtype=F64)
    return out


def test_catalog_does_not_import_torch():
    code = "import sys, layerlab.catalog.sequence as s; assert s.ENTRIES; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_names_and_tags():
    names = [e.name for e in ENTRIES]
    assert names == ["rnn_cell", "lstm_cell", "gru_cell", "rnn", "lstm", "gru", "scaled_dot_product_attention",
                     "multihead_attention", "transformer_encoder_layer", "sinusoidal_positional_encoding",
                     "learned_positional_embedding"]
    tags = {e.name: set(e.tags) for e in ENTRIES}
    assert {"recurrent", "causal"} <= tags["lstm"] and "stochastic" in tags["transformer_encoder_layer"]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_runs_and_equals_its_reference(entry):
    torch.manual_seed(0)
    layer = entry.load()(**entry.args).to(F64).eval()
    inputs = _make_inputs(entry.inputs)
    out = layer(**inputs)
    first = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(first).all()
    if entry.reference is None:
        return
    ref = layer.to_torch().eval()
    assert isinstance(ref, entry.load_reference())
    torch.testing.assert_close(ref(**inputs), out)
