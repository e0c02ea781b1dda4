"""Forward records of layerlab.inspect on real torch.nn layers: every column, structured outputs,
repeated calls, keyword inputs, statistics against torch, NaN localisation."""

from collections import namedtuple

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.probe.report import InspectReport


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 10))


def test_public_api_is_lazy_and_returns_a_report():
    report = layerlab.inspect(nn.Linear(4, 2), torch.randn(3, 4))
    assert isinstance(report, InspectReport)
    assert report.ok


def test_every_forward_column_on_a_cnn():
    model = cnn()
    x = torch.randn(4, 3, 16, 16, requires_grad=True)
    report = layerlab.inspect(model, x)
    assert report.ok, report.problems
    assert [c.path for c in report.calls] == ["", "0", "1", "2", "3", "4", "5"]
    assert [c.class_name for c in report.calls] == [
        "Sequential", "Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Flatten", "Linear"]
    assert [c.depth for c in report.calls] == [0, 1, 1, 1, 1, 1, 1]
    conv = report.call("0")
    assert conv.inputs[0].name == "input"
    assert conv.inputs[0].shape == [4, 3, 16, 16]
    assert conv.inputs[0].requires_grad is True
    assert conv.inputs[0].grad_fn is None  # a leaf
    out = conv.outputs[0]
    assert out.shape == [4, 8, 16, 16]
    assert out.dtype == "float32" and out.device == "cpu"
    assert out.requires_grad is True
    assert out.grad_fn == "ConvolutionBackward0"
    assert conv.params == sum(p.numel() for p in model[0].parameters()) == 3 * 8 * 9 + 8
    assert report.call("").params == sum(p.numel() for p in model.parameters())
    assert report.call("2").outputs[0].grad_fn == "ReluBackward0"
    assert report.call("5").outputs[0].shape == [4, 10]
    # the input of each layer is the previous layer's output
    assert report.call("1").inputs[0].source == conv.index
    assert report.call("0").inputs[0].source is None
    assert report.total_params == report.trainable_params == sum(p.numel() for p in model.parameters())


def test_statistics_match_torch():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
    x = torch.randn(64, 16)
    report = layerlab.inspect(model, x)
    with torch.no_grad():
        h = model[0](x)
        r = torch.relu(h)
    for path, ref in (("0", h), ("1", r)):
        s = report.call(path).outputs[0].stats
        assert s.numel == ref.numel()
        assert s.mean == pytest.approx(ref.mean().item(), abs=1e-5)
        assert s.std == pytest.approx(ref.std(unbiased=False).item(), rel=1e-4)
        assert s.min == pytest.approx(ref.min().item())
        assert s.max == pytest.approx(ref.max().item())
        assert s.zeros == pytest.approx((ref == 0).float().mean().item())
        assert s.nan == 0 and s.inf == 0
    assert report.call("1").outputs[0].stats.zeros > 0.3  # ReLU zeroes about half


def test_negative_zero_counts_as_zero():
    class NegZero(nn.Module):
        def forward(self, x):
            return x * 0  # negative entries become -0.0

    report = layerlab.inspect(NegZero(), -torch.ones(10), backward=False)
    assert report.calls[0].outputs[0].stats.zeros == 1.0


def test_integer_and_bool_tensors_get_stats():
    emb = nn.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 0], [9, 9, 3]])
    report = layerlab.inspect(emb, ids)
    inp = report.calls[0].inputs[0]
    assert inp.dtype == "int64" and inp.requires_grad is False
    assert inp.stats.min == 0 and inp.stats.max == 9
    assert inp.stats.zeros == pytest.approx(1 / 6)


def test_tuple_outputs_element_by_element_lstm():
    lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    report = layerlab.inspect(lstm, torch.randn(3, 5, 8))
    outs = report.calls[0].outputs
    assert [(o.name, o.shape) for o in outs] == [
        ("[0]", [3, 5, 16]), ("[1][0]", [2, 3, 16]), ("[1][1]", [2, 3, 16])]
    assert all(o.stats is not None and o.grad is not None for o in outs)


