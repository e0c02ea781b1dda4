"""`layerlab gradcheck`: exit codes, the table, JSON, --all and spec files."""

import json
import textwrap

import pytest

from layerlab import registry
from layerlab.registry_types import LayerEntry


def test_help(run):
    code, out, err = run("gradcheck", "--help")
    assert code == 0, out + err
    assert "--all" in out and "--deep" in out


def test_registry_layer_passes_with_a_table(run):
    code, out, err = run("gradcheck", "linear")
    assert code == 0, out + err
    assert "gradcheck linear" in out and "vs torch.nn.Linear" in out
    for check in ("runs", "forward_parity", "backward_parity", "gradcheck", "param_grads"):
        assert check in out
    assert "ok: 0 failed" in out
    assert err == ""


def test_json_report(run):
    code, out, err = run("gradcheck", "lstm", "--only", "forward_parity,gradcheck", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "gradcheck-report" and data["schema"] == 1
    assert data["ok"] is True and data["target"] == "lstm"
    assert [c["name"] for c in data["checks"]] == ["forward_parity", "gradcheck"]
    fwd = data["checks"][0]
    assert fwd["status"] == "pass"
    assert fwd["details"]["runs"][0]["comparisons"][0]["rtol"] == 1e-7


def test_all_renders_the_matrix_and_exits_0(run):
    code, out, err = run("gradcheck", "--all")
    assert code == 0, out + err
    for name in registry.names():
        assert name in out
    assert f"ok: {len(registry.names())} layers, 0 failed" in out
    header = out.splitlines()[0].split()
    assert header[:4] == ["layer", "run", "fwd", "bwd"]


def test_all_json(run):
    code, out, err = run("gradcheck", "--all", "--only", "runs", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "gradcheck-matrix" and data["ok"] is True
    assert data["layers"] == registry.names() and data["checks"] == ["runs"]


@pytest.fixture
def broken_registry(monkeypatch):
    bad = LayerEntry(name="detached_residual", target="tests.checks.planted_bugs:DetachedResidual",
                     reference="tests.checks.planted_bugs:PreNormResidual", args={"features": 8},
                     inputs={"x": {"shape": [3, 8]}})
    monkeypatch.setattr(registry, "REGISTRY", {"linear": registry.REGISTRY["linear"], bad.name: bad})


def test_all_with_a_broken_layer_exits_1_and_names_it(run, broken_registry):
    code, out, err = run("gradcheck", "--all")
    assert code == 1, out + err
    assert "detached_residual · param_grads at norm.weight, norm.bias" in out
    assert "2 layers, 1 failed" in out


def test_failing_layer_exits_1_with_where_and_numbers(run, broken_registry):
    code, out, err = run("gradcheck", "detached_residual")
    assert code == 1, out + err
    assert "✗ param_grads  at norm.weight, norm.bias" in out
    assert "rtol 1e-07, atol 1e-07" in out  # backward parity prints its tolerances
    code, out, err = run("gradcheck", "detached_residual", "--json")
    assert code == 1, out + err
    data = json.loads(out)
    assert data["ok"] is False
    failed = {c["name"]: c["where"] for c in data["checks"] if c["status"] == "fail"}
    assert failed["param_grads"] == "norm.weight, norm.bias"


def test_all_reports_a_layer_that_cannot_be_built(run, monkeypatch):
    broken = LayerEntry(name="half_linear", target="torch.nn:Linear", reference="torch.nn:Linear",
                        args={"in_features": 3}, inputs={"input": {"shape": [2, 3]}})
    monkeypatch.setattr(registry, "REGISTRY", {"linear": registry.REGISTRY["linear"], broken.name: broken})
    code, out, err = run("gradcheck", "--all", "--json")
    assert code == 1, out + err
    data = json.loads(out)
    assert data["failed"] == ["half_linear"]
    bad = data["reports"][0]["checks"][0]
    assert bad["name"] == "runs" and "could not be built" in bad["summary"] and "out_features" in bad["summary"]


def _spec(tmp_path, reference="{layer: nn.Linear, args: {in_features: 6, out_features: 6}}"):
    (tmp_path / "mylayers.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class XW(nn.Linear):
            def forward(self, x):
                return x @ self.weight + self.bias   # transposed weight
    """))
    spec = tmp_path / "xw.yaml"
    spec.write_text(textwrap.dedent(f"""
        layer: mylayers.py:XW
        args: {{in_features: 6, out_features: 6}}
        input: {{shape: [4, 6]}}
        reference: {reference}
    """))
    return str(spec)


def test_spec_with_reference(run, tmp_path):
    spec = _spec(tmp_path)
    code, out, err = run("gradcheck", spec, "--allow-import", "--json")
    assert code == 1, out + err
    data = json.loads(out)
    status = {c["name"]: (c["status"], c["where"]) for c in data["checks"]}
    assert status["forward_parity"][0] == "fail"
    assert status["backward_parity"] == ("fail", "weight")
    assert data["reference"] == "torch.nn.Linear"


def test_registry_layer_spec_gets_its_reference_by_default(run, tmp_path):
    spec = tmp_path / "gru.yaml"
    spec.write_text("layer: gru\nargs: {input_size: 3, hidden_size: 4}\ninput: {shape: [5, 2, 3]}\n")
    code, out, err = run("gradcheck", str(spec), "--only", "forward_parity,recurrent_state", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["reference"] == "torch.nn.GRU"
    assert [c["status"] for c in data["checks"]] == ["pass", "pass"]


def test_spec_causal_flag_on_a_centred_conv(run, tmp_path):
    spec = tmp_path / "conv.yaml"
    spec.write_text("layer: conv1d\nargs: {in_channels: 2, out_channels: 2, kernel_size: 3, padding: 1}\n"
                    "input: {shape: [2, 2, 8]}\ncausal: true\n")
    code, out, err = run("gradcheck", str(spec), "--only", "causality,forward_parity")
    assert code == 1, out + err
    assert "first leaking position t = 0" in out and "sees input position 1" in out


@pytest.mark.parametrize("argv, needle", [
    (["gradcheck", "lstn"], "did you mean 'lstm'"),
    (["gradcheck", "lstm", "--all"], "not both"),
    (["gradcheck", "--json"], "which layer?"),
    (["gradcheck", "nope.yaml"], "no spec file"),
    (["gradcheck", "lstm", "--only", "gradchek"], "did you mean 'gradcheck'"),
])
def test_usage_errors_exit_2(run, argv, needle):
    code, out, err = run(*argv)
    assert code == 2, out + err
    assert needle in err
    assert out == "" or argv[-1] == "--json"


def test_bad_reference_in_spec_exits_2(run, tmp_path):
    spec = _spec(tmp_path, reference="{layer: nn.Linear, wieght_map: {}}")
    code, out, err = run("gradcheck", spec, "--allow-import")
    assert code == 2, out + err
    assert "unknown key 'wieght_map' in reference:" in err and "xw.yaml:" in err
