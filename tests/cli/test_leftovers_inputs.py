"""Bad input the last session left through: ``inspect --compare SPEC2``'s ``probes:``, ``diff`` of a
report of schema < 1, ``ddp-check``'s ``--nproc``/``--timeout`` (no process started), and the
``--json`` manifest of ``gradcheck --all`` / ``export-check --all``."""

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PRE, POST = str(ROOT / "configs" / "transformer_preln.yaml"), str(ROOT / "configs" / "transformer_postln.yaml")
DDP = str(ROOT / "configs" / "ddp_mlp.yaml")


def _error_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("error:"))


# --- 1. inspect --compare SPEC2: SPEC2's probes: section is refused as SPEC's would be ---------------

@pytest.mark.parametrize("section", [
    "probes:\n  - nosuchprobe\n",              # an unknown name
    "probes: 3\n",                             # the wrong type
    "probes:\n  - sparsity\n  - 7\n",          # an item of the wrong type
    "probes:\n  - {import: x:y, colour: red}\n",  # an unknown key
    "probes:\n  - my_pkg.probes:entropy\n",    # an import path without --allow-import
])
def test_compare_refuses_spec2s_bad_probes_exactly_as_inspect_refuses_them(run, tmp_path, monkeypatch, section):
    pytest.importorskip("matplotlib", reason="--compare draws into --plot, which needs matplotlib")
    spec2 = tmp_path / "post.yaml"
    spec2.write_text(Path(POST).read_text() + section)
    code, _, alone = run("inspect", str(spec2))
    assert code == 2, alone
    import layerlab.probe.run as probe_run

    ran = []
    real_inspect = probe_run.inspect
    monkeypatch.setattr(probe_run, "inspect", lambda *a, **k: ran.append(1) or real_inspect(*a, **k))
    plot = tmp_path / "flow.svg"
    code, out, err = run("inspect", PRE, "--compare", str(spec2), "--plot", str(plot))
    assert code == 2, out + err
    assert _error_line(err) == _error_line(alone) and f"({spec2}:" in _error_line(err)  # file:line:col
    assert [x for x in err.splitlines() if x.lstrip().startswith(("expected:", "got:", "hint:"))] == \
        [x for x in alone.splitlines() if x.lstrip().startswith(("expected:", "got:", "hint:"))]
    assert "Traceback" not in err and not plot.exists()
    assert ran == []  # refused before either spec ran


def test_compare_with_good_probes_in_spec2_still_draws(run, tmp_path):
    pytest.importorskip("matplotlib", reason="--compare draws into --plot, which needs matplotlib")
    spec2 = tmp_path / "post.yaml"
    spec2.write_text(Path(POST).read_text() + "probes:\n  - sparsity\n")
    plot = tmp_path / "flow.svg"
    code, out, err = run("inspect", PRE, "--compare", str(spec2), "--plot", str(plot))
    assert code == 0, out + err
    assert ">post-LN transformer block<" in plot.read_text()


# --- 2. diff: a schema below 1 is not a layerlab report; nor is a manifest without a schema ≥ 1 -------

@pytest.fixture(scope="module")
def linear_report():
    from layerlab.cli.app import main
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["inspect", "linear", "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.parametrize("change, got", [
    ({"schema": -1}, "-1"),
    ({"schema": 0}, "0"),
    ({"manifest": {"schema": 0}}, '"schema": 0'),
    ({"manifest": {"schema": -3, "torch": torch.__version__, "seed": 0}}, '"schema": -3'),
    ({"manifest": {"schema": "1"}}, 'a str as "schema"'),
    ({"manifest": {"schema": True}}, 'a bool as "schema"'),
    ({"manifest": {"torch": "2.13.0"}}, 'no "schema"'),
    ({"manifest": [1]}, "a JSON list"),
])
@pytest.mark.parametrize("side", ["A", "B"])
def test_diff_refuses_a_schema_below_1_naming_the_file(run, tmp_path, linear_report, change, got, side):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(linear_report))
    bad.write_text(json.dumps({**linear_report, **change}))
    pair = (bad, good) if side == "A" else (good, bad)
    code, out, err = run("diff", *map(str, pair))
    assert code == 2, out + err
    assert _error_line(err).endswith(f"({bad})") and str(good) not in err
    assert "expected:" in err and f"got:      {got}" in err and "Traceback" not in err


def test_diff_still_reads_a_report_without_a_manifest(run, tmp_path, linear_report):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(linear_report))
    b.write_text(json.dumps({**linear_report, "manifest": None}))
    code, out, err = run("diff", str(a), str(b))
    assert code == 0, out + err
    assert "carries no manifest" in out


