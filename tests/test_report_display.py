"""Reports show themselves as the CLI's tables: print(), a Rich console, a notebook; repr is one
short line; the renderer is public (layerlab.render); the JSON of a report is unchanged."""

import json
import subprocess
import sys

import pytest
import torch
from rich.console import Console
from torch import nn

import layerlab
from layerlab.serialize import dumps


@pytest.fixture(scope="module")
def report():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    return layerlab.inspect(model, torch.randn(2, 3, 6, 6))


def test_print_shows_the_tables_and_repr_is_one_short_line(report):
    text = str(report)
    assert text == layerlab.render(report)  # print(report) is the public renderer at 100 columns
    for section in ("Forward", "Backward", "Parameters", "Formula checks", "Summary"):
        assert section in text
    assert "(2, 4, 6, 6)" in text and "1.weight" not in text and "3.weight" in text
    assert "InspectReport(" not in text  # not the dataclass dump
    line = repr(report)
    assert "\n" not in line and len(line) < 120 and "Sequential" in line and " ok" in line


def test_a_rich_console_prints_the_same_tables_at_its_own_width(report):
    console = Console(width=80, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(report)
    text = console.export_text()
    assert text == layerlab.render(report, width=80)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80


def test_a_notebook_gets_html(report):
    html = report._repr_html_()
    assert html.startswith("<pre") and "Forward" in html and "Summary" in html
    assert html == layerlab.render_html(report)


def test_the_json_is_unchanged(report):
    data = json.loads(dumps(report))
    assert list(data) == list(report.to_dict())
    assert data["schema"] == 1 and data["calls"][1]["path"] == "0"


def test_depth_and_color_options(report):
    folded = layerlab.render(report, depth=0)
    assert "Conv2d" not in folded.split("Backward")[0]
    assert "\x1b[" in layerlab.render(report, color=True) and "\x1b[" not in layerlab.render(report)


def test_a_verify_report_prints_its_checks():
    torch.manual_seed(0)
    result = layerlab.verify(nn.Linear(4, 3), torch.randn(2, 4), reference=nn.Linear(4, 3))
    text = str(result)
    assert text.startswith("gradcheck") and "check" in text and ("ok" in text or "FAILED" in text)
    assert "\n" not in repr(result) and len(repr(result)) < 120


def test_bad_input_is_a_clear_error(report):
    with pytest.raises(TypeError, match="takes a layerlab report .* got dict"):
        layerlab.render({"calls": []})
    with pytest.raises(ValueError, match="width must be at least 20"):
        layerlab.render(report, width=5)


def test_importing_a_report_module_does_not_import_rich():
    code = ("import sys, layerlab.probe.report, layerlab.checks.report, layerlab.deploy.report, "
            "layerlab.profiling.report; print('rich' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_train_check_report_prints_its_loss_curve_and_modules():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    report = layerlab.train_check(mlp, torch.randn(16, 8), steps=20)
    text = str(report)
    assert text.startswith("train-check Sequential\n") and "loss" in text and "update/weight" in text
    assert repr(report).startswith("<TrainReport Sequential ok") and "\n" not in repr(report)
    assert "<table" in report._repr_html_() or "<pre" in report._repr_html_()


def test_a_diff_report_renders_like_the_cli():
    import copy

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    other = copy.deepcopy(mlp)
    with torch.no_grad():
        other[0].weight[0, 0] += 1.0
    x = torch.randn(2, 4)
    d = layerlab.diff(layerlab.inspect(mlp, x), layerlab.inspect(other, x))
    text = layerlab.render(d)
    assert d.differs and "starts to differ at: 0" in text and "0.weight" in text  # the edited weight, first
    assert text.index("0.weight") < text.index("output min")
