"""``layerlab inspect --plot / --compare / --plot-histograms``: the files hold the pictures asked for."""

import json
import sys
import xml.etree.ElementTree as ET

import pytest

PRE, POST = "configs/transformer_preln.yaml", "configs/transformer_postln.yaml"
BLOCK_GROUPS = {"self_attn_MultiheadAttention", "norm1_LayerNorm", "norm2_LayerNorm", "linear1_Linear",
                "linear2_Linear"}


def _series_ids(svg_text):
    root = ET.fromstring(svg_text)
    return {el.get("id") for el in root.iter() if ":" in (el.get("id") or "")}


def test_compare_draws_both_specs_side_by_side_titled_by_their_names(run, tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")
    path = tmp_path / "flow.svg"
    code, out, err = run("inspect", PRE, "--compare", POST, "--plot", str(path))
    assert code == 0, out + err
    text = path.read_text()
    ids = _series_ids(text)
    for col in (0, 1):
        assert {i.split(":", 2)[2] for i in ids if i.startswith(f"grad:{col}:")} == BLOCK_GROUPS
        assert {i.split(":", 2)[2] for i in ids if i.startswith(f"std:{col}:")} == BLOCK_GROUPS
    assert ">pre-LN transformer block<" in text and ">post-LN transformer block<" in text
    assert "pre-LN transformer block" in out  # the tables are SPEC's


def test_plot_histograms_png_and_json_still_reports(run, tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")
    path = tmp_path / "hist.png"
    code, out, err = run("inspect", POST, "--plot-histograms", str(path), "--json")
    assert code == 0, out + err
    data = json.loads(out)
    rows = next(p for p in data["probes"] if p["name"] == "histogram")["rows"]
    assert [r["path"] for r in rows] == ["self_attn", "dropout1", "norm1", "linear1", "dropout", "linear2",
                                         "dropout2", "norm2"]
    png = path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") > 500


def test_html_report_inlines_the_picture(run, tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")
    html, plot = tmp_path / "report.html", tmp_path / "flow.png"
    code, out, err = run("inspect", PRE, "--plot", str(plot), "--html", str(html))
    assert code == 0, out + err
    page = html.read_text()
    assert page.count("<svg") == 1 and page.index("<svg") < page.rindex("</body>")
    assert 'id="grad:0:linear2_Linear"' in page and "<?xml" not in page.split("<svg", 1)[1]
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    (["--compare", POST], "--compare draws SPEC2 beside SPEC in the --plot chart"),
    (["--plot", "{tmp}/flow.jpg"], "cannot tell the picture's format"),
    (["--plot", "{tmp}/flow.svg", "--meta"], "a --meta run has none"),
    (["--plot", "{tmp}/no/such/dir/flow.svg"], "does not exist"),
])
def test_bad_picture_options_are_refused_before_the_run(run, tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run("inspect", PRE, *args)
    assert code == 2, out + err
    assert message in " ".join(err.split())
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


def test_missing_matplotlib_is_a_usage_error_naming_the_extra(run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run("inspect", PRE, "--plot", str(tmp_path / "flow.svg"))
    assert code == 2, out + err
    flat = " ".join(err.split())
    assert "matplotlib, which is not installed" in flat and "pip install 'layerlab[plot]'" in flat
    assert out == ""  # refused before the run: no tables


def test_help_lists_the_picture_options(run):
    code, out, err = run("inspect", "--help")
    assert code == 0, err
    for flag in ("--plot", "--compare", "--plot-histograms"):
        assert flag in out