def test_multihead_attention_outputs_and_kwargs():
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    q = torch.randn(2, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    report = layerlab.inspect(mha, q, q, q, attn_mask=mask)
    call = report.calls[0]
    assert [i.name for i in call.inputs] == ["query", "key", "value", "attn_mask"]
    assert call.inputs[3].shape == [5, 5] and call.inputs[3].dtype == "bool"
    # query, key and value are one tensor: one slot
    assert len({i.slot for i in call.inputs[:3]}) == 1
    assert [(o.name, o.shape) for o in call.outputs] == [("[0]", [2, 5, 16]), ("[1]", [2, 5, 5])]


def test_non_tensor_arguments_are_recorded_as_values():
    mha = nn.MultiheadAttention(8, 2)
    x = torch.randn(4, 1, 8)
    report = layerlab.inspect(mha, x, x, x, need_weights=False)
    call = report.calls[0]
    flag = next(i for i in call.inputs if i.name == "need_weights")
    assert flag.value is False and flag.shape is None
    assert call.outputs[1].value is None  # no weights returned


Pair = namedtuple("Pair", ["values", "indices"])


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        top = torch.max(h, dim=-1)  # torch.return_types.max: a namedtuple
        return {"hidden": h, "top": Pair(top.values, top.indices)}


def test_dict_and_namedtuple_outputs():
    report = layerlab.inspect(DictOut(), torch.randn(3, 4))
    root = report.call("")
    names = [o.name for o in root.outputs]
    assert names == ["[hidden]", "[top].values", "[top].indices"]
    assert root.outputs[2].dtype == "int64"
    assert root.outputs[1].shape == [3]
    assert report.ok


class Shared(nn.Module):
    """The same Linear applied twice (shared weights) and an RNN cell run in a loop."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.cell = nn.GRUCell(6, 6)

    def forward(self, x):
        h = self.lin(self.lin(x))
        state = torch.zeros_like(h)
        for _ in range(3):
            state = self.cell(h, state)
        return state


def test_repeated_calls_get_a_row_each():
    report = layerlab.inspect(Shared(), torch.randn(2, 6))
    lin = [c for c in report.calls if c.path == "lin"]
    cell = [c for c in report.calls if c.path == "cell"]
    assert [c.call for c in lin] == [1, 2]
    assert [c.call for c in cell] == [1, 2, 3]
    assert lin[1].inputs[0].source == lin[0].index
    assert report.call("cell", 3).label == "cell (call 3)"
    assert [c.index for c in report.calls] == list(range(len(report.calls)))


def test_nested_modules_have_paths_and_depths():
    model = nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.Tanh()), nn.Linear(3, 1))
    report = layerlab.inspect(model, torch.randn(2, 3))
    assert [(c.path, c.depth, c.parent) for c in report.calls] == [
        ("", 0, None), ("0", 1, 0), ("0.0", 2, 1), ("0.1", 2, 1), ("1", 1, 0)]


class PlantedNaN(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.bad = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        with torch.no_grad():
            self.bad.weight[1, 2] = float("nan")

    def forward(self, x):
        return self.b(torch.relu(self.bad(self.a(x))))


def test_planted_nan_names_the_first_offending_step():
    report = layerlab.inspect(PlantedNaN(), torch.randn(2, 4))
    assert not report.ok
    first = [p for p in report.problems if p.code == "nonfinite-forward"]
    assert len(first) == 1
    assert first[0].where == "bad"
    assert "NaN first appears in the output of bad (Linear)" in first[0].message
    assert report.call("bad").outputs[0].stats.nan == 2
    assert report.call("a").outputs[0].stats.nan == 0
    assert report.call("b").outputs[0].stats.nan > 0


def test_nan_made_between_modules_is_traced_to_the_input():
    class Between(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)

        def forward(self, x):
            return self.b(torch.log(self.a(x) - 100))  # log of negatives: NaN, made outside a module

    report = layerlab.inspect(Between(), torch.randn(2, 3), backward=False)
    problem = next(p for p in report.problems if p.code == "nonfinite-forward")
    assert problem.where == "b"
    assert "already held it" in problem.message and "outside any module" in problem.message


def test_inplace_relu_keeps_the_pre_activation_stats():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True))
    report = layerlab.inspect(model, torch.randn(16, 8))
    lin, relu = report.call("0").outputs[0], report.call("1").outputs[0]
    assert lin.stats.min < 0 and relu.stats.min == 0
    assert lin.slot != relu.slot
    assert report.ok


def test_stats_off_keeps_metadata():
    report = layerlab.inspect(cnn(), torch.randn(2, 3, 16, 16), stats=False)
    assert report.call("0").outputs[0].shape == [2, 8, 16, 16]
    assert report.call("0").outputs[0].stats is None


def test_not_a_module_is_a_usage_error():
    from layerlab.errors import UsageError

    with pytest.raises(UsageError, match="needs a torch.nn.Module"):
        layerlab.inspect(lambda x: x, torch.randn(2))
    with pytest.raises(UsageError, match="mode must be"):
        layerlab.inspect(nn.ReLU(), torch.randn(2), mode="training")
