"""Audit round 2: export-check on models that break an export path the way real code does, and on
healthy ones. Each verdict was first established with plain torch (the path raises, or its program
differs from eager at another input); tests that depend on a torch fact re-check that fact here."""

import io
import itertools
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from layerlab.checks.report import Status
from layerlab.deploy.run import export_check

pytestmark = pytest.mark.usefixtures("one_thread")

TORCH_PATHS = ["trace", "script", "compile", "export", "export_dynamic"]
P, W, F = Status.PASS, Status.WARN, Status.FAIL


def _cells(module, *inputs, **kwargs):
    torch.manual_seed(0)
    report = export_check(module, *inputs, paths=TORCH_PATHS, **kwargs)
    return report, {p.path: p for p in report.paths}


def _statuses(cells):
    return {name: c.status for name, c in cells.items()}


# -- the broken ones ---------------------------------------------------------------------------------

class DataBranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class LoopOverBatch(nn.Module):
    def forward(self, x):
        return torch.stack([x[i] * (i + 1) for i in range(x.shape[0])])


class ItemScale(nn.Module):
    def forward(self, x):
        return x / x.abs().max().item()


class NumpyRound(nn.Module):
    def forward(self, x):
        return x + torch.from_numpy(np.round(x.detach().numpy() * 4) / 4)


@dataclass
class Out:
    logits: torch.Tensor
    score: torch.Tensor


class DataclassOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return Out(y, y.sum(-1))


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, *, x):
        return self.fc(x)


class MaskSelect(nn.Module):
    def forward(self, x):
        return x[x > 0] * 2


