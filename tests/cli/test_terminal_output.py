"""What reaches the terminal: stdout that cannot be written, encodings that cannot show a
character, Rich markup and control characters in a spec's text, mathtext in a picture's title."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "100"}
ENV.pop("LAYERLAB_DEBUG", None)
SHAPE = ["explain-shape", "--op", "conv2d", "--input", "32", "-k", "3"]  # no torch: fast


def _layerlab(args, stdout=subprocess.PIPE, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "layerlab", *args], stdout=stdout, stderr=subprocess.PIPE,
                          env=env or ENV, timeout=timeout)


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_stdout_on_a_full_disk_is_one_line_and_exit_1(extra):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = _layerlab(SHAPE + extra, stdout=full)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert err.strip().splitlines() == ["error: cannot write the output: No space left on device — free some space "
                                        "or write somewhere else"]


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_an_ascii_stdout_shows_escapes_rather_than_failing(extra):
    env = {**ENV, "PYTHONIOENCODING": "ascii"}
    done = _layerlab(SHAPE + extra, env=env)
    assert done.returncode == 0, done.stderr.decode()
    assert b"Traceback" not in done.stderr
    out = done.stdout.decode("ascii")  # every byte is ASCII
    if extra:
        json.loads(out)  # non-ASCII as \u escapes: still one JSON document
    else:
        assert "\\u2192" in out  # the arrow, as its escape


def test_a_hostile_spec_name_is_shown_literally_in_human_and_json_output(run, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text('name: "[bold red]MK[/bold red] [link=file:///etc/passwd]LN[/link]\\e[2J\\nFORGED: ok"\n'
                    "layer: Linear\nargs: {in_features: 4, out_features: 2}\ninput: {shape: [2, 4]}\n")
    code, out, err = run("inspect", str(spec))
    assert code == 0, err
    assert "[bold red]MK[/bold red] [link=file:///etc/passwd]LN[/link]\\x1b[2J⏎FORGED: ok" in out
    assert "\x1b" not in out and not any(line.startswith("FORGED") for line in out.splitlines())
    code, out, err = run("inspect", str(spec), "--json")
    assert code == 0, err
    assert "\x1b" not in "".join(_strings(json.loads(out)))  # not even as a JSON \u001b escape


def _strings(doc):
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from _strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v)


def test_json_output_is_one_document_when_the_model_prints(run, tmp_path):
    (tmp_path / "talky.py").write_text(
        "import torch\n"
        "class Talky(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        "        print('debug from forward', x.shape)\n"
        "        return super().forward(x)\n")
    spec = tmp_path / "talky.yaml"
    spec.write_text("layer: ./talky.py:Talky\nargs: {in_features: 4, out_features: 2}\ninput: {shape: [2, 4]}\n")
    code, out, err = run("inspect", str(spec), "--allow-import", "--json")
    assert code == 0, err
    assert json.loads(out)["ok"] is True
    logs = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any("debug from forward" in (entry.get("log") or "") for entry in logs), err


def test_a_plot_title_with_mathtext_is_drawn_literally(run, tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")
    spec = tmp_path / "s.yaml"
    spec.write_text('name: "cost $\\\\frac{a}{$ and $x^2$"\n'  # an unbalanced \frac: mathtext would raise
                    "block:\n  - Linear: {in_features: 4, out_features: 4}\n  - Tanh\n"
                    "  - Linear: {in_features: 4, out_features: 2}\ninput: {shape: [2, 4]}\n")
    picture = tmp_path / "flow.svg"
    code, out, err = run("inspect", str(spec), "--plot", str(picture))
    assert code == 0, err
    svg = picture.read_text()
    assert "cost $\\frac{a}{$ and $x^2$" in svg


def test_a_megabyte_module_name_is_cut_where_it_is_shown(run, tmp_path):
    (tmp_path / "long.py").write_text(
        "import torch\n"
        "class Long(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.add_module('m' * 1_048_576, torch.nn.Linear(4, 4))\n"
        "    def forward(self, x):\n"
        "        return getattr(self, 'm' * 1_048_576)(x)\n")
    spec = tmp_path / "long.yaml"
    spec.write_text("layer: ./long.py:Long\ninput: {shape: [8, 4]}\n"
                    "train: {loss: mse, target: {shape: [8, 4]}, steps: 3}\n")
    code, out, err = run("train-check", str(spec), "--allow-import")
    assert code in (0, 1), err
    assert "…(+1047" in out  # cut, with how much was left out
    assert len(out) + len(err) < 20_000, len(out)
    code, out, err = run("train-check", str(spec), "--allow-import", "--json")
    assert len(out) < 200_000 and "chars)" in out
