"""Hostile spec files (issue 11): each ends in one clean error, exit 2, naming file:line:col and
the limit — in bounded time and memory, never a traceback, a hang or an out-of-memory kill.

Every hostile file is written into tmp_path by the test; the CLI runs in-process.
"""

import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from layerlab.cli.app import main
from layerlab.errors import SpecError, UsageError
from layerlab.spec import build, load_spec, parse_spec_text
from layerlab.spec import limits
from layerlab.spec.load import parse_yaml
from layerlab.spec.memory import check_fits

RELU = "layer: ReLU\ninput: {shape: [2, 3]}\n"
COMMANDS = ("inspect", "gradcheck", "profile", "export-check")


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """``cli(text_or_path, *args)`` → (exit code, stdout, stderr); a text is written to tmp_path/s.yaml."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)

    def _run(command, spec, *args, name="s.yaml"):
        if not isinstance(spec, os.PathLike):
            path = tmp_path / name
            path.write_bytes(spec.encode("utf-8") if isinstance(spec, str) else spec)
            spec = path
        code = main([command, str(spec), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return _run


def refused(cli, command, spec, *args, name="s.yaml"):
    """Run with --json: exit 2, stderr is one JSON error and no traceback; returns it."""
    code, out, err = cli(command, spec, *args, "--json", name=name)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    error = json.loads(err)
    assert error["exit_code"] == 2
    return error


# -- item 1: aliases ----------------------------------------------------------------------------------

def billion_laughs(levels: int) -> str:
    lines = ["layer: ReLU", "input: {shape: [2]}", "args:", "  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"  {cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_fast_and_small(cli):
    text = billion_laughs(9)  # 10^9 leaves in 0.5 kB
    assert len(text) < 600
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(SpecError, match=r"more than 100,000 values, counting each alias as a copy") as info:
        parse_yaml(text, "bomb.yaml")
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 2 and peak < 20e6, (seconds, peak)
    # *d stands for 11,111 values: the 8th *d on line 8 (e) crosses 100,000
    assert info.value.where == "bomb.yaml:8:38"
    assert "the alias *d (which stands for 11,111 values)" in info.value.message
    error = refused(cli, "inspect", text)
    assert error["where"].endswith("s.yaml:8:38")


def test_aliases_below_the_limit_still_work():
    data, marks = parse_yaml("a: &x [1, 2]\nb: *x\nc: *x\n", "ok.yaml")
    assert data == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}
    assert marks("c", 0) == "ok.yaml:3:1"  # inside an alias: the alias's key


def test_recursive_alias_is_refused(cli):
    text = "layer: ReLU\nargs: &a [*a]\ninput: {shape: [2]}\n"
    error = refused(cli, "inspect", text)
    assert "contains itself" in error["message"] and error["where"].endswith("s.yaml:2:11")
    refused(cli, "gradcheck", text)


# -- item 2: repeat -------------------------------------------------------------------------------------

def test_repeat_is_capped(cli):
    error = refused(cli, "inspect", "block:\n  - layer: ReLU\n    repeat: 1000000000\ninput: {shape: [2]}\n")
    assert error["message"] == "repeat must be ≤ 1,000, got 1,000,000,000"
    assert error["where"].endswith("s.yaml:3:5")


def test_nested_repeats_multiply_into_the_layer_cap(cli):
    text = ("block:\n  - block:\n      - layer: ReLU\n        repeat: 1000\n    repeat: 1000\n"
            "input: {shape: [2]}\n")
    error = refused(cli, "profile", text)
    assert "builds 1,000,000 layers" in error["message"] and "at most 10,000" in error["message"]
    assert error["where"].endswith("s.yaml:1:1")


# -- item 3: tracebacks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_deep_brackets_are_refused(cli, command):
    error = refused(cli, command, "layer: ReLU\ninput: {shape: [2]}\nargs: " + "[" * 600 + "]" * 600 + "\n")
    assert "nests deeper than 64 levels" in error["message"]
    assert error["where"].endswith("s.yaml:3:70")  # the 64th bracket: level 65 (the top mapping is 1)


def test_deep_blocks_are_refused(cli):
    text = "block:\n" + "".join("  " * i + "- block:\n" for i in range(300)) + "  " * 300 + "- ReLU\ninput: [2]\n"
    error = refused(cli, "inspect", text)
    assert "nests deeper than 64 levels" in error["message"]


def test_nul_byte_is_refused_with_its_position(cli):
    error = refused(cli, "inspect", "layer: ReLU\ninput: {shape: [2, \x003]}\n")
    assert "U+0000" in error["message"] and error["where"].endswith("s.yaml:2:20")
    error = refused(cli, "gradcheck", b"layer: ReLU\n\xff\n")
    assert "not UTF-8" in error["message"] and error["where"].endswith("s.yaml:2:1")


def test_dims_beyond_int64_are_refused(cli):
    error = refused(cli, "inspect", "layer: ReLU\ninput: {shape: [100000000000000000000000000]}\n")
    assert "int64" in error["message"] and error["where"].endswith("s.yaml:2:9")
    error = refused(cli, "export-check", "layer: ReLU\ninput: {shape: [4294967296, 4294967296]}\n")
    assert "1.84e+19 elements" in error["message"]
    error = refused(cli, "inspect", RELU, "--input-shape", "4294967296,4294967296")
    assert error["where"] == "--input-shape" and "int64" in error["message"]


@pytest.mark.parametrize("command", COMMANDS)
def test_seeds_beyond_int64_are_refused(cli, command):
    error = refused(cli, command, "seed: 9223372036854775808\n" + RELU)
    assert error["message"] == "seed must be ≤ 9,223,372,036,854,775,807, got 9,223,372,036,854,775,808"
    assert error["where"].endswith("s.yaml:1:1")  # a mapping entry is marked at its key
    error = refused(cli, command, RELU, "--seed", str(2**63))
    assert error["where"] == "--seed" and error["kind"] == "usage"


def test_negative_seed_override_is_a_usage_error():
    from layerlab.spec import Overrides

    with pytest.raises(UsageError, match="--seed must be between 0 and"):
        parse_spec_text(RELU, overrides=Overrides(seed=-1))


def test_largest_seed_torch_takes_still_builds():
    built = build(parse_spec_text("seed: 9223372036854775807\n" + RELU))
    assert built.seed == 2**63 - 1 and built.inputs["input"].shape == (2, 3)


def test_non_regular_files_are_not_read(cli, tmp_path):
    error = refused(cli, "inspect", Path("/dev/zero"))
    assert "not a regular file" in error["message"]
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    error = refused(cli, "inspect", fifo)  # opening a FIFO for reading would block for ever
    assert "not a regular file" in error["message"] and time.perf_counter() - t0 < 5
    with pytest.raises(SpecError, match="not a regular file"):
        load_spec("/dev/zero")
    assert refused(cli, "gradcheck", Path("/dev/zero"))["exit_code"] == 2


def test_oversized_spec_file_is_refused_unread(cli, tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(8 * 2**30)  # sparse: 8 GiB that occupy no disk
    tracemalloc.start()
    error = refused(cli, "inspect", big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert error["message"] == "the spec file is 8.6 GB; a spec may be at most 1.0 MB"
    assert peak < 50e6


# -- item 10: memory ------------------------------------------------------------------------------------

def test_input_that_cannot_fit_is_refused_with_numbers(cli, monkeypatch):
    monkeypatch.setattr(limits, "available_memory", lambda: 21 * 10**9)
    error = refused(cli, "inspect", "layer: ReLU\ninput: {shape: [1000000, 1000000, 1000]}\n")
    assert error["message"] == "input 'input' alone needs 4.0 PB; 21 GB of memory is free"
    assert error["where"].endswith("s.yaml:2:1")


def test_inputs_together_over_free_memory(monkeypatch):
    monkeypatch.setattr(limits, "available_memory", lambda: 3 * 10**6)
    with pytest.raises(SpecError, match=r"input 'value' needs 4.0 MB \(all inputs 6.0 MB\); 3.0 MB of memory"):
        build(parse_spec_text("layer: Bilinear\nargs: [4, 4, 2]\ninputs:\n  x: {shape: [1, 500, 1000]}\n"
                              "  value: {shape: [2, 500, 500], dtype: float64}\n", filename="m.yaml"))


def test_parameters_that_cannot_fit_are_refused_before_allocating(cli):
    t0 = time.perf_counter()
    error = refused(cli, "gradcheck", "layer: Linear\nargs: {in_features: 1000000, out_features: 1000000}\n"
                                      "input: {shape: [2, 1000000]}\n")
    assert error["message"].startswith("the model's parameters and buffers need 4.0 TB (the inputs another 8.0 MB)")
    assert error["where"].endswith("s.yaml:1:1") and time.perf_counter() - t0 < 10


def test_largest_intermediate_is_estimated_on_meta(monkeypatch):
    # attention weights of MultiheadAttention: (N·heads, L, L) floats = 2 · 2048² · 4 B = 33.6 MB
    text = ("layer: MultiheadAttention\nargs: {embed_dim: 8, num_heads: 2, batch_first: true}\n"
            "inputs:\n  query: {shape: [1, 2048, 8]}\n  key: {same_as: query}\n  value: {same_as: query}\n")
    spec = parse_spec_text(text, filename="a.yaml")
    monkeypatch.setattr(limits, "available_memory", lambda: 30 * 10**6)
    expected = r"needs at least 34 MB: inputs 66 kB, parameters 1.2 kB and one intermediate of 34 MB \(\w+\); 30 MB"
    with pytest.raises(SpecError, match=expected) as info:
        build(spec)
    assert info.value.where == "a.yaml:4:3"
    # the estimate is a lower bound of what torch really allocates for it
    built = build(parse_spec_text(text.replace("2048", "64")))
    out, weights = built.module(*built.args, **built.kwargs)
    assert weights.numel() * weights.element_size() == 64 * 64 * 4


def test_no_false_alarm_and_exact_parameter_bytes(monkeypatch):
    text = ("block:\n  - Conv2d: {in_channels: 3, out_channels: 8, kernel_size: 3}\n  - BatchNorm2d: [8]\n"
            "  - ReLU\ninput: {shape: [2, 3, 16, 16]}\ndtype: float64\n")
    spec = parse_spec_text(text)
    monkeypatch.setattr(limits, "available_memory", lambda: 10**9)
    est = check_fits(spec, lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()))
    real = build(spec).module.double()
    tensors = [*real.parameters(), *real.buffers()]
    assert est.params == sum(t.numel() * t.element_size() for t in tensors)
    assert est.inputs == 2 * 3 * 16 * 16 * 8
    assert est.largest == 2 * 8 * 14 * 14 * 8  # the conv's output


# -- item 11: input names -------------------------------------------------------------------------------

MHA = "layer: MultiheadAttention\nargs: {embed_dim: 8, num_heads: 2}\ninputs:\n  query: {shape: [3, 2, 8]}\n" \
      "  key: {same_as: query}\n  value: {same_as: query}\n"


def test_typo_in_input_name_gets_did_you_mean(cli):
    error = refused(cli, "inspect", MHA + "  atn_mask: {causal: 3}\n")
    assert "by position it would be passed as 'key_padding_mask'" in error["message"]
    assert error["hint"].startswith("did you mean 'attn_mask'?") and error["where"].endswith("s.yaml:7:3")


def test_intentional_positional_names_still_bind():
    built = build(parse_spec_text("layer: Linear\nargs: [4, 2]\ninputs:\n  x: {shape: [2, 4]}\n"))
    assert list(built.inputs) == ["x"] and built.module(*built.args).shape == (2, 2)
    built = build(parse_spec_text(MHA + "  attn_mask: {causal: 3}\n"))
    assert torch.equal(built.kwargs["attn_mask"], nn.Transformer.generate_square_subsequent_mask(3))


# -- item 12: batch_dims --------------------------------------------------------------------------------

LINEAR = "layer: Linear\nargs: {in_features: 4, out_features: 3}\ninputs:\n  input: {shape: [2, 4]}\n"


def test_batch_dim_outside_the_input_is_refused(cli):
    error = refused(cli, "gradcheck", LINEAR + "batch_dims: {input: 7}\n")
    assert error["message"] == "batch_dims: input is 7, but input 'input' has 2 dim(s) (shape [2, 4])"
    assert error["where"].endswith("s.yaml:5:14")
    error = refused(cli, "export-check", LINEAR + "batch_dims: {inptu: 0}\n")
    assert error["hint"] == "did you mean 'input'?"


def test_valid_batch_dims_are_kept():
    from layerlab.checks.resolve import resolve_spec
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(LINEAR + "batch_dims: {input: -2}\n")
    try:
        assert resolve_spec(f.name).batch_dims == {"input": 0}
    finally:
        os.unlink(f.name)


# -- item 13: echoed values -----------------------------------------------------------------------------

def test_control_characters_never_reach_the_terminal(cli):
    code, out, err = cli("inspect", 'name: "\\e[31mRED\\e]0;pwned\\a"\n' + RELU)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[31mRED" in out
    error = refused(cli, "inspect", 'layer: "Re\\e[2JLU"\ninput: [2]\n')
    assert "\x1b" not in json.dumps(error, ensure_ascii=False) and "\\x1b[2J" in error["message"]
    code, out, err = cli("gradcheck", 'layer: "Re\\e[2JLU\\rX"\ninput: [2]\n')
    assert code == 2 and "\x1b" not in err and "\r" not in err


def test_control_characters_in_the_file_name_are_not_echoed(cli):
    code, out, err = cli("inspect", RELU, name="evil\x1b[31m\x07.yaml")
    assert code == 0 and "\x1b" not in out + err and "evil\\x1b[31m\\x07.yaml" in out
    code, out, err = cli("inspect", "layer: ReLUU\ninput: [2]\n", name="evil\x1b[31m.yaml")
    assert code == 2 and "\x1b" not in err and "evil\\x1b[31m.yaml:1:1" in err


def test_long_values_are_truncated(cli):
    code, out, err = cli("inspect", "layer: " + "Q" * 900_000 + "\ninput: [2]\n")
    assert code == 2 and "more characters)" in err and len(err) < 10_000


def test_clean_text_keeps_ordinary_text():
    assert limits.clean_text("conv → ReLU ½") == "conv → ReLU ½"
    assert limits.clean_text("a\u202eb\x9bc") == "a\\u202eb\\x9bc"


# -- minor: device ---------------------------------------------------------------------------------------

def test_unknown_device_has_line_and_column(cli):
    error = refused(cli, "inspect", "layer: ReLU\ndevice: banana\ninput: [2]\n")
    assert error["message"] == "unknown device 'banana' in the spec's device" and error["where"].endswith("s.yaml:2:1")
    error = refused(cli, "inspect", "layer: ReLU\ninputs:\n  input: {shape: [2], device: banana}\n")
    assert error["where"].endswith("s.yaml:3:23")
    error = refused(cli, "inspect", RELU, "--device", "banana")
    assert error["where"] == "--device"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_missing_device_points_at_device_key(cli):
    error = refused(cli, "inspect", "layer: Linear\nargs: [2, 2]\ndevice: cuda\ninput: [2, 2]\n")
    assert error["message"].startswith("cannot move the model to device 'cuda'")
    assert error["where"].endswith("s.yaml:3:1") and "\n" not in error["message"]


def test_the_memory_estimate_does_not_import_dynamo():
    """The meta forward's dispatch mode must not pull in torch._dynamo (about 1 s of every command)."""
    import subprocess
    import sys
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "configs" / "conv2d.yaml"
    code = ("import sys\nfrom layerlab.target.build import from_spec\nfrom_spec(sys.argv[1])\n"
            "import layerlab.spec.memory\nprint('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


LAZY = "block:\n  - LazyLinear: {out_features: 4}\n  - ReLU\ninput: {shape: [2, 7]}\n"


def test_a_lazy_layer_passes_the_memory_guard_and_runs(cli):
    """A Lazy* layer's weights have no size before its first forward: the memory estimate skips them
    (it used to raise on them, a traceback in every command) and the run materialises them as torch does."""
    code, out, err = cli("inspect", LAZY, "--json")
    assert code == 0, err
    report = json.loads(out)
    lazy = torch.nn.LazyLinear(4)
    lazy(torch.randn(2, 7))
    assert report["total_params"] == sum(p.numel() for p in lazy.parameters()) == 32
    assert report["outputs"][0]["shape"] == [2, 4]


def test_a_misspelt_command_key_is_offered_as_did_you_mean(cli):
    """``reference:`` and the per-command sections are read before the spec is validated; a typo of one
    must still be recognised, with the key it meant."""
    for typo, meant in (("refrence: torch.nn.Linear", "reference"), ("trian: {steps: 5}", "train"),
                        ("precison: {dtype: bfloat16}", "precision")):
        error = refused(cli, "inspect", f"layer: Linear\nargs: {{in_features: 4, out_features: 2}}\n{typo}\n"
                                        "input: {shape: [2, 4]}\n")
        assert f"did you mean '{meant}'" in error["hint"], error


def test_a_hugging_face_config_takes_its_common_arguments_and_refuses_a_typo(cli, tmp_path):
    """transformers 5's config signatures list the architecture's own arguments only, yet the config
    takes every common one (num_labels …) and silently keeps a typo as an attribute."""
    tf = pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    assert tf.BertConfig(num_labels=3).num_labels == 3 and tf.BertConfig(num_labelz=3).num_labels == 2
    spec = ("layer: transformers:BertForSequenceClassification\nargs:\n  config:\n    class: transformers:BertConfig\n"
            "    args: {vocab_size: 100, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
            "intermediate_size: 64, %s: 3}\nmode: eval\ninputs:\n  input_ids: {shape: [2, 7], low: 0, high: 100}\n")
    code, out, err = cli("inspect", spec % "num_labels", "--allow-import", "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["shape"] == [2, 3]
    error = refused(cli, "inspect", spec % "num_labelz", "--allow-import")
    assert "no argument 'num_labelz'" in error["message"] and "did you mean 'num_labels'" in error["hint"]
    error = refused(cli, "inspect", spec % "to_dict", "--allow-import")  # a method is not an argument
    assert "no argument 'to_dict'" in error["message"]
