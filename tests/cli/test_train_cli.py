"""``layerlab train-check``: exit codes (0 pass, 1 a check failed, 2 bad input), --json, the table."""

import json

import pytest


def test_help_smoke(run):
    code, out, err = run("train-check", "--help")
    assert code == 0, err
    assert "--steps" in out and "--optimizer" in out and "--lr" in out


def test_healthy_config_passes_with_curve_and_table(run):
    code, out, err = run("train-check", "configs/train_classifier.yaml")
    assert code == 0, out + err
    assert "overfits" in out and "cross_entropy" in out
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█")  # the sparkline
    assert out.rstrip().splitlines()[-1].startswith("ok:")


def test_json_report(run):
    code, out, err = run("train-check", "configs/train_classifier.yaml", "--json", "--steps", "5")
    assert code == 0, err
    data = json.loads(out)
    assert data["kind"] == "train-check-report" and data["schema"] == 1 and data["ok"] is True
    assert data["steps_run"] == 5 and len(data["losses"]) == 5 and len(data["grad_norms"]) == 5
    assert {g["module"] for g in data["groups"]} == {"0", "2"}
    assert all(len(g["update_ratio"]) == 5 for g in data["groups"])


def test_dead_relu_config_fails_naming_the_relu(run):
    code, out, err = run("train-check", "configs/train_dead_relu.yaml", "--allow-import", "--json")
    assert code == 1, out + err
    data = json.loads(out)
    assert ("dead-relu", "1") in {(f["code"], f["where"]) for f in data["flags"]}
    assert json.loads(err.strip().splitlines()[-1])["exit_code"] == 1


def test_wrong_output_config_fails_naming_the_head(run):
    code, out, err = run("train-check", "configs/train_wrong_output.yaml", "--allow-import")
    assert code == 1, out + err
    assert "wrong-output" in out and "head" in err


def test_lr_override_too_high_fails_as_unstable(run):
    code, out, err = run("train-check", "configs/factory_mlp.yaml", "--allow-import", "--lr", "10", "--json")
    assert code == 1, err
    assert "unstable" in {f["code"] for f in json.loads(out)["flags"]}


@pytest.mark.parametrize("args, where", [
    (("--optimizer", "adamm"), "--optimizer"),
    (("--lr", "0"), "--lr"),
    (("--steps", "1"), "--steps"),
])
def test_bad_options_exit_2(run, args, where):
    code, out, err = run("train-check", "configs/train_classifier.yaml", *args, "--json")
    assert code == 2, out + err
    assert json.loads(err.strip().splitlines()[-1])["where"] == where


def test_bad_train_section_exits_2_with_its_line(run, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("layer: Linear\nargs: {in_features: 4, out_features: 2}\ninput: {shape: [3, 4]}\n"
                    "train:\n  loss: hinge\n")
    code, out, err = run("train-check", str(spec))
    assert code == 2, out + err
    assert f"{spec}:5:" in err and "unknown loss" in err


def test_a_warning_does_not_claim_every_parameter_learns(run, tmp_path):
    spec = tmp_path / "eval.yaml"
    spec.write_text("block:\n  - Linear: {in_features: 8, out_features: 16}\n  - Dropout: {p: 0.2}\n"
                    "  - Linear: {in_features: 16, out_features: 2}\ninput: {shape: [4, 8]}\nmode: eval\n")
    code, out, err = run("train-check", str(spec), "--steps", "10")
    assert code == 0, out + err
    assert "eval-mode" in out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("ok: no check failed, 1 warning(s) above") and "every trainable" not in last
