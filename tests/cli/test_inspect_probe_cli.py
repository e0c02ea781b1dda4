"""``layerlab inspect --probe``: the tables at 80 columns, the JSON, custom probes and their errors."""

from __future__ import annotations

import json
import textwrap

import pytest

SPEC = textwrap.dedent("""
    layer: nn.TransformerEncoderLayer
    args: {d_model: 32, nhead: 4, dim_feedforward: 64, batch_first: true}
    input: [2, 10, 32]
""")


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "block.yaml"
    path.write_text(SPEC)
    (tmp_path / "cli_width_probes.py").write_text("def width(module, inputs, output):\n"
                                           "    return {'width': output[0].shape[-1] if isinstance(output, tuple) "
                                           "else output.shape[-1]}\n")
    return path


def test_probe_tables_fit_80_columns(run, spec, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run("inspect", str(spec), "--probe", "attention,sparsity", "--probe", "dead,rank")
    assert code == 0, out + err
    for title in ("Attention: entropy per head", "Sparsity: zeros", "Dead ReLU units", "Rank: effective rank"):
        assert title in out
    assert max(len(line) for line in out.splitlines()) <= 80
    attention = out.split("Attention: entropy per head")[1].splitlines()
    header = next(line for line in attention if line.startswith("module"))
    for column in ("entropy", "log n", "max w", "1-key", "uniform"):  # the ones that must fit at 80
        assert column in header
    row = attention[attention.index(header) + 2]
    assert row.split()[0] == "self_attn" and any(c in row for c in "▁▂▃▄▅▆▇█")


def test_json_carries_probes(run, spec):
    code, out, err = run("inspect", str(spec), "--probe", "attention,sparsity", "--json")
    assert code == 0, err
    data = json.loads(out)
    names = [p["name"] for p in data["probes"]]
    assert names == ["attention", "sparsity"]
    row = data["probes"][0]["rows"][0]
    assert row["path"] == "self_attn" and len(row["series"]["entropy/head"]) == 4
    assert 0 < row["values"]["entropy"] <= row["values"]["log_n"] + 1e-6


def test_custom_probe_from_the_command_line_needs_allow_import(run, spec, monkeypatch):
    monkeypatch.chdir(spec.parent)
    code, out, err = run("inspect", str(spec), "--probe", "cli_width_probes:width")
    assert code == 2, out + err
    assert "is an import path" in err and "--allow-import" in err and "Traceback" not in err
    code, out, err = run("inspect", str(spec), "--probe", "cli_width_probes:width", "--allow-import", "--json")
    assert code == 0, err
    rows = {r["path"]: r["values"]["width"] for r in json.loads(out)["probes"][0]["rows"]}
    assert rows["linear1"] == 64 and rows[""] == 32


def test_unknown_probe_and_spec_section(run, spec):
    code, out, err = run("inspect", str(spec), "--probe", "atention")
    assert code == 2 and "unknown probe 'atention'" in err
    spec.write_text(SPEC + "probes: [rank]\n")
    code, out, err = run("inspect", str(spec), "--json")
    assert code == 0, err
    assert [p["name"] for p in json.loads(out)["probes"]] == ["rank"]
