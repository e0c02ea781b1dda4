"""`layerlab profile`: exit codes, the table, JSON, specs, --vs-reference, --compile and --device."""

import json

import pytest
import torch


def test_help(run):
    code, out, err = run("profile", "--help")
    assert code == 0, out + err
    for flag in ("--repeats", "--warmup", "--compile", "--vs-reference", "--device", "--depth"):
        assert flag in out


def test_registry_layer_table(run):
    code, out, err = run("profile", "conv2d", "--repeats", "2", "--warmup", "1", "--threads", "1")
    assert code == 0, out + err
    assert "profile conv2d" in out and "layerlab.layers.conv.Conv2d" in out
    assert "(root)" in out and "fwd ms" in out and "act. mem" in out
    assert "step without hooks:" in out and "profiler overhead:" in out and "rows add up to" in out
    assert "wall time (time.perf_counter)" in out
    assert err == ""


def test_json(run):
    code, out, err = run("profile", "linear", "--repeats", "2", "--warmup", "0", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "profile-report" and data["schema"] == 1 and data["target"] == "linear"
    row = data["rows"][0]
    assert row["label"] == "(root)" and row["flops_forward"] == 2 * 8 * 64 * 32
    assert set(data["step"]) >= {"step_s", "profiled_step_s", "overhead", "rows_sum_s", "rows_error"}
    assert data["repeats"] == 2 and data["timer"].startswith("wall time")


def test_spec_block_and_depth(run, tmp_path):
    spec = tmp_path / "block.yaml"
    spec.write_text("block:\n  - conv2d: {in_channels: 3, out_channels: 4, kernel_size: 3, padding: 1}\n"
                    "  - relu: {}\n  - flatten: {}\n  - linear: {in_features: 256, out_features: 5}\n"
                    "input: {shape: [2, 3, 8, 8]}\n")
    code, out, err = run("profile", str(spec), "--repeats", "2", "--warmup", "0", "--json")
    assert code == 0, out + err
    assert [r["path"] for r in json.loads(out)["rows"]] == ["", "0", "1", "2", "3"]
    code, out, err = run("profile", str(spec), "--repeats", "1", "--warmup", "0", "--depth", "0")
    assert code == 0, out + err
    table = out.split("total")[0]
    assert "(root)" in table and "Conv2d" not in table  # folded into the root row


def test_vs_reference(run):
    code, out, err = run("profile", "transformer_encoder_layer", "--vs-reference", "--repeats", "2",
                         "--warmup", "1", "--threads", "1")
    assert code == 0, out + err
    assert "vs reference" in out and "ours: TransformerEncoderLayer" in out
    assert "throughput" in out and "samples/s" in out and "ratio = ours / reference" in out


def test_vs_reference_without_a_reference_is_usage(run):
    code, out, err = run("profile", "separable_conv2d", "--vs-reference")
    assert code == 2, out + err
    assert "has no torch.nn reference" in err


def test_compile_aot_eager(run):
    code, out, err = run("profile", "linear", "--compile", "--compile-backend", "aot_eager", "--repeats", "2",
                         "--warmup", "1", "--json")
    assert code == 0, out + err
    comp = json.loads(out)["compile"]
    assert comp["b"] == "eager" and comp["error"] is None
    assert [m["name"] for m in comp["metrics"]][:3] == ["forward", "backward", "step (fwd + bwd)"]


def test_usage_errors(run):
    code, out, err = run("profile", "lineer")
    assert code == 2, out + err
    assert "did you mean 'linear'" in err
    code, out, err = run("profile", "linear", "--repeats", "0")
    assert code == 2, out + err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_requested_without_cuda(run):
    code, out, err = run("profile", "linear", "--device", "cuda")
    assert code == 2, out + err
    assert "CUDA is not available" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)")
def test_cuda_device(run):
    code, out, err = run("profile", "transformer_encoder_layer", "--device", "cuda", "--repeats", "3",
                         "--vs-reference", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["device"].startswith("cuda") and data["timer"].startswith("CUDA events")
    assert data["step"]["peak_bytes"] > 0
    assert "peak memory of a step" in [m["name"] for m in data["reference"]["metrics"]]


def test_user_layer_with_a_reference_key(run, tmp_path):
    (tmp_path / "mylin.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class MyLinear(nn.Module):\n"
        "    def __init__(self, in_features, out_features):\n"
        "        super().__init__()\n"
        "        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features ** 0.5)\n"
        "        self.bias = nn.Parameter(torch.zeros(out_features))\n\n"
        "    def forward(self, x):\n"
        "        return x @ self.weight.t() + self.bias\n")
    spec = tmp_path / "mylin.yaml"
    spec.write_text("layer: ./mylin.py:MyLinear\nargs: {in_features: 32, out_features: 16}\n"
                    "input: {shape: [8, 32]}\nreference: nn.Linear\n")
    code, out, err = run("profile", str(spec), "--allow-import", "--vs-reference", "--repeats", "2", "--json")
    assert code == 0, out + err
    ref = json.loads(out)["reference"]
    assert ref["b"] == "torch.nn.Linear" and ref["a"].endswith("MyLinear") and ref["error"] is None
    params = next(m for m in ref["metrics"] if m["name"] == "parameters")
    assert params["ratio"] == 1.0
    assert "weights copied by name" in ref["notes"][0]
