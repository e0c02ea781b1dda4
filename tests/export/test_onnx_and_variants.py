"""The ONNX column with and without the optional extra, and the input variants."""

import importlib.util

import pytest
import torch
from torch import nn

from layerlab.checks.case import Arg
from layerlab.checks.report import Status
from layerlab.deploy import onnx as onnx_path
from layerlab.deploy.run import export_check
from layerlab.deploy.variants import make_variants


def test_without_the_extra_the_column_says_how_to_enable_it(monkeypatch):
    monkeypatch.setattr(onnx_path, "missing", lambda: ["onnxruntime"])
    cell = export_check(nn.Linear(3, 2), torch.randn(2, 3), paths=["onnx"]).paths[0]
    assert cell.status == Status.SKIP
    assert "onnxruntime not installed" in cell.reason and "pip install 'layerlab[onnx]'" in cell.reason
    assert cell.hint == onnx_path.INSTALL_HINT


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None,
                    reason="the ONNX extra is not installed (pip install 'layerlab[onnx]')")
def test_onnx_roundtrip_through_onnxruntime():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    cell = export_check(m, torch.randn(2, 3, 8, 8), paths=["onnx"]).paths[0]
    assert cell.status == Status.PASS, cell.reason
    assert cell.matches_eager and cell.comparisons[0]["max_abs_diff"] < 1e-4


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None,
                    reason="the ONNX extra is not installed (pip install 'layerlab[onnx]')")
def test_onnx_legacy_exporter_without_onnxscript(monkeypatch):
    monkeypatch.setattr(onnx_path, "has_onnxscript", lambda: False)
    cell = export_check(nn.Linear(3, 2), torch.randn(2, 3), paths=["onnx"]).paths[0]
    assert cell.details["exporter"] == "TorchScript-based (dynamo=False)"
    assert cell.status == Status.PASS, cell.reason


def test_variants_of_a_sequence_with_a_causal_mask():
    q = torch.randn(2, 10, 16)
    mask = torch.triu(torch.full((10, 10), float("-inf")), 1)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    args = [Arg("query", q), Arg("key", q), Arg("value", q), Arg("attn_mask", mask, True)]
    variants = {v.name: v for v in make_variants(mha, args)}
    assert set(variants) == {"batch", "length", "values"}
    batch = variants["batch"].args
    assert batch[0].value.shape == (3, 10, 16) and batch[1].value is batch[0].value  # shared input stays shared
    assert batch[3].value is mask  # no batch dim: unchanged
    length = variants["length"].args
    assert length[0].value.shape == (2, 9, 16)
    assert torch.equal(length[3].value, mask[:9, :9])  # masks are cut, not redrawn: still causal
    assert torch.equal(variants["values"].args[0].value, -q)


def test_variants_of_an_image_and_of_token_ids():
    img = [Arg("input", torch.randn(2, 3, 16, 16))]
    v = {x.name: x for x in make_variants(nn.Conv2d(3, 4, 3), img)}
    assert v["length"].args[0].value.shape == (2, 3, 15, 15) and v["batch"].args[0].value.shape == (3, 3, 16, 16)
    ids = [Arg("input", torch.randint(0, 7, (4, 5)))]
    v = {x.name: x for x in make_variants(nn.Embedding(7, 3), ids)}
    new = v["batch"].args[0].value
    assert new.shape == (5, 5) and int(new.max()) < 7  # ids stay in range
    assert "values" not in v  # nothing floating to negate
