"""The ONNX column at another batch size.

torch's default ONNX exporter, given ``Dim("batch")`` for a forward that pins the batch size, does
not raise: it exports static shapes, and onnxruntime refuses every other batch. The tests show
that with plain torch and onnxruntime first, then that the cell warns (never a pass).
"""

import importlib.util
import warnings

import pytest
import torch
from torch import nn

from layerlab.checks.report import Status
from layerlab.deploy.run import export_check

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnxscript") is None,
    reason="the ONNX extra is not installed (pip install 'layerlab[onnx]')")


class LoopOverSamples(nn.Module):
    """A per-sample Python loop: the trace unrolls it for the example's batch."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        return torch.stack([self.fc(x[i].flatten()) for i in range(x.shape[0])])


class Flattened(nn.Module):
    """The same computation, vectorised over the batch."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        return self.fc(x.flatten(1))


def _plain_dynamic_export(model, x):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return torch.onnx.export(model, (x,), dynamo=True, verbose=False,
                                 dynamic_shapes={"x": {0: torch.export.Dim("batch")}})


def test_a_pinned_batch_is_exported_static_without_a_word_and_the_cell_warns():
    torch.manual_seed(0)
    model, x = LoopOverSamples().eval(), torch.randn(4, 3, 4)
    program = _plain_dynamic_export(model, x)  # the truth: no exception from the exporter …
    with pytest.raises(Exception, match="invalid dimensions"):  # … and onnxruntime refuses batch 5
        program(torch.randn(5, 3, 4))
    assert model(torch.randn(5, 3, 4)).shape == (5, 3)  # while eager runs at batch 5
    cell = export_check(model, x, paths=["onnx"]).paths[0]
    assert cell.status == Status.WARN, cell.reason
    assert "only takes batch 4" in cell.reason and "fell back to static shapes" in cell.reason
    assert "loop over samples" in cell.hint
    assert cell.where.endswith("test_onnx_dynamic_batch.py:31"), cell.where  # the loop's line


def test_the_vectorised_model_passes_at_both_batch_sizes():
    torch.manual_seed(0)
    model, x = Flattened().eval(), torch.randn(4, 3, 4)
    program = _plain_dynamic_export(model, x)
    x5 = torch.randn(5, 3, 4)
    torch.testing.assert_close(program(x5)[0], model(x5).detach(), rtol=1e-4, atol=1e-5)
    cell = export_check(model, x, paths=["onnx"]).paths[0]
    assert cell.status == Status.PASS, cell.reason
    assert cell.reason.startswith("exported with a dynamic batch") and "batch 4 and 5" in cell.reason
    assert cell.details["dynamic_batch"] == ["x"]


def test_batch_of_one_is_exported_static_and_says_so():
    """torch.export cannot mark a size below 2 dynamic: the cell keeps static shapes."""
    torch.manual_seed(0)
    cell = export_check(Flattened().eval(), torch.randn(1, 3, 4), paths=["onnx"]).paths[0]
    assert cell.status == Status.PASS and "static shapes" in cell.reason


def test_hf_bert_from_a_config_exports_with_a_dynamic_batch():
    """No false alarm on a stock model: a tiny BERT's ONNX model takes batch 2 and 3."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed ([hf] extra)")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 50, (2, 7))
    cell = export_check(model, ids, paths=["onnx"]).paths[0]
    assert cell.status == Status.PASS, cell.reason
    assert "dynamic batch" in cell.reason and "batch 2 and 3" in cell.reason
