"""`layerlab export-check`: exit codes, the table, JSON, --all, spec files and the ONNX hint."""

import json
import textwrap

import pytest
import torch

from layerlab import registry
from layerlab.deploy import onnx as onnx_path


def test_help(run):
    code, out, err = run("export-check", "--help")
    assert code == 0, out + err
    assert "--all" in out and "--paths" in out and "--compile-backend" in out and "--strict" in out


def test_registry_layer_table(run):
    code, out, err = run("export-check", "linear", "--paths", "export,export_dynamic")
    assert code == 0, out + err
    assert "export-check linear" in out and "layerlab.layers.linear.Linear" in out
    assert "outputs compared with rtol 0.0001, atol 1e-05" in out
    assert "exported (static shapes); equals eager" in out
    assert "batch dim dynamic; equals eager at 8 and 9" in out
    assert "ok: 0 failed, 2 passed" in out
    assert err == ""


def test_lstm_json_exit_1_because_script_fails(run):
    code, out, err = run("export-check", "lstm", "--paths", "trace,script,export", "--json")
    assert code == 1, out + err
    data = json.loads(out)
    assert data["kind"] == "export-check-report" and data["schema"] == 1 and data["target"] == "lstm"
    cells = {p["path"]: p for p in data["paths"]}
    assert cells["trace"]["status"] == "warn" and "at length 7 → 6" in cells["trace"]["reason"]
    assert cells["script"]["status"] == "fail"
    assert cells["export"]["status"] == "pass" and cells["export"]["matches_eager"] is True
    assert cells["export"]["rtol"] == 1e-4 and cells["export"]["comparisons"][0]["ok"] is True
    assert data["ok"] is False and data["counts"]["fail"] == 1


def test_warnings_exit_0_unless_strict(run):
    # adaptive pooling computes its bins in Python: the trace is frozen at one size (a warning)
    code, out, err = run("export-check", "adaptive_avg_pool2d", "--paths", "trace")
    assert code == 0, out + err
    assert "! warn" in out
    code, out, err = run("export-check", "adaptive_avg_pool2d", "--paths", "trace", "--strict")
    assert code == 1, out + err
    assert "counted as failures: --strict" in out


def test_spec_with_a_data_dependent_branch(run, tmp_path):
    (tmp_path / "branchy.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Branchy(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(4, 4)

            def forward(self, x):
                if x.mean() > 0:
                    return self.linear(x)
                return self.linear(-x)
    """))
    spec = tmp_path / "branchy.yaml"
    spec.write_text("layer: ./branchy.py:Branchy\ninput: {shape: [2, 4]}\n")
    code, out, err = run("export-check", str(spec), "--allow-import", "--paths", "trace,compile,export", "--json")
    assert code == 1, out + err
    cells = {p["path"]: p for p in json.loads(out)["paths"]}
    assert cells["trace"]["status"] == "warn"
    assert cells["compile"]["status"] == "warn" and "Data-dependent branching" in cells["compile"]["reason"]
    assert cells["compile"]["where"].endswith("branchy.py:11")
    assert cells["export"]["status"] == "fail"


def test_usage_errors_exit_2(run):
    code, out, err = run("export-check", "--strict")
    assert code == 2, out + err
    assert "which layer?" in err
    code, out, err = run("export-check", "lstm", "--all")
    assert code == 2, out + err
    code, out, err = run("export-check", "lstmm")
    assert code == 2, out + err
    assert "did you mean 'lstm'" in err
    code, out, err = run("export-check", "lstm", "--paths", "tracing")
    assert code == 2, out + err
    assert "no export path called 'tracing'" in err
    code, out, err = run("export-check", "nope.yaml")
    assert code == 2, out + err
    code, out, err = run("export-check", "lstm", "--compile-backend", "inductr", "--json")
    assert code == 2, out + err
    assert json.loads(err)["hint"] == "did you mean 'inductor'?"


def test_onnx_column_without_the_extra(run, monkeypatch):
    monkeypatch.setattr(onnx_path, "missing", lambda: ["onnx", "onnxruntime"])
    code, out, err = run("export-check", "linear", "--paths", "export,onnx")
    assert code == 0, out + err
    assert "· skip" in out and "onnx and onnxruntime not installed" in out
    assert "pip install 'layerlab[onnx]'" in err  # the hint, once, on stderr


def test_all_registry_layers(run):
    """Every registry layer through every path but ONNX (the README's table has the ONNX column too)."""
    code, out, err = run("export-check", "--all", "--paths", "trace,script,compile,export,export_dynamic", "--json")
    data = json.loads(out)
    assert data["kind"] == "export-check-matrix" and data["layers"] == registry.names()
    cells = {(r["target"], p["path"]): p for r in data["reports"] for p in r["paths"]}
    for name in registry.names():
        for path in ("compile", "export", "export_dynamic"):  # every layer exports and compiles in one graph
            assert cells[name, path]["status"] == "pass", (name, path, cells[name, path]["reason"])
    for name in ("rnn", "lstm", "gru"):  # a Python loop over time: the trace unrolls T
        assert "at length 7 → 6 it raises" in cells[name, "trace"]["reason"]
    # 1/√d is computed with tensor ops, so a trace generalises to other head sizes
    assert cells["scaled_dot_product_attention", "trace"]["status"] == "pass"
    assert cells["adaptive_avg_pool2d", "trace"]["status"] == "warn"  # bins computed in Python
    assert all(cells[n, "trace"]["status"] != "fail" for n in registry.names())
    assert code == (0 if data["ok"] else 1), err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)")
def test_cuda_device(run):
    code, out, err = run("export-check", "multihead_attention", "--device", "cuda", "--json")
    data = json.loads(out)
    cells = {p["path"]: p for p in data["paths"]}
    for path in ("compile", "export", "export_dynamic"):
        assert cells[path]["status"] == "pass", (path, cells[path]["reason"])
    assert code in (0, 1), err
