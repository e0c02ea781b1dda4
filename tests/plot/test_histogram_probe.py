"""The histogram probe's counts against numpy's histogram of the very outputs, and its picture."""

import numpy as np
import pytest
import torch
from torch import nn

import layerlab
from layerlab.probe.probes.histogram import BINS, MAX_LAYERS


def _capture(model):
    outs = {}
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: outs.__setitem__(name, o.detach().clone()))
             for name, m in model.named_modules() if name]
    return outs, hooks


def test_counts_and_edges_equal_numpys_histogram_of_each_output():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
    x = torch.randn(64, 8)
    outs, hooks = _capture(model)
    report = layerlab.inspect(model, x, probes=["histogram"])
    for h in hooks:
        h.remove()
    result = report.probe("histogram")
    assert [(r.path, r.class_name) for r in result.rows] == [("0", "Linear"), ("1", "ReLU"), ("2", "Linear"),
                                                             ("3", "Tanh")]
    for row in result.rows:
        values = outs[row.path].numpy().astype(np.float64).ravel()
        counts, edges = np.histogram(values, bins=BINS, range=(values.min(), values.max()))
        assert sum(row.series["counts"]) == values.size
        assert row.series["edges"] == pytest.approx(edges.tolist(), rel=1e-6, abs=1e-7)
        # torch bins in float32: an element within rounding of an edge may land in the next bin
        assert np.abs(np.array(row.series["counts"]) - counts).sum() <= 2
        assert row.values["min"] == pytest.approx(values.min()) and row.values["max"] == pytest.approx(values.max())
    relu = result.row("1")
    zeros = int((outs["1"] == 0).sum())
    assert relu.series["counts"][0] >= zeros and relu.values["peak_share"] >= zeros / outs["1"].numel()


def test_nan_is_counted_apart_and_a_constant_output_gets_torchs_range():
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight[1, 0] = float("nan")  # output column 1 is NaN for every row
    report = layerlab.inspect(nn.Sequential(lin), torch.randn(5, 4), probes=["histogram"], backward=False)
    first = report.probe("histogram").row("0")
    assert first.values["nonfinite"] == 5 and sum(first.series["counts"]) == 10

    zero = nn.Linear(4, 3)
    nn.init.zeros_(zero.weight)
    nn.init.zeros_(zero.bias)
    model = nn.Sequential(zero, nn.Sequential(nn.ReLU()))  # every output is exactly 0
    result = layerlab.inspect(model, torch.randn(5, 4), probes=["histogram"]).probe("histogram")
    const = result.row("1.0")
    assert const.series["edges"][0] == -1.0 and const.series["edges"][-1] == 1.0  # torch.histc's own choice
    assert const.series["counts"][BINS // 2] == 15 and sum(const.series["counts"]) == 15
    assert [r.path for r in result.rows] == ["0", "1.0"]  # the container "1" is not a layer of its own
    assert result.findings == []  # histograms are for reading: no verdicts


def test_more_layers_than_the_cap_are_evenly_spaced_first_and_last_kept():
    model = nn.Sequential(*[m for _ in range(20) for m in (nn.Linear(6, 6), nn.ReLU())])  # 40 layers
    report = layerlab.inspect(model, torch.randn(3, 6), probes=["histogram"])
    result = report.probe("histogram")
    paths = [r.path for r in result.rows]
    assert len(paths) == MAX_LAYERS and paths[0] == "0" and paths[-1] == "39"
    assert result.summary["layers"] == 40 and "40 innermost layer calls; 16 shown" in result.note
    plain = layerlab.inspect(model, torch.randn(3, 6))
    assert [o.stats for o in plain.outputs] == [o.stats for o in report.outputs]  # looking changes nothing


def test_a_module_called_twice_gets_one_row_per_call():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    report = layerlab.inspect(model, torch.randn(2, 4), probes=["histogram"])
    rows = report.probe("histogram").rows
    assert [(r.path, r.call) for r in rows] == [("0", 1), ("1", 1), ("0", 2)]


def test_the_histogram_picture_draws_the_probes_counts(tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")
    from layerlab.errors import UsageError
    from layerlab.plot import histograms

    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    report = layerlab.inspect(model, torch.randn(2, 5, 16), probes=["histogram"])
    rows = report.probe("histogram").rows
    fig = histograms(report, path=tmp_path / "h.svg")
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == len(rows) == 8
    assert [ax.get_title().splitlines()[0] for ax in visible] == [r.path for r in rows]
    for ax, row in zip(visible, rows):
        steps, = [p for p in ax.patches if p.get_gid() == f"hist:{row.path}:1"]
        values, edges, _ = steps.get_data()
        assert values.tolist() == row.series["counts"] and edges.tolist() == pytest.approx(row.series["edges"])
    assert 'id="hist:linear1:1"' in (tmp_path / "h.svg").read_text()
    with pytest.raises(UsageError, match="the histogram probe did not run"):
        histograms(layerlab.inspect(model, torch.randn(2, 5, 16)))
