"""The CLI skeleton: help, version, error boundary, no torch at start-up."""

import json
import subprocess
import sys

import pytest

from layerlab import __version__
from layerlab.errors import UsageError


def test_root_help(run):
    code, out, err = run("--help")
    assert code == 0, err
    assert "explain-shape" in out


def test_version(run):
    code, out, err = run("--version")
    assert code == 0, err
    assert out.strip() == f"layerlab {__version__}"


def test_unknown_command_is_usage_error(run):
    code, out, err = run("no-such-command")
    assert code == 2, out + err
    assert "No such command" in err


def _modules_after(code: str) -> set:
    """Run ``code`` in a fresh interpreter and return the names in sys.modules afterwards."""
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["explain-shape", "--help"],
        ["explain-shape", "--kernel", "3", "--stride", "2"],
        ["explain-shape", "--input", "32", "--kernel", "3", "--stride", "2", "--json"],
        ["explain-shape", "--input", "224", "--chain", "conv k=7 s=2 p=3 | maxpool k=3 s=2 p=1"],
        ["explain-shape", "--input", "32", "--kernel", "3", "--target", "16"],
    ],
)
def test_cli_never_imports_torch(argv):
    code = (
        "import contextlib, io\n"
        "from layerlab.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main({argv!r})\n"
    )
    assert "torch" not in _modules_after(code)


def test_known_error_json_goes_to_stderr(run):
    code, out, err = run("explain-shape", "--padding", "foo", "--json")
    assert code == 2, out + err
    assert out == ""
    payload = json.loads(err)
    assert payload["error"] == "UsageError"
    assert payload["where"] == "--padding"


def test_debug_shows_traceback_for_known_errors(run, monkeypatch):
    monkeypatch.setenv("LAYERLAB_DEBUG", "1")
    code, out, err = run("explain-shape", "--padding", "foo")
    assert code == 2
    assert "Traceback" in err and "UsageError" in err


def test_unknown_errors_keep_their_traceback(monkeypatch):
    """A bug is not a LayerlabError: the boundary re-raises it."""
    import layerlab.shapes as shapes
    from layerlab.cli.app import main

    def broken(*a, **k):
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(shapes, "explain", broken)
    with pytest.raises(ZeroDivisionError):
        main(["explain-shape", "--input", "32", "--kernel", "3"])


def test_usage_error_fields():
    e = UsageError("bad", where="--x", expected=1, got=2, hint="fix")
    d = e.to_dict()
    assert (d["message"], d["where"], d["expected"], d["got"], d["hint"], d["exit_code"]) == ("bad", "--x", 1, 2, "fix", 2)


def test_python_m_layerlab():
    done = subprocess.run([sys.executable, "-m", "layerlab", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("layerlab ")
