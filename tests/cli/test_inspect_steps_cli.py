"""``layerlab inspect --steps``: recurrent layers over time from the command line."""

from __future__ import annotations

import json

import pytest
import torch


def test_steps_json_has_one_value_per_time_step_and_matches_torch(run):
    code, out, err = run("inspect", "configs/lstm_steps.yaml", "--steps", "--json")
    assert code == 0, out + err
    (steps,) = [p for p in json.loads(out)["probes"] if p["name"] == "steps"]
    (row,) = steps["rows"]
    assert row["path"] == "(root)" and row["class_name"] == "layerlab LSTM" and row["values"]["steps"] == 30
    assert {k: len(v) for k, v in row["series"].items()} == {"h_norm": 30, "grad_norm": 30, "sigmoid_sat": 30,
                                                            "tanh_sat": 30}
    assert all(g > 0 for g in row["series"]["grad_norm"])
    assert steps["findings"] == []  # inspect's default loss reads every step: nothing vanishes

    # the same hidden norms as the layer's own output, built as the spec builds it
    from layerlab.cli.target_arg import resolve

    target = resolve("configs/lstm_steps.yaml", options=None, allow_import=False, reference=False)
    pos, kw = target.split()
    with torch.no_grad():
        expected = target.module(*pos, **kw)[0].transpose(0, 1).flatten(1).norm(dim=1).tolist()
    assert row["series"]["h_norm"] == pytest.approx(expected, rel=1e-5)


def test_steps_table_is_shown(run):
    code, out, err = run("inspect", "configs/gru.yaml", "--steps")
    assert code == 0, out + err
    assert "Recurrent layers over time" in out and "grad x₀/x_T" in out


def test_steps_with_meta_is_a_clear_usage_error(run):
    code, out, err = run("inspect", "configs/lstm.yaml", "--steps", "--meta")
    assert code == 2, out + err
    assert "probes need values" in err and "Traceback" not in err


def test_steps_is_in_the_help(run):
    code, out, _ = run("inspect", "--help")
    assert code == 0 and "--steps" in out
