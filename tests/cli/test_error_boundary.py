"""The CLI's one error boundary (issue 11): bad options and hostile situations end in one clean
message and the documented exit code, never a traceback; every stderr line of a ``--json`` run parses.

Option limits (seed, threads, tolerances, devices, --svg/--html) are checked before any work;
the boundary itself is exercised through ``main`` (the console script), typer's ``CliRunner``, and a
real subprocess for the broken pipe.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from layerlab.arguments import MAX_SEED, max_threads

COMMANDS = ("inspect", "gradcheck", "profile", "export-check")
ROOT = Path(__file__).resolve().parents[2]


def json_lines(err: str) -> list:
    """Every stderr line of a --json run is one JSON object (warnings first, the error last)."""
    assert "Traceback" not in err, err
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def one_error(code: int, out: str, err: str, where: str) -> dict:
    """Exit 2, nothing on stdout, and exactly one message on stderr: the error, naming ``where``."""
    assert code == 2, out + err
    assert out == "", out
    lines = json_lines(err)
    assert len(lines) == 1, err
    assert lines[0]["error"] == "UsageError" and lines[0]["exit_code"] == 2
    assert lines[0]["where"] == where, lines[0]
    return lines[0]


# -- --seed (items 3 and 7) ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("seed", [str(2**63), str(2**64), str(2**70), "-1"])
def test_seed_out_of_range_is_a_usage_error(run, command, seed):
    error = one_error(*run(command, "linear", "--seed", seed, "--json"), where="--seed")
    assert error["got"] == int(seed) and "2**63" in error["message"]


def test_seed_out_of_range_human_message(run):
    code, out, err = run("gradcheck", "linear", "--seed", str(2**63))
    assert code == 2, out + err
    assert err.startswith("error: --seed must be between 0 and 2**63 − 1") and "Traceback" not in err


def test_largest_seed_runs_clean_gradcheck(run):
    """Item 7: gradcheck max_pool2d at seed 2**63 − 1 blamed three checks on the layer ("Overflow")."""
    code, out, err = run("gradcheck", "max_pool2d", "--seed", str(MAX_SEED), "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["settings"]["seed"] == MAX_SEED
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["gradcheck"] == "pass" and statuses["batch_consistency"] == "pass", statuses
    assert "Overflow" not in out and "fail" not in statuses.values()


def test_largest_seed_runs_inspect(run):
    code, out, err = run("inspect", "linear", "--seed", str(MAX_SEED), "--json")
    assert code == 0, out + err
    assert json.loads(out)["ok"] is True


# -- --threads, --rtol/--atol (items 3 and 12) ----------------------------------------------------------

def test_threads_bounded(run):
    error = one_error(*run("profile", "linear", "--threads", "100000", "--json"), where="--threads")
    assert error["got"] == 100000 and str(max_threads()) in error["message"]


def test_threads_within_bound_runs(run):
    code, out, err = run("profile", "linear", "--threads", str(max_threads()), "--repeats", "1", "--warmup", "0",
                         "--json")
    assert code == 0, out + err
    assert json.loads(out)["threads"] == max_threads()


@pytest.mark.parametrize("flag, value", [("--rtol", "nan"), ("--rtol", "inf"), ("--atol", "-inf"),
                                         ("--atol", "-1e-3"), ("--rtol", "-0.5")])
def test_bad_tolerances_rejected(run, flag, value):
    one_error(*run("export-check", "linear", flag, value, "--json"), where=flag)


def test_tolerance_used_when_valid(run):
    code, out, err = run("export-check", "linear", "--paths", "trace", "--rtol", "0.01", "--atol", "0", "--json")
    assert code == 0, out + err
    settings = json.loads(out)["settings"]
    assert (settings["rtol"], settings["atol"]) == (0.01, 0.0)


# -- --svg/--html checked before the run (item 4) -------------------------------------------------------

def _unwritable_paths(tmp_path):
    paths = [str(tmp_path / "no" / "such" / "dir" / "view.svg")]
    if Path("/proc/self").exists():
        paths.append("/proc/layerlab-test.svg")
    if Path("/dev/full").exists():
        paths.append("/dev/full")
    return paths


@pytest.mark.parametrize("flag", ["--svg", "--html"])
def test_unwritable_output_refused_before_the_run(run, tmp_path, flag):
    for path in _unwritable_paths(tmp_path):
        code, out, err = run("inspect", "linear", flag, path)
        assert code == 2, (path, out + err)
        assert out == "", f"{path}: the run went ahead before refusing the path"
        assert err.startswith(f"error: {flag}:") and "Traceback" not in err, err


def test_writability_probe_leaves_nothing_behind(run, tmp_path):
    target = tmp_path / "view.svg"
    code, out, err = run("inspect", "no/such/spec.yaml", "--svg", str(target))
    assert code == 2, out + err  # the spec failed after the path was checked
    assert not target.exists()


def test_writable_output_saved(run, tmp_path):
    target = tmp_path / "view.html"
    target.write_text("old")
    code, out, err = run("inspect", "linear", "--html", str(target))
    assert code == 0, out + err
    assert "<html" in target.read_text().lower()


# -- --device (items 8 and 9) ---------------------------------------------------------------------------

def _absent(device: str) -> bool:
    try:
        torch.empty(0, device=device)
    except Exception:
        return True
    return False


@pytest.mark.parametrize("command, device", [("export-check", "mps"), ("profile", "xla"), ("inspect", "cuda"),
                                             ("profile", "cuda:7"), ("export-check", "nonsense")])
def test_unavailable_device_blames_the_option(run, command, device):
    if not _absent(device):
        pytest.skip(f"{device} exists on this machine")
    error = one_error(*run(command, "linear", "--device", device, "--json"), where="--device")
    assert error["got"] == device and "cpu" in error["hint"]


@pytest.mark.parametrize("command", ["inspect", "profile", "export-check"])
def test_device_meta_refused(run, command):
    error = one_error(*run(command, "linear", "--device", "meta", "--json"), where="--device")
    assert "meta tensors have shapes but no values" in error["message"]


@pytest.mark.parametrize("command", COMMANDS)
def test_spec_on_meta_refused(run, tmp_path, command):
    spec = tmp_path / "meta.yaml"
    spec.write_text("layer: Linear\nargs: {in_features: 3, out_features: 2}\ninput: {shape: [2, 3]}\ndevice: meta\n")
    code, out, err = run(command, str(spec), "--json")
    assert code == 2, out + err
    (error,) = json_lines(err)
    assert "meta tensors have shapes but no values" in error["message"] and str(spec) in error["where"]


# -- warnings, broken pipe, Ctrl-C, the message itself (minor items) -----------------------------------

GRU_SPEC = "layer: GRU\nargs: {input_size: 3, hidden_size: 4, dropout: 0.5, batch_first: true}\ninput: {shape: [2, 5, 3]}\n"


def test_torch_warnings_are_json_under_json(run, tmp_path):
    """nn.GRU(dropout=0.5, num_layers=1) warns (a real torch UserWarning): under --json it is a JSON line."""
    spec = tmp_path / "gru.yaml"
    spec.write_text(GRU_SPEC)
    code, out, err = run("inspect", str(spec), "--json")
    assert code == 0, out + err
    lines = json_lines(err)
    assert [w["category"] for w in lines] == ["UserWarning"], lines
    assert "non-zero dropout expects num_layers greater than 1" in lines[0]["warning"]
    assert json.loads(out)["ok"] is True


def test_torch_warnings_untouched_without_json(tmp_path):
    spec = tmp_path / "gru.yaml"
    spec.write_text(GRU_SPEC)
    done = subprocess.run([sys.executable, "-m", "layerlab", "inspect", str(spec)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "UserWarning: dropout option adds dropout" in done.stderr


@pytest.mark.parametrize("argv", [["explain-shape", "--input", "32", "--kernel", "3"],
                                  ["explain-shape", "--input", "32", "--kernel", "3", "--json"],
                                  ["inspect", "linear"], ["--help"], ["inspect", "--help"]])
def test_closed_stdout_exits_141_quietly(argv, tmp_path):
    """``layerlab … | head -c 20``: the reader is gone before layerlab writes (closed here on purpose,
    so the pipe is broken every time, not only when the timing says so)."""
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "layerlab", *argv], stdout=subprocess.PIPE, stderr=err_file,
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        proc.stdout.close()
        code = proc.wait(timeout=120)
    assert code == 141, err_path.read_text()
    assert err_path.read_text() == ""


def test_ctrl_c_is_exit_130_with_one_json_line(run, monkeypatch):
    import layerlab.probe.run as probe_run

    def interrupted(*args, **kwargs):  # a real SIGINT, as Ctrl-C sends (a KeyboardInterrupt the code raises
        import os                      # itself is the model's failure, exit 1: tests/cli/test_run_faults_cli.py)
        import signal

        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(probe_run, "inspect", interrupted)
    code, out, err = run("inspect", "linear", "--json")
    assert code == 130, out + err
    (error,) = json_lines(err)
    assert error["error"] == "Interrupted" and error["exit_code"] == 130


def test_unknown_side_not_printed_as_none(capsys):
    from layerlab.cli.output import Output
    from layerlab.errors import CheckFailed

    Output().error(CheckFailed("the layer raised", got="(2, 3)"))
    err = capsys.readouterr().err
    assert "got:      (2, 3)" in err and "expected" not in err and "None" not in err


def test_cli_runner_goes_through_the_same_boundary():
    """typer's CliRunner (standalone mode) sees the same exit codes as ``main``: 2 for a known
    error with its one message, 1 for a failed run (a command's ``return 1`` is not lost)."""
    from typer.testing import CliRunner

    from layerlab.cli.app import app

    runner = CliRunner()
    bad = runner.invoke(app, ["inspect", "linear", "--mode", "sideways"])
    assert bad.exit_code == 2, bad.output
    assert "--mode must be train or eval" in bad.output and "Traceback" not in bad.output
    assert isinstance(bad.exception, SystemExit)  # typer's way to exit 2, not an escaped error
    broken = runner.invoke(app, ["inspect", str(ROOT / "configs" / "broken_block.yaml")])
    assert broken.exit_code == 1, broken.output
