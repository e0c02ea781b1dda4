"""The ONNX column of export-check graded against plain ``torch.onnx.export`` + onnxruntime.

Every test computes its truth in the test itself: the model is exported with torch's own exporter
(``dynamo=True``, as the column does) and run by an ``onnxruntime.InferenceSession`` built here
from the ONNX bytes, then compared with eager. The column must agree: a pass where plain ONNX
matches, a fail where plain export raises, with the op and the user's line named.
"""

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("onnx", reason="the ONNX extra is not installed (pip install 'layerlab[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the ONNX extra is not installed (pip install 'layerlab[onnx]')")
pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")

from layerlab.checks.report import Status  # noqa: E402
from layerlab.deploy.run import export_check  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return f"tests/export/test_onnx_audit.py:{start + next(i for i, ln in enumerate(lines) if text in ln)}"


def _plain_onnx(model, args, kwargs=None, dynamic_shapes=None, run_args=None):
    """onnxruntime's outputs (a flat tensor list) with torch's exporter, no layerlab; the model is
    exported from ``args`` and run on ``run_args`` (default: the same)."""
    from torch.utils._pytree import tree_flatten

    model = model.eval()
    kwargs = kwargs or {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, kwargs=kwargs or None, dynamo=True, verbose=False,
                                    dynamic_shapes=dynamic_shapes)
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    tensors = [t for t in tree_flatten((run_args or args, kwargs))[0] if isinstance(t, torch.Tensor)]
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), tensors)}
    got = [torch.from_numpy(o) for o in session.run(None, feeds)]
    return got


def _cell(model, *args, **kwargs):
    return export_check(model, *args, paths=["onnx"], **kwargs).paths[0]


# -- failures: the op, the step, the line ------------------------------------------------------------

class Eigh(nn.Module):
    def forward(self, x):
        a = x @ x.transpose(-1, -2) + torch.eye(x.shape[-1])
        return torch.linalg.eigh(a).eigenvalues  # no ONNX translation


class SignBranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent: torch.export (step 1 of the exporter) refuses it
            return x * 2
        return x - 1


def test_op_without_onnx_translation_names_the_op_and_the_line():
    x = torch.randn(2, 4, 4)
    with pytest.raises(Exception, match="No ONNX function found for .*_linalg_eigh"):
        _plain_onnx(Eigh(), (x,))
    cell = _cell(Eigh(), x)
    assert cell.status == Status.FAIL
    assert "no ONNX translation for aten._linalg_eigh" in cell.reason, cell.reason
    assert cell.where == _line_of(Eigh.forward, "torch.linalg.eigh(a)")
    assert "custom_translation_table" in cell.hint


def test_data_dependent_branch_is_blamed_on_torch_export_not_on_a_missing_op():
    x = torch.randn(2, 6)
    with pytest.raises(Exception, match="step 1/3"):
        _plain_onnx(SignBranch(), (x,))
    cell = _cell(SignBranch(), x)
    assert cell.status == Status.FAIL
    assert "torch.export (the exporter's step 1/3)" in cell.reason and "GuardOnDataDependent" in cell.reason
    assert cell.where == _line_of(SignBranch.forward, "if x.sum() > 0")
    assert "torch.cond" in cell.hint and "ONNX translation" not in cell.hint


# -- stock models: no false alarm where plain ONNX matches eager ------------------------------------

class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class UpShuffleNorm(nn.Module):
    """bilinear (align_corners both ways) → PixelShuffle → GroupNorm → LayerNorm."""

    def __init__(self):
        super().__init__()
        self.conv, self.shuffle = nn.Conv2d(3, 16, 1), nn.PixelShuffle(2)
        self.gn, self.ln = nn.GroupNorm(2, 4), nn.LayerNorm(22)

    def forward(self, x):
        y = F.interpolate(self.conv(x), scale_factor=2, mode="bilinear", align_corners=True)
        y = F.interpolate(y, size=(13, 11), mode="bilinear", align_corners=False)
        return self.ln(self.gn(self.shuffle(y)))


class BoolIndex(nn.Module):
    def forward(self, x):
        return x[x > 0] * 2  # output length depends on the values: ONNX has NonZero


@pytest.mark.parametrize("make, shape, batch_dim", [
    (ConvBnRelu, (2, 3, 16, 16), 0),
    (lambda: nn.GRU(8, 16, num_layers=2, bidirectional=True), (6, 2, 8), 1),  # seq-first: batch is dim 1
    (UpShuffleNorm, (2, 3, 6, 5), 0),
    (BoolIndex, (2, 6), 0),
], ids=["conv_bn_relu", "gru_bidirectional", "upsample_shuffle_norms", "boolean_index"])
def test_stock_models_pass_where_plain_onnx_matches_eager(make, shape, batch_dim):
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(shape)
    wider = list(shape)
    wider[batch_dim] += 1
    x3 = torch.randn(wider)
    dyn = {"x" if isinstance(model, (ConvBnRelu, UpShuffleNorm, BoolIndex)) else "input":
           {batch_dim: torch.export.Dim("batch")}}
    for inp in (x, x3):  # the truth: plain ONNX with a dynamic batch matches eager at both batch sizes
        with torch.no_grad():
            eager = model(inp)
        eager = list(eager) if isinstance(eager, tuple) else [eager]
        got = _plain_onnx(model, (x,), dynamic_shapes=dyn, run_args=(inp,))
        for e, g in zip(eager, got):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    cell = _cell(model, x)
    assert cell.status == Status.PASS, cell.reason
    assert cell.matches_eager is True and "dynamic batch" in cell.reason and "batch 2 and 3" in cell.reason


def test_transformer_padding_mask_pass_says_eager_no_grad_differs_at_padding():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(2, 7, 16)
    pad = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    got = _plain_onnx(model, (x,), {"src_key_padding_mask": pad})[0]
    with warnings.catch_warnings():  # "nested tensors are a prototype"
        warnings.simplefilter("ignore")
        with torch.no_grad():
            fast = model(x, src_key_padding_mask=pad)  # inference fast path: padded positions 0
        regular = model(x, src_key_padding_mask=pad).detach()  # autograd on: the path export traces
    torch.testing.assert_close(got, regular, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[~pad], fast[~pad], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(got[pad], fast[pad])  # the truth: they differ exactly at the padding
    cell = _cell(model, x, src_key_padding_mask=pad)
    assert cell.status == Status.PASS, cell.reason
    assert cell.details.get("fast_path_differs") is True and "padded positions" in cell.reason


def test_tiny_bert_from_config_passes_like_plain_onnx():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32)
    model = transformers.BertModel(cfg).eval()
    ids, mask = torch.randint(0, 100, (2, 7)), torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask).to_tuple()
    got = _plain_onnx(model, (), {"input_ids": ids, "attention_mask": mask})
    for e, g in zip(eager, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    cell = _cell(model, input_ids=ids, attention_mask=mask)
    assert cell.status == Status.PASS, cell.reason
