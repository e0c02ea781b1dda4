"""``layerlab inspect``: exit codes first (output as the failure message), then stdout/stderr."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
BROKEN = {"broken_block.yaml", "broken_text_conv.yaml", "tcn_chomp.yaml"}
NEEDS_IMPORT = {"attention_ops.yaml", "user_layernorm.yaml",  # layers of the user's own code (configs/user_layers.py)
                "factory_mlp.yaml",  # a user factory
                # planted layers and models of precision-check and train-check (configs/precision_layers.py,
                # configs/train_models.py): they run cleanly in float32 and untrained, as inspect sees them
                "precision_overflow.yaml", "precision_softmax.yaml", "precision_variance.yaml",
                "train_dead_relu.yaml", "train_wrong_output.yaml",
                "silent_heads.yaml",  # runs, with a silent-bug warning (configs/silent_layers.py)
                "tcn_chomp.yaml"}  # fails on purpose: the fix search's example (configs/fix_search_layers.py)
NEEDS_TRANSFORMERS = {"hf_gpt2_padded.yaml"}  # Hugging Face models built from a config mapping ([hf] extra)


def test_help(run):
    code, out, err = run("inspect", "--help")
    assert code == 0, err
    assert "SPEC" in out and "--no-backward" in out and "--allow-import" in out


def test_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"conv2d.yaml", "cnn_block.yaml", "lstm.yaml", "gru.yaml", "mha_causal.yaml",
            "transformer_preln.yaml", "vit_patch.yaml", "broken_block.yaml"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_runs(run, config):
    if config.name in NEEDS_TRANSFORMERS:
        pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    code, out, err = run("inspect", str(config), *(["--allow-import"] if config.name in NEEDS_IMPORT else []))
    if config.name in BROKEN:
        assert code == 1, out + err
        assert "forward failed in" in out and "fix:" in out
        assert "error:" in err
    else:
        assert code == 0, out + err
        assert "Forward" in out and "Summary" in out and "OK" in out
    assert "Traceback" not in out + err


def test_conv2d_output(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "conv2d.yaml"))
    assert code == 0, out + err
    assert "(2, 16, 16, 16)" in out
    assert "H: (32 + 2·1 − 3) // 2 + 1 = 16" in out
    assert "1 passed, 0 failed" in out
    assert err == ""


def test_broken_block_names_the_layer_and_the_fix(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "broken_block.yaml"))
    assert code == 1, out + err
    assert "forward failed in 4 (Linear)" in out
    assert "Linear expects last dim = in_features = 1024, got 4096" in out
    assert "set in_features=4096" in out
    assert "error: Linear raised RuntimeError in the forward: Linear expects last dim = in_features = 1024" in err
    assert "verified on a copy: with this fix the model runs → output (4, 10)" in err


def test_json_is_the_whole_report(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "lstm.yaml"), "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["ok"] is True and data["schema"] == 1
    root = data["calls"][0]
    assert root["class_name"] == "LSTM"
    assert [o["name"] for o in root["outputs"]] == ["[0]", "[1][0]", "[1][1]"]
    assert root["outputs"][0]["stats"]["numel"] == 4 * 20 * 64
    assert data["backward"]["ran"] is True
    assert {p["name"] for p in data["params"]} >= {"weight_ih_l0", "weight_hh_l1"}


def test_json_failure_exit_1(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "broken_block.yaml"), "--json")
    assert code == 1, out + err
    data = json.loads(out)
    assert data["ok"] is False
    assert data["failure"]["path"] == "4"
    assert data["failure"]["diagnosis"]["hint"].startswith("set in_features=4096")
    error = json.loads(err)
    assert error["exit_code"] == 1 and error["kind"] == "check"


def test_depth_folds_nested_modules(run):
    path = str(ROOT / "configs" / "cnn_block.yaml")
    code, out, err = run("inspect", path, "--depth", "0", "--no-backward")
    assert code == 0, out + err
    forward = out.split("Formula checks")[0]
    assert "Sequential" in forward and "BatchNorm2d" not in forward
    code, out, err = run("inspect", path, "--depth", "1", "--no-backward")
    assert "BatchNorm2d" in out.split("Formula checks")[0]


def test_svg_and_html_are_written(run, tmp_path):
    svg, html = tmp_path / "r.svg", tmp_path / "r.html"
    code, out, err = run("inspect", str(ROOT / "configs" / "conv2d.yaml"), "--svg", str(svg), "--html", str(html))
    assert code == 0, out + err
    assert svg.read_text().lstrip().startswith("<svg") and "Conv2d" in svg.read_text()
    assert "<html" in html.read_text().lower() and "Formula checks" in html.read_text()


def test_options_override_the_spec(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "conv2d.yaml"), "--json", "--dtype", "float64",
                         "--seed", "3", "--input-shape", "1,3,64,64", "--mode", "eval", "--no-backward")
    assert code == 0, out + err
    data = json.loads(out)
    root = data["calls"][0]
    assert root["inputs"][0]["shape"] == [1, 3, 64, 64] and root["inputs"][0]["dtype"] == "float64"
    assert root["outputs"][0]["shape"] == [1, 16, 32, 32]
    assert data["mode"] == "eval" and data["backward"]["ran"] is False


def test_named_input_shape(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "mha_causal.yaml"), "--json", "--no-backward",
                         "--input-shape", "query=3,10,64")
    assert code == 0, out + err
    assert json.loads(out)["calls"][0]["outputs"][0]["shape"] == [3, 10, 64]


def test_registry_name_without_a_file(run):
    from layerlab import registry

    if registry.find("conv2d") is None:
        pytest.skip("conv2d not registered yet")
    code, out, err = run("inspect", "conv2d", "--no-backward")
    assert code == 0, out + err
    code, out, err = run("inspect", "conv2f")
    assert code == 2, out + err
    assert "neither a spec file nor a layerlab registry name" in err and "conv2d" in err


@pytest.mark.parametrize(
    "text, words",
    [
        ("layer: Conv2d\nargs: {in_channels: 3, kernel_size: 3\n", "bad.yaml:3:1"),
        ("layer: Conv2dd\nargs: {}\ninput: [1]\n", "did you mean 'Conv2d'"),
        ("layer: Linear\nargs: {in_features: 2, out_feature: 3}\ninput: [1, 2]\n", "did you mean 'out_features'"),
        ("layer: Linear\nargs: {in_features: two, out_features: 3}\ninput: [1, 2]\n", "must be int, got str 'two'"),
        ("layer: Linear\nargs: {in_features: 2, out_features: 3}\n", "gives no input"),
        ("layer: os.path:join\ninput: [1]\n", "--allow-import"),
    ],
)
def test_bad_specs_exit_2_without_traceback(run, tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, out, err = run("inspect", str(path))
    assert code == 2, out + err
    assert words in err
    assert "Traceback" not in err and out == ""
    assert str(path) in err


def test_bad_options_exit_2(run):
    conv = str(ROOT / "configs" / "conv2d.yaml")
    for args, words in ((("--mode", "training"), "--mode must be train or eval"),
                        (("--dtype", "int8"), "--dtype must be a floating dtype"),
                        (("--input-shape", "2,x"), "--input-shape expects a tensor shape like 2,3,32,32"),
                        (("--input-shape", "nope=2,3"), "no input called 'nope'")):
        code, out, err = run("inspect", conv, *args)
        assert code == 2, out + err
        assert words in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_unavailable_device_is_exit_2(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "conv2d.yaml"), "--device", "cuda")
    assert code == 2, out + err
    assert "--device cuda, but CUDA is not available here (--device)" in err  # blames the option, not the spec


def test_missing_file_exit_2(run):
    code, out, err = run("inspect", "no/such/spec.yaml")
    assert code == 2, out + err
    assert "no such spec file" in err


def test_console_script_end_to_end():
    proc = subprocess.run([sys.executable, "-m", "layerlab", "inspect", "configs/conv2d.yaml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Formula checks" in proc.stdout


# -- the forward table: inputs, requires_grad, --wide -------------------------------------------------

def _shape(dims) -> str:
    return "(" + ", ".join(map(str, dims)) + ")"


def _forward_lines(out: str) -> list:
    """The lines of the forward table (title, header and rule left out)."""
    lines = out.split("\nForward")[1].split("\n\n")[0].splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("───"))
    return lines[rule + 1:]


def _row(lines: list, index: int) -> str:
    import re

    return next(line for line in lines if re.match(rf"\s*{index}\s", line))


@pytest.mark.parametrize("config", CONFIGS, ids=[p.name for p in CONFIGS])
def test_default_table_shows_inputs_within_100_columns(run, config):
    from rich.cells import cell_len

    if config.name in NEEDS_TRANSFORMERS:
        pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")

    extra = ["--allow-import"] if config.name in NEEDS_IMPORT else []
    code, out, err = run("inspect", str(config), *extra)
    assert code == (1 if config.name in BROKEN else 0), out + err
    too_long = [line for line in out.splitlines() if cell_len(line) > 100]
    assert not too_long, "\n".join(too_long)
    header = out.split("\nForward")[1].splitlines()[1].split()
    assert header[:4] == ["#", "module", "input", "output"]
    assert header[-5:] == ["mean", "std", "min", "max", "zeros"]
    data = json.loads(run("inspect", str(config), "--json", *extra)[1])
    lines = _forward_lines(out)
    for call in data["calls"]:
        row = _row(lines, call["index"])
        ins = [i for i in call["inputs"] if i["shape"] is not None]
        assert ins, call["path"]
        assert _shape(ins[0]["shape"]) in row, row
        if len(ins) > 1:
            assert f"+{len(ins) - 1}" in row, row
        if call["status"] == "ok":
            assert _shape(call["outputs"][0]["shape"]) in row, row


def test_default_table_input_marker_counts_every_tensor_input(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "mha_causal.yaml"))
    assert code == 0, out + err
    # query, key, value (one tensor passed three times) and attn_mask: the first and 3 more
    assert "(2, 10, 64) +3" in _row(_forward_lines(out), 0)


SEQUENTIAL_SPEC = """\
name: small sequential
block:
  - ReLU
  - Linear: {in_features: 8, out_features: 16}
  - Tanh
  - Linear: {in_features: 16, out_features: 4, bias: false}
