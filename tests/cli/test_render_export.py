"""The export-check matrix as people see it, at a fixed width with colour off (no torch work)."""

from rich.console import Console

from layerlab.checks.report import Status
from layerlab.cli import render_export
from layerlab.deploy.report import ExportMatrix, ExportReport, PathResult


def _render(parts) -> str:
    console = Console(width=100, record=True, color_system=None, file=open("/dev/null", "w"))
    for p in parts:
        console.print(p)
    return console.export_text()


def test_matrix_golden():
    rows = [
        ExportReport("lstm", "layerlab.layers.recurrent.LSTM", [
            PathResult("trace", Status.WARN, "input-specific: at length 7 → 6 it raises RuntimeError: Expected 7 "
                                             "elements in a list but found 6"),
            PathResult("export", Status.PASS, "exported (static shapes); equals eager", matches_eager=True)]),
        ExportReport("linear", "layerlab.layers.linear.Linear", [
            PathResult("trace", Status.PASS, "the trace equals eager", matches_eager=True),
            PathResult("export", Status.FAIL, "torch.export raised: GuardOnDataDependentSymNode",
                       where="my_layer.py:12")]),
    ]
    text = _render(render_export.matrix(ExportMatrix(rows, ["trace", "export"], seconds=1.25)))
    assert text.splitlines()[:3] == [
        "layer  trace  export",
        "lstm   ! warn ✓ pass",
        "linear ✓ pass ✗ fail",
    ]
    assert "! lstm · trace: input-specific: at length 7 → 6" in text
    assert "✗ linear · export: torch.export raised: GuardOnDataDependentSymNode (my_layer.py:12)" in text
    assert text.rstrip().splitlines()[-1] == (
        "FAILED: 2 layers, 1 with a failing path · cells: 2 passed, 1 warned, 1 failed, 0 skipped  (1.2 s)")
