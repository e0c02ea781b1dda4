"""``layerlab precision-check``: exit codes, JSON, the first module named, bad input."""

import json

import pytest

from layerlab.mixed.dtypes import autocast_supported

needs_cpu_fp16 = pytest.mark.skipif(autocast_supported("cpu", "float16") is not None,
                                    reason="no float16 autocast on CPU in this torch")


def test_help(run):
    code, out, err = run("precision-check", "--help")
    assert code == 0, err
    assert "--autocast" in out and "--cast" in out and "--grad-scaler" in out


def test_healthy_config_passes_as_json(run):
    code, out, err = run("precision-check", "configs/transformer_preln.yaml", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "precision-report" and data["ok"] is True
    [r] = data["runs"]
    assert r["label"] == "autocast bfloat16" and r["first"] is None
    assert r["tolerance"]["eps"] == 2 ** -7 and r["output_error"] < 2 * 2 ** -7
    assert any(row["path"] == "linear1" and row["dtype"] == "bfloat16" for row in r["rows"])


def test_planted_variance_fails_and_names_the_module(run):
    code, out, err = run("precision-check", "configs/precision_variance.yaml", "--allow-import")
    assert code == 1, out + err
    assert "first: norm (SumOfSquaresNorm) loses precision in autocast bfloat16" in out
    assert "pow runs in bfloat16" in out and "FAILED" in out


def test_overflow_forecast_warns_without_failing(run):
    code, out, err = run("precision-check", "configs/precision_overflow.yaml", "--allow-import", "--json")
    assert code == 0, out + err
    [fc] = json.loads(out)["forecast"]
    assert fc["kind"] == "fp16-overflow" and fc["where"] == "gate"


@needs_cpu_fp16
def test_overflow_fails_under_fp16_autocast(run):
    code, out, err = run("precision-check", "configs/precision_overflow.yaml", "--allow-import",
                         "--autocast", "float16", "--json")
    assert code == 1, out + err
    first = json.loads(out)["runs"][0]["first"]
    assert first["kind"] == "overflow" and first["where"] == "gate"


def test_cast_mode_next_to_autocast(run):
    code, out, err = run("precision-check", "configs/transformer_preln.yaml", "--cast", "bfloat16", "--json")
    assert code == 0, out + err
    assert [r["label"] for r in json.loads(out)["runs"]] == ["autocast bfloat16", "cast bfloat16"]


@pytest.mark.parametrize("args, where", [
    (["--autocast", "float64"], "--autocast"),
    (["--cast", "int8"], "--cast"),
    (["--tolerance-scale", "0"], "--tolerance-scale"),
    (["--autocast", "none"], "--autocast"),  # nothing left to compare
])
def test_bad_options_exit_2_with_one_json_error(run, args, where):
    code, out, err = run("precision-check", "configs/transformer_preln.yaml", *args, "--json")
    assert code == 2, out + err
    assert out == ""
    assert json.loads(err.strip().splitlines()[-1])["where"] == where


def test_missing_spec_exits_2(run):
    code, out, err = run("precision-check", "configs/nope.yaml")
    assert code == 2 and "no such spec file" in err
