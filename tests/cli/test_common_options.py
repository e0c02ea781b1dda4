"""One option set for every command that runs a target: --input-shape, --mode, --dtype (and one
--compile-backend default), each reaching the build the same way; one spec format for all."""

import inspect as pyinspect
import json

import pytest

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from tests.test_target import GRADCHECK_SPEC  # one spec with every command's keys

COMMANDS = ["inspect", "gradcheck", "export-check", "profile"]



@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_offers_the_shared_options(run, command):
    code, out, err = run(command, "--help")
    assert code == 0, out + err
    for option in ("--input-shape", "--mode", "--dtype", "--seed", "--allow-import", "--json"):
        assert option in out, option


def test_one_compile_backend_default_for_every_command_and_function():
    from layerlab.checks.run import VerifyOptions, verify
    from layerlab.cli import export_cmd, gradcheck_cmd, profile_cmd
    from layerlab.deploy.run import export_check
    from layerlab.profiling.run import profile

    for fn in (gradcheck_cmd.command, export_cmd.command, profile_cmd.command, export_check, profile, verify):
        assert pyinspect.signature(fn).parameters["compile_backend"].default == DEFAULT_COMPILE_BACKEND, fn
    assert VerifyOptions().compile_backend == DEFAULT_COMPILE_BACKEND


@pytest.mark.parametrize("command", ["gradcheck", "export-check", "profile"])
def test_unknown_compile_backend_is_a_usage_error_everywhere(run, command):
    code, out, err = run(command, "linear", "--compile-backend", "inductr", "--json")
    assert code == 2, out + err
    assert "inductor" in json.loads(err.strip().splitlines()[-1])["hint"]


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_mode_and_dtype_are_usage_errors_naming_the_option(run, command):
    code, out, err = run(command, "linear", "--mode", "sideways")
    assert code == 2 and "--mode" in err, out + err
    code, out, err = run(command, "linear", "--dtype", "int32")
    assert code == 2 and "--dtype" in err and "floating" in err, out + err


def test_dtype_mode_and_input_shape_reach_profile_and_export_check(run):
    code, out, err = run("profile", "linear", "--dtype", "float64", "--mode", "eval", "--input-shape", "3,64",
                         "--repeats", "1", "--warmup", "0", "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["inputs"] == {"input": "float64[3, 64]"} and report["mode"] == "eval"
    code, out, err = run("export-check", "linear", "--dtype", "float64", "--input-shape", "6,64",
                         "--paths", "trace", "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["settings"]["inputs"] == {"input": "float64[6, 64]"}
    assert report["settings"]["rtol"] == 1e-7  # float64 tolerances: the dtype really changed


def test_dtype_and_input_shape_reach_gradcheck(run):
    code, out, err = run("gradcheck", "linear", "--dtype", "float64", "--input-shape", "3,64",
                         "--only", "forward_parity", "--json")
    assert code == 0, out + err
    assert json.loads(out)["settings"]["inputs"] == {"input": "float64[3, 64]"}


@pytest.mark.parametrize("command", ["gradcheck", "export-check"])
def test_build_options_with_all_are_refused(run, command):
    code, out, err = run(command, "--all", "--input-shape", "2,3")
    assert code == 2 and "--input-shape" in err, out + err


@pytest.mark.parametrize("command, extra", [("inspect", []), ("gradcheck", ["--only", "forward_parity"]),
                                            ("export-check", ["--paths", "trace"]),
                                            ("profile", ["--repeats", "1", "--warmup", "0"])])
def test_one_spec_format_serves_every_command(run, tmp_path, command, extra):
    spec = tmp_path / "lin.yaml"
    spec.write_text(GRADCHECK_SPEC)
    code, out, err = run(command, str(spec), *extra, "--json")
    assert code == 0, out + err
    assert "did you mean" not in err


def test_progress_is_silent_off_a_terminal_and_under_json(run):
    code, out, err = run("export-check", "linear", "--paths", "trace,export")
    assert code == 0, out + err
    assert err == ""  # stderr is not a terminal here: no bar, not even its newline
    code, out, err = run("profile", "linear", "--repeats", "1", "--warmup", "0", "--json")
    assert code == 0 and err == "", out + err


def test_library_functions_report_progress_through_a_callback():
    import torch

    from layerlab.deploy.run import check_target
    from layerlab.profiling.run import profile_args
    from layerlab.target import from_module

    calls = []
    target = from_module(torch.nn.Linear(4, 2), torch.randn(3, 4))
    report = check_target(target, paths=["trace", "export"], progress=lambda *a: calls.append(a))
    assert [p.path for p in report.paths] == ["trace", "export"]
    assert calls == [("eager run and input variants", 0, 3), ("trace", 1, 3), ("export", 2, 3)]
    calls.clear()
    profile_args(target.module, target.args, repeats=1, warmup=0, reference=torch.nn.Linear(4, 2),
                 progress=lambda *a: calls.append(a))
    assert [(i, n) for _, i, n in calls] == [(0, 2), (1, 2)] and "reference" in calls[-1][0]