input: {shape: [2, 8], requires_grad: false}
dtype: float64
"""


def _real_sequential():
    """The module SEQUENTIAL_SPEC builds, run on an input like its own: {path: (module, input, output)}."""
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 4, bias=False)).double()
    seen = {}
    for path, module in model.named_modules():
        module.register_forward_hook(lambda m, args, out, path=path: seen.__setitem__(path, (m, args[0], out)))
    model(torch.randn(2, 8, dtype=torch.float64))
    return seen


def test_default_table_marks_outputs_that_do_not_require_grad(run, tmp_path):
    spec = tmp_path / "seq.yaml"
    spec.write_text(SEQUENTIAL_SPEC)
    code, out, err = run("inspect", str(spec))
    assert code == 0, out + err
    lines = _forward_lines(out)
    real = _real_sequential()
    for index, path in enumerate(["", "0", "1", "2", "3"]):
        row = _row(lines, index)
        assert ("no grad" in row) == (not real[path][2].requires_grad), row
    assert "no grad" in _row(lines, 1)  # ReLU of an input that does not require grad


def test_wide_table_has_every_field_in_its_own_column(run, tmp_path):
    import re

    assert "--wide" in run("inspect", "--help")[1]
    spec = tmp_path / "seq.yaml"
    spec.write_text(SEQUENTIAL_SPEC)
    code, out, err = run("inspect", str(spec), "--wide")
    assert code == 0, out + err
    header = out.split("\nForward")[1].splitlines()[1].split()
    assert header == ["#", "path", "class", "inputs", "output", "dtype", "device", "requires_grad", "grad_fn",
                      "params", "mean", "std", "min", "max", "zeros", "NaN", "Inf"]
    lines = _forward_lines(out)
    assert "…" not in "\n".join(lines)  # printed whole, wider than COLUMNS=100, not squeezed
    real = _real_sequential()
    rows = {}
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), line
        rows[cells[1]] = dict(zip(header, cells))
    assert set(rows) == {"(root)", "0", "1", "2", "3"}
    for path, (module, x, y) in real.items():
        row = rows[path or "(root)"]
        assert row["class"] == type(module).__name__
        assert row["inputs"] == _shape(x.shape) and row["output"] == _shape(y.shape)
        assert row["dtype"] == str(y.dtype).replace("torch.", "") == "float64"
        assert row["device"] == str(y.device)
        assert row["requires_grad"] == str(y.requires_grad)
        assert row["grad_fn"] == (type(y.grad_fn).__name__ if y.grad_fn is not None else "—")
        assert row["params"] == f"{sum(p.numel() for p in module.parameters()):,}"
        assert row["NaN"] == "0" and row["Inf"] == "0"
    assert rows["0"]["requires_grad"] == "False" and rows["0"]["grad_fn"] == "—"
    assert rows["1"]["grad_fn"] == "AddmmBackward0" and rows["1"]["params"] == "144"


def test_wide_table_lists_all_tensor_inputs_and_sub_rows(run):
    code, out, err = run("inspect", str(ROOT / "configs" / "mha_causal.yaml"), "--wide")
    assert code == 0, out + err
    lines = _forward_lines(out)
    root = _row(lines, 0)
    for name, dims in (("query", [2, 10, 64]), ("key", [2, 10, 64]), ("value", [2, 10, 64]),
                       ("attn_mask", [10, 10])):
        assert f"{name} {_shape(dims)}" in root
    assert "[0] (2, 10, 64)" in root and "16,640" in root
    assert "[1] (2, 10, 10)" in lines[1] and "└" in lines[1]


def test_wide_svg_is_not_cut(run, tmp_path):
    svg = tmp_path / "wide.svg"
    code, out, err = run("inspect", str(ROOT / "configs" / "lstm.yaml"), "--wide", "--svg", str(svg))
    assert code == 0, out + err
    text = svg.read_text()
    assert "requires_grad" in text and "StackBackward0" in text