class InplaceInput(nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


_CALLS = itertools.count(1)


class GlobalCounter(nn.Module):
    def forward(self, x):
        return x * next(_CALLS)


class PyRandom(nn.Module):
    def forward(self, x):
        return x + random.random()


class IgnoredHelper(nn.Module):
    @torch.jit.ignore
    def helper(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.sort(x.detach().numpy(), axis=-1))

    def forward(self, x):
        return self.helper(x) + 1


class HardcodedView(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def forward(self, x):  # written for batch 8
        return self.fc(x.view(8, -1))


class TensorIndexedExperts(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x):
        return self.experts[(x.mean() > 0).long()](x)


class PackedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


def x48():
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_data_dependent_branch_is_never_a_trace_pass():
    _, cells = _cells(DataBranch(), x48().abs())
    assert _statuses(cells) == dict(trace=W, script=P, compile=W, export=F, export_dynamic=F)
    assert "inputs negated" in cells["trace"].reason
    assert "torch.cond" in cells["export"].hint


def test_python_loop_over_the_batch():
    _, cells = _cells(LoopOverBatch(), x48())
    assert _statuses(cells) == dict(trace=W, script=P, compile=P, export=P, export_dynamic=W)
    assert "output shape (4, 8) ≠ expected (5, 8)" in cells["trace"].reason
    assert "specialized it to be a constant (4)" in cells["export_dynamic"].reason
    assert "loop" in cells["export_dynamic"].hint and "vectorise" in cells["export_dynamic"].hint


def test_item_scale_trace_is_input_specific():
    _, cells = _cells(ItemScale(), x48())
    assert _statuses(cells) == dict(trace=W, script=P, compile=P, export=P, export_dynamic=P)
    assert cells["trace"].details["tracer_warnings"][0]["message"].startswith("Converting a tensor to a Python number")


def test_numpy_in_forward_names_numpy_as_the_cause():
    _, cells = _cells(NumpyRound(), x48())
    assert _statuses(cells) == dict(trace=W, script=F, compile=P, export=F, export_dynamic=F)
    for path in ("script", "export"):
        assert "NumPy" in cells[path].hint and "torch.cond" not in cells[path].hint, cells[path].hint


def test_dataclass_output():
    _, cells = _cells(DataclassOut(), x48())
    assert _statuses(cells) == dict(trace=F, script=F, compile=P, export=F, export_dynamic=F)
    assert "tuple of tensors" in cells["trace"].hint
    assert cells["export"].hint.startswith("the output is a ") and "register_pytree_node" in cells["export"].hint


def test_keyword_only_forward():
    with pytest.raises(Exception):  # torch's own fact: trace cannot fill keyword-only parameters
        torch.jit.trace(KeywordOnly(), example_kwarg_inputs={"x": x48()})
    _, cells = _cells(KeywordOnly(), x=x48())
    assert _statuses(cells) == dict(trace=F, script=P, compile=P, export=P, export_dynamic=P)
    assert "keyword-only" in cells["trace"].hint


def test_boolean_mask_indexing_passes_where_torch_handles_it():
    _, cells = _cells(MaskSelect(), x48())
    assert _statuses(cells) == dict(trace=P, script=P, compile=P, export=P, export_dynamic=P)


def test_forward_writing_into_its_input_is_not_a_false_failure():
    x = x48()
    before = x.clone()
    program = torch.export.export(InplaceInput(), (x.clone(),)).module()  # real torch: the export is right
    torch.testing.assert_close(program(x.clone()), InplaceInput()(x.clone()))
    report, cells = _cells(InplaceInput(), x)
    assert _statuses(cells) == dict(trace=P, script=P, compile=P, export=P, export_dynamic=P)
    assert torch.equal(x, before)  # the caller's tensor is left alone
    assert report.settings["inputs_written"] == ["x"]
    assert any("writes into its input" in n for n in report.settings["notes"])


@pytest.mark.parametrize("module_class", [GlobalCounter, PyRandom])
def test_eager_that_is_not_repeatable_is_said_so(module_class):
    x = x48()
    m = module_class()
    assert not torch.equal(m(x), m(x))  # eager itself differs from call to call
    report, cells = _cells(module_class(), x)
    assert _statuses(cells) == dict(trace=F, script=F, compile=W, export=F, export_dynamic=F)
    for path in ("trace", "export", "export_dynamic", "compile"):
        assert cells[path].reason.startswith("eager is not repeatable"), cells[path].reason
    assert "froze the value" in cells["trace"].reason
    assert "not supported" in cells["script"].reason  # its own failure stands
    assert "eager_not_repeatable" in report.settings


def test_torch_rng_in_forward_is_not_called_unrepeatable():
    class Noise(nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)

    report, _ = _cells(Noise(), x48())
    assert "eager_not_repeatable" not in report.settings  # seeded alike, torch's RNG repeats


def test_jit_ignored_python_helper_cannot_be_saved():
    scripted = torch.jit.script(IgnoredHelper())
    with pytest.raises(RuntimeError, match="Could not export Python function call 'helper'"):
        torch.jit.save(scripted, io.BytesIO())
    _, cells = _cells(IgnoredHelper(), x48())
    assert _statuses(cells) == dict(trace=W, script=F, compile=P, export=F, export_dynamic=F)
    assert "torch.jit.save refuses it" in cells["script"].reason
    assert "@torch.jit.ignore" in cells["script"].hint
    assert "NumPy" in cells["export"].hint


def test_hardcoded_batch_in_view():
    _, cells = _cells(HardcodedView(), torch.randn(8, 4, 16))
    assert _statuses(cells) == dict(trace=P, script=P, compile=P, export=P, export_dynamic=W)
    assert "specialized it to be a constant (8)" in cells["export_dynamic"].reason
    assert "view(x.shape[0], -1)" in cells["export_dynamic"].hint


def test_module_list_indexed_by_a_tensor():
    _, cells = _cells(TensorIndexedExperts(), x48().abs())
    assert _statuses(cells) == dict(trace=W, script=F, compile=F, export=F, export_dynamic=F)
    assert "integer literal" in cells["script"].reason
    assert "torch.where" in cells["compile"].hint


def test_lstm_over_a_packed_sequence():
    _, cells = _cells(PackedLSTM(), torch.randn(3, 6, 8), torch.tensor([6, 4, 2]))
    assert cells["script"].status == P and cells["compile"].status == W
    assert cells["trace"].status != F and cells["trace"].matches_eager
    for path in ("export", "export_dynamic"):
        assert cells[path].status == F and "PackedSequence" in cells[path].hint, cells[path].hint


# -- the healthy ones --------------------------------------------------------------------------------

def test_stock_convnet_mlp_and_transformer_encoder_pass_everywhere():
    convnet = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(16, 10))
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    for module, x in ((convnet, torch.randn(2, 3, 16, 16)), (mlp, torch.randn(4, 16)), (encoder, torch.randn(2, 5, 16))):
        report, cells = _cells(module, x)
        assert set(_statuses(cells).values()) == {P}, {k: c.reason for k, c in cells.items()}
        assert "notes" not in report.settings


def test_stock_lstm_in_a_module():
    class LSTMWrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    _, cells = _cells(LSTMWrap(), torch.randn(3, 5, 8))
    assert _statuses(cells) == dict(trace=W, script=P, compile=W, export=P, export_dynamic=P)
    assert "still equals eager" in cells["trace"].reason  # torch's own input checks, documented as a warning


def test_tiny_hugging_face_bert():
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.BertModel(config)
    _, cells = _cells(model, torch.randint(0, 100, (2, 7)))
    assert _statuses(cells) == dict(trace=F, script=F, compile=P, export=P, export_dynamic=P)
    assert "return_dict=False" in cells["trace"].hint
