"""``layerlab diff A.json B.json`` and the manifest in every command's --json."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PRE = str(ROOT / "configs" / "transformer_preln.yaml")
POST = str(ROOT / "configs" / "transformer_postln.yaml")


def save(run, path, *argv):
    code, out, err = run(*argv, "--json")
    assert code in (0, 1), err
    path.write_text(out)
    return json.loads(out)


@pytest.mark.parametrize("argv", [
    ["inspect", PRE, "--seed", "3"],
    ["gradcheck", "linear"],
    ["export-check", "linear"],
    ["profile", "linear", "--repeats", "1", "--warmup", "0"],
    ["list"],
    ["explain-shape", "--input", "32", "--kernel", "3"],
])
def test_every_json_report_carries_the_manifest(run, argv):
    code, out, err = run(*argv, "--json")
    assert code == 0, err
    m = json.loads(out)["manifest"]
    assert m["torch"] == torch.__version__
    assert m["command"] == ["layerlab", *argv, "--json"]
    if argv[0] in ("list", "explain-shape"):  # no model: nobody can say which dtype or seed
        assert (m["dtype"], m["seed"], m["spec"]) == (None, None, None)
        return
    assert m["threads"] == torch.get_num_threads()
    assert m["deterministic"]["algorithms"] is torch.are_deterministic_algorithms_enabled()
    assert (m["device"], m["dtype"], m["gpu"]) == ("cpu", "float32", None)
    if argv[0] == "inspect":
        assert m["seed"] == 3 and m["spec"]["path"] == PRE and len(m["spec"]["sha256"]) == 64
    else:
        assert m["seed"] == 0 and m["spec"] is None and m["target"] == "linear"


def test_identical_runs_exit_0(run, tmp_path):
    save(run, tmp_path / "a.json", "inspect", PRE)
    save(run, tmp_path / "b.json", "inspect", PRE)
    code, out, err = run("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 0, out + err
    assert "no differences beyond tolerance" in out and "rtol 0.0001, atol 1e-06" in out


def test_pre_ln_vs_post_ln_is_ranked_and_fits_100_columns(run, tmp_path):
    save(run, tmp_path / "pre.json", "inspect", PRE)
    save(run, tmp_path / "post.json", "inspect", POST)
    a, b = str(tmp_path / "pre.json"), str(tmp_path / "post.json")
    code, out, err = run("diff", a, b, "--top", "5")
    assert code == 1, err
    assert max(len(line) for line in out.splitlines()) <= 100
    rows = [line for line in out.splitlines() if line.split("│")[0].strip().isdigit()]
    assert len(rows) == 5
    assert "spec.sha256" in out and "starts to differ at: (root)" in out  # the root wires its children anew
    code, out, err = run("diff", a, b, "--json")
    assert code == 1, err
    report = json.loads(out)
    numeric = [c["score"] for c in report["changes"] if c["numeric"] and c["what"] != "loss"]
    assert numeric == sorted(numeric, reverse=True) and len(numeric) > 20
    assert report["changes"][-1]["what"] == "loss"  # a consequence of every output: ranked last
    assert report["differs"] is True and report["origins"] == ["(root)"]
    assert {c["where"] for c in report["manifest_changes"]} >= {"spec.path", "spec.sha256"}
    assert report["manifest"]["command"][:2] == ["layerlab", "diff"]  # the diff's own manifest


def test_another_torch_version_is_reported_but_equal_results_exit_0(run, tmp_path):
    data = save(run, tmp_path / "a.json", "gradcheck", "linear")
    data["manifest"]["torch"] = "2.0.0"
    data["manifest"]["threads"] = 64
    (tmp_path / "b.json").write_text(json.dumps(data))
    code, out, err = run("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert code == 0, out + err
    got = {c["where"]: (c["a"], c["b"]) for c in json.loads(out)["manifest_changes"]}
    assert got == {"torch": (torch.__version__, "2.0.0"), "threads": (torch.get_num_threads(), 64)}
    code, out, err = run("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 0 and "torch" in out and "2.0.0" in out


def test_gradcheck_reports_compare_by_verdict(run, tmp_path):
    data = save(run, tmp_path / "a.json", "gradcheck", "linear")
    check = next(c for c in data["checks"] if c["name"] == "backward_parity")
    check["status"] = "fail"
    data["ok"] = False
    (tmp_path / "b.json").write_text(json.dumps(data))
    code, out, err = run("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert code == 1, err
    assert {(c["where"], c["a"], c["b"]) for c in json.loads(out)["changes"]} == {
        ("backward_parity", "pass", "fail"), ("(report)", True, False)}


def test_two_profiles_of_one_layer_differ_only_in_time_so_exit_0(run, tmp_path):
    save(run, tmp_path / "a.json", "profile", "linear", "--repeats", "2", "--warmup", "0")
    save(run, tmp_path / "b.json", "profile", "linear", "--repeats", "2", "--warmup", "0")
    code, out, err = run("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 0, out + err
    assert "times are not compared" in out


@pytest.mark.parametrize("content, message, where", [
    ('{"schema": 1,\n "calls": [1, 2,\n', "is not valid JSON", ":3:1"),
    ("[1, 2, 3]", "is not a layerlab report", None),
    ('{"hello": "world"}', "is not a layerlab report", None),
    ('{"schema": 99, "kind": "profile-report"}', "newer than this layerlab reads", None),
    ('{"schema": 1, "kind": "profile-report", "manifest": {"schema": 7}}', "manifest of schema 7", None),
    ("\udcff", "not UTF-8", None),
])
def test_bad_input_is_exit_2_with_a_clear_message(run, tmp_path, content, message, where):
    good = tmp_path / "good.json"
    save(run, good, "profile", "linear", "--repeats", "1", "--warmup", "0")
    bad = tmp_path / "bad.json"
    bad.write_bytes(content.encode("utf-8", "surrogateescape"))
    code, out, err = run("diff", str(good), str(bad), "--json")
    assert code == 2, out + err
    assert out == ""
    payload = json.loads(err)
    assert message in payload["message"]
    assert payload["where"].startswith(str(bad)) and (where is None or payload["where"].endswith(where))


def test_missing_file_directory_and_mismatched_kinds_are_exit_2(run, tmp_path):
    inspect = tmp_path / "i.json"
    save(run, inspect, "inspect", "linear")
    code, out, err = run("diff", str(inspect), str(tmp_path / "nope.json"))
    assert code == 2 and "no such file" in err
    code, out, err = run("diff", str(inspect), str(tmp_path))
    assert code == 2 and "not a regular file" in err
    profile = tmp_path / "p.json"
    save(run, profile, "profile", "linear", "--repeats", "1", "--warmup", "0")
    code, out, err = run("diff", str(inspect), str(profile))
    assert code == 2, out + err
    assert "cannot compare an inspect report with a profile report" in err
    assert "Traceback" not in err


def test_bad_tolerance_and_top_are_usage_errors(run, tmp_path):
    code, out, err = run("diff", "a.json", "b.json", "--rtol", "-1")
    assert code == 2 and "--rtol" in err
    code, out, err = run("diff", "a.json", "b.json", "--top", "-3")
    assert code == 2


def test_diff_help(run):
    code, out, err = run("diff", "--help")
    assert code == 0, err
    assert "Exit codes: 0 no differences beyond tolerance, 1 differences found, 2 bad input" in " ".join(out.split())


def test_two_specs_are_inspected_and_compared_in_one_command(run):
    code, out, err = run("diff", PRE, PRE)
    assert code == 0, out + err
    assert "runs: made the same way" in out and "no differences beyond tolerance" in out
    code, out, err = run("diff", PRE, POST, "--top", "3", "--json")
    assert code == 1, err
    report = json.loads(out)
    assert (report["a"], report["b"]) == (PRE, POST) and len(report["changes"]) > 20
    hashes = next(c for c in report["manifest_changes"] if c["where"] == "spec.sha256")
    assert hashes["a"] != hashes["b"] and len(hashes["a"]) == 64
