"""explain-shape across torch versions: both sides of every change in layerlab.shapes.torch_version.

``RECORDED`` is what real torch did on CPU (one thread, the oracle's settings) for each case,
recorded once under torch 2.13.0+cpu and once under 2.14.1+cu130. The tests:

* layerlab's prediction for each recorded version (``torch_version=…``) is that recording —
  these run under any torch;
* the recording of the installed torch's version is what the installed torch does now, and so
  is layerlab's default prediction — the live check that keeps the recordings honest (under 2.13
  it verifies one column, under 2.14 the other).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest
import torch

from layerlab.errors import UsageError
from layerlab.shapes import explain
from layerlab.shapes.torch_version import CHANGES, MEASURED, parse_version, torch_rules
from tests.shapes.oracle import Outcome, assert_same_outcome, layerlab_outcome, torch_outcome

nn = torch.nn

V213, V214 = "2.13.0", "2.14.1"
ZERO_NORM = ("ValueError", "norm_type must be a non-zero value, but got 0")

#: (op, input shape, params) → {torch version: output shape, or (exception, first message line)}
RECORDED = [
    # change lp-pool-zero-norm-valueerror: 2.13 fails on 1/0 after every pooling check, 2.14 first of all
    ("lp_pool2d", (1, 1, 8, 8), dict(norm_type=0, kernel_size=3),
     {V213: ("ZeroDivisionError", "float division by zero"), V214: ZERO_NORM}),
    ("lp_pool1d", (1, 1, 8), dict(norm_type=0, kernel_size=(3,)),
     {V213: ("TypeError", "mul(): argument 'other' (position 1) must be Tensor, not tuple"), V214: ZERO_NORM}),
    ("lp_pool1d", (8,), dict(norm_type=0, kernel_size=3),
     {V213: ("RuntimeError", "Expected 2 to 3 dimensions, but got 1-dimensional tensor for argument #1 'self' "
                             "(while checking arguments for avg_pool1d)"), V214: ZERO_NORM}),
    ("lp_pool2d", (1, 1, 8, 8), dict(norm_type=0.0, kernel_size=(3,)),
     {V213: ("ValueError", "not enough values to unpack (expected 2, got 1)"),
      V214: ("ValueError", "norm_type must be a non-zero value, but got 0.0")}),
    ("lp_pool3d", (1, 1, 2, 2, 2), dict(norm_type=0, kernel_size=3),
     {V213: ("RuntimeError", "input image (T: 2 H: 2 W: 2) smaller than kernel size (kT: 3 kH: 3 kW: 3)"),
      V214: ZERO_NORM}),
    ("lp_pool2d", (1, 1, 8, 8), dict(norm_type=1, kernel_size=3), {V213: (1, 1, 2, 2), V214: (1, 1, 2, 2)}),
    # change replicate-pad-every-dim: Conv{2,3}d(padding_mode='replicate') runs F.pad first
    ("conv2d", (1, 1, 2, 2), dict(kernel_size=1, padding=-1, padding_mode="replicate"),
     {V213: ("RuntimeError", "input (H: 2, W: 2 ) is too small. Calculated output H: 0 W: 0"),
      V214: ("RuntimeError", "Calculated output H: 0 W: 0 must be >= 1 in every dimension (input H: 2, W: 2)")}),
    ("conv2d", (1, 1, 2, 3), dict(kernel_size=1, padding=(-1, 0), padding_mode="replicate"),
     {V213: ("RuntimeError", "Calculated padded input size per channel: (0 x 3). Kernel size: (1 x 1). "
                             "Kernel size can't be greater than actual input size"),
      V214: ("RuntimeError", "Calculated output H: 0 W: 3 must be >= 1 in every dimension (input H: 2, W: 3)")}),
    ("conv2d", (1, 1, 2, 2), dict(kernel_size=1, padding=(-2, 1), padding_mode="replicate"),
     {V213: ("RuntimeError", "Trying to create tensor with negative dimension -2: [1, 1, -2, 4]"),
      V214: ("RuntimeError", "Calculated output H: -2 W: 4 must be >= 1 in every dimension (input H: 2, W: 2)")}),
    ("conv3d", (1, 1, 2, 2, 2), dict(kernel_size=1, padding=-1, padding_mode="replicate"),
     {V213: ("RuntimeError", "input (D: 2 H: 2, W: 2) is too small. Calculated output D: 0 H: 0 W: 0"),
      V214: ("RuntimeError", "Calculated output D: 0 H: 0 W: 0 must be >= 1 in every dimension "
                             "(input D: 2, H: 2, W: 2)")}),
    ("conv3d", (1, 1, 3, 2, 3), dict(kernel_size=1, padding=(0, -1, 0), padding_mode="replicate"),
     {V213: ("RuntimeError", "Calculated padded input size per channel: (3 x 0 x 3). Kernel size: (1 x 1 x 1). "
                             "Kernel size can't be greater than actual input size"),
      V214: ("RuntimeError", "Calculated output D: 3 H: 0 W: 3 must be >= 1 in every dimension "
                             "(input D: 3, H: 2, W: 3)")}),
    # Conv1d with a 2-tuple padding: F.pad pads the channel dim too (2 padded dims → the 2-D rule)
    ("conv1d", (1, 1, 3), dict(kernel_size=1, padding=(0, -2), padding_mode="replicate"),
     {V213: ("RuntimeError", "Trying to create tensor with negative dimension -1: [1, 1, -1]"),
      V214: ("RuntimeError", "Calculated output H: 1 W: -1 must be >= 1 in every dimension (input H: 1, W: 3)")}),
    # unchanged: one padded dim, reflect padding, and valid negative padding
    ("conv1d", (1, 1, 2), dict(kernel_size=1, padding=-1, padding_mode="replicate"),
     {V213: ("RuntimeError", "input (W: 2) is too small. Calculated output W: 0"),
      V214: ("RuntimeError", "input (W: 2) is too small. Calculated output W: 0")}),
    ("conv2d", (1, 1, 3, 3), dict(kernel_size=1, padding=-2, padding_mode="reflect"),
     {V213: ("RuntimeError", "input (H: 3, W: 3) is too small. Calculated output H: -1 W: -1"),
      V214: ("RuntimeError", "input (H: 3, W: 3) is too small. Calculated output H: -1 W: -1")}),
    ("conv2d", (1, 1, 2, 5), dict(kernel_size=1, padding=(0, -1), padding_mode="replicate"),
     {V213: (1, 1, 2, 3), V214: (1, 1, 2, 3)}),
]
IDS = [f"{op}{shape}-{params}" for op, shape, params, _ in RECORDED]


def as_outcome(recorded) -> Outcome:
    if isinstance(recorded[0], str):
        return Outcome(exc=recorded[0], message=recorded[1])
    return Outcome(shape=tuple(recorded))


def run_torch(op: str, shape, params) -> Outcome:
    nd = int(op[-2])
    if op.startswith("conv"):
        channels = shape[-nd - 1]
        return torch_outcome(lambda: getattr(nn, f"Conv{nd}d")(channels, channels, **params)(torch.zeros(shape)))
    return torch_outcome(lambda: getattr(nn, f"LPPool{nd}d")(**params)(torch.zeros(shape)))


def installed_recording_key():
    installed = parse_version(torch.__version__)
    return next((v for v in (V213, V214) if parse_version(v) == installed), None)


@pytest.mark.parametrize("version", [V213, V214])
@pytest.mark.parametrize("op, shape, params, recorded", RECORDED, ids=IDS)
def test_prediction_for_each_version(version, op, shape, params, recorded):
    ours = layerlab_outcome(op, shape, torch_version=version, **params)
    assert_same_outcome(ours, as_outcome(recorded[version]), f"torch {version}: {op}{shape} {params}")


@pytest.mark.parametrize("op, shape, params, recorded", RECORDED, ids=IDS)
def test_installed_torch_matches_recording_and_default_prediction(op, shape, params, recorded):
    theirs = run_torch(op, shape, params)
    assert_same_outcome(layerlab_outcome(op, shape, **params), theirs, f"installed torch: {op}{shape} {params}")
    key = installed_recording_key()
    if key is None:
        pytest.skip(f"recordings are for torch {V213} and {V214}, not {torch.__version__}")
    assert_same_outcome(as_outcome(recorded[key]), theirs, f"recording {key} vs live torch")


def test_every_change_has_a_case_that_tells_the_versions_apart():
    differs = [(op, params) for op, _, params, rec in RECORDED if rec[V213] != rec[V214]]
    assert any(op.startswith("lp_pool") for op, _ in differs)
    assert any(p.get("padding_mode") == "replicate" for op, p in differs if op.startswith("conv"))
    assert set(CHANGES) == {"lp-pool-zero-norm-valueerror", "replicate-pad-every-dim"}


# --------------------------------------------------------------------------------------------
# the version itself


@pytest.mark.parametrize("text, parsed", [
    ("2.14.1+cu130", (2, 14, 1)), ("2.13.0+cpu", (2, 13, 0)), ("2.15.0a0+git1234abc", (2, 15, 0)),
    ("2.16.0.dev20260101", (2, 16, 0)), ("2.13", (2, 13, 0)), (" 2.14.1 ", (2, 14, 1)),
])
def test_parse_version(text, parsed):
    assert parse_version(text) == parsed


@pytest.mark.parametrize("bad", ["", "banana", "v2.14", "2"])
def test_bad_version_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="not a torch version"):
        explain("conv2d", (1, 1, 8, 8), kernel_size=3, torch_version=bad)


@pytest.mark.parametrize("version, has_changes, measured", [
    ("1.13.1", False, False), ("2.13.0", False, True), ("2.13.0+cpu", False, True), ("2.13.9", False, False),
    ("2.14.0", True, False), ("2.14.1+cu130", True, True), ("2.15.0", True, False),
])
def test_version_ranges(version, has_changes, measured):
    rules = torch_rules(version)
    assert [rules.has(name) for name in CHANGES] == [has_changes] * len(CHANGES)
    assert (rules.measured, rules.source) == (measured, "given")


def test_default_is_the_installed_torch_from_metadata():
    ex = explain("conv2d", (1, 1, 8, 8), kernel_size=3)
    assert ex.torch_rules.version == metadata.version("torch")
    assert parse_version(ex.torch_rules.version) == parse_version(torch.__version__)
    assert ex.to_dict()["torch"] == {"version": metadata.version("torch"), "from": "installed",
                                     "measured": installed_recording_key() is not None}
    given = explain("conv2d", (1, 1, 8, 8), kernel_size=3, torch_version="2.13.0").to_dict()["torch"]
    assert given == {"version": "2.13.0", "from": "given", "measured": True}
    assert MEASURED == (V213, V214)


def test_version_is_read_without_importing_torch():
    code = ("import sys, json\nfrom layerlab.shapes import explain\n"
            "ex = explain('lp_pool2d', (1, 1, 8, 8), norm_type=0, kernel_size=3)\n"
            "print(json.dumps([ex.torch_rules.version, ex.error.torch_exception, 'torch' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    version, exc, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert version == metadata.version("torch") and not imported
    assert exc == run_torch("lp_pool2d", (1, 1, 8, 8), dict(norm_type=0, kernel_size=3)).exc


def test_cli_torch_version_flag(capsys, monkeypatch):
    from layerlab.cli.app import main

    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    args = ["explain-shape", "--op", "lp_pool", "--input", "8", "--kernel", "3", "--norm-type", "0"]
    for version, expected in ((V213, RECORDED[0][3][V213]), (V214, RECORDED[0][3][V214])):
        assert main(args + ["--torch-version", version, "--json"]) == 1
        data = json.loads(capsys.readouterr().out)
        # the CLI's --norm-type is a float: torch quotes 0.0
        assert (data["error"]["torch_exception"], data["error"]["torch_message"]) == (
            expected[0], expected[1].replace("got 0", "got 0.0"))
        assert data["torch"] == {"version": version, "from": "given", "measured": True}
    assert main(args + ["--torch-version", "2.15.0"]) == 1
    assert "predicted for torch 2.15.0" in capsys.readouterr().out
    assert main(args + ["--torch-version", "banana"]) == 2
    assert "--torch-version" in capsys.readouterr().err