def test_diff_in_python_refuses_schema_0():
    import layerlab
    from layerlab.report_diff.load import ReportError

    report = {"schema": 0, "kind": "inspect-report", "calls": [], "params": [], "backward": None}
    with pytest.raises(ReportError, match="no layerlab report has") as info:
        layerlab.diff(report, {**report, "schema": 1})
    assert info.value.where == "A" and info.value.got == 0


# --- 3. ddp-check: bad --nproc / --timeout / ddp: values start no process --------------------------

@pytest.fixture
def no_process(monkeypatch):
    """Every way ddp-check starts a process raises; the fork server's start is counted."""
    import multiprocessing.forkserver

    import layerlab.distributed.launch as launch
    import layerlab.distributed.single as single

    started = []

    def refuse(what):
        def _raise(*a, **k):
            raise AssertionError(f"{what} was started for input that must be refused")
        return _raise

    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", lambda: started.append("forkserver"))
    monkeypatch.setattr(torch.multiprocessing, "start_processes", refuse("a rank"))
    monkeypatch.setattr(launch, "launch", refuse("the ranks"))
    monkeypatch.setattr(single, "run_single", refuse("the single-process run"))
    return started


@pytest.mark.parametrize("args", [
    ["--nproc", "0"], ["--nproc", "-1"], ["--nproc", "100000"],
    ["--timeout", "0"], ["--timeout", "-5"], ["--timeout", "nan"], ["--timeout", "inf"], ["--timeout", "1e300"],
])
def test_ddp_check_refuses_bad_options_before_any_process(run, no_process, args):
    t0 = time.monotonic()
    code, out, err = run("ddp-check", DDP, *args)
    assert code == 2, out + err
    assert f"({args[0]})" in _error_line(err) and "Traceback" not in err
    assert no_process == []  # not even the fork server
    assert time.monotonic() - t0 < 30  # a hang guard, not a benchmark: nothing waits on a rank


@pytest.mark.parametrize("line", [
    "nproc: 0", "nproc: -1", "nproc: 100000", "nproc: 2.5", "nproc: true",
    "timeout: 0", "timeout: -5", "timeout: .nan", "timeout: .inf", "timeout: 1e300", "timeout: '60'",
])
def test_ddp_check_refuses_a_bad_ddp_section_before_any_rank(run, no_process, tmp_path, line):
    spec = tmp_path / "ddp.yaml"
    spec.write_text("block:\n  - Linear: {in_features: 4, out_features: 2}\ninput: {shape: [4, 4]}\n"
                    f"ddp:\n  {line}\n")
    t0 = time.monotonic()
    code, out, err = run("ddp-check", str(spec))
    assert code == 2, out + err
    assert _error_line(err).endswith(f"({spec}:5:3)") and "expected:" in err and "Traceback" not in err
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("given", [{"nproc": 0}, {"nproc": 10**5}, {"timeout": float("nan")}, {"timeout": -1.0}])
def test_ddp_check_in_python_refuses_before_any_process(no_process, given):
    import layerlab
    from layerlab.errors import UsageError

    with pytest.raises(UsageError, match=next(iter(given))):
        layerlab.ddp_check(torch.nn.Linear(4, 2), torch.randn(4, 4), **given)
    assert no_process == []


# --- 4. the --json manifest of gradcheck --all and export-check --all -------------------------------

def test_gradcheck_all_manifest_records_seed_and_layers(run):
    from layerlab import registry

    code, out, err = run("gradcheck", "--all", "--only", "forward_parity", "--seed", "3", "--json")
    assert code == 0, err
    data = json.loads(out)
    m = data["manifest"]
    assert {r["settings"]["seed"] for r in data["reports"]} == {3} and m["seed"] == 3
    assert m["layers"] == [r["target"] for r in data["reports"]] == registry.names()
    assert (m["target"], m["spec"], m["dtype"]) == ("--all", None, None)  # no spec file, no one dtype


def test_export_check_all_manifest_records_the_default_seed_and_device(run):
    code, out, err = run("export-check", "--all", "--paths", "trace", "--device", "cpu", "--json")
    assert code in (0, 1), err
    data = json.loads(out)
    m = data["manifest"]
    assert {r["settings"]["seed"] for r in data["reports"]} == {0} and m["seed"] == 0
    assert m["layers"] == [r["target"] for r in data["reports"]] and len(m["layers"]) > 20
    assert (m["target"], m["spec"], m["device"]) == ("--all", None, "cpu")


def test_a_single_target_manifest_has_no_layers(run):
    code, out, err = run("gradcheck", "linear", "--only", "forward_parity", "--json")
    assert code == 0, err
    m = json.loads(out)["manifest"]
    assert "layers" not in m and m["target"] == "linear" and m["seed"] == 0
