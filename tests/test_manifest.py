"""The run manifest: what every --json report records about how it was made (layerlab.run_manifest)."""

import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import layerlab  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "configs" / "transformer_preln.yaml"


def test_manifest_of_a_module_reads_the_real_environment():
    m = layerlab.manifest(SPEC, module=torch.nn.Linear(4, 2).double(), seed=7, command=["x"])
    assert m["torch"] == torch.__version__
    assert m["threads"] == torch.get_num_threads()
    assert m["python"] == platform.python_version()
    assert m["layerlab"] == layerlab.__version__
    assert (m["dtype"], m["device"], m["seed"], m["gpu"]) == ("float64", "cpu", 7, None)
    assert m["spec"] == {"path": str(SPEC), "sha256": hashlib.sha256(SPEC.read_bytes()).hexdigest()}
    assert m["deterministic"]["algorithms"] is torch.are_deterministic_algorithms_enabled()
    assert m["command"] == ["x"]


def test_manifest_follows_torch_determinism_and_thread_settings():
    previous = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True, warn_only=True)
        m = layerlab.manifest(module=torch.nn.Linear(4, 2))
        assert m["threads"] == 1
        assert m["deterministic"] == {"algorithms": True, "warn_only": True, "cudnn_deterministic":
                                      torch.backends.cudnn.deterministic, "cudnn_benchmark": torch.backends.cudnn.benchmark}
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1])


def test_manifest_of_a_parameterless_module_takes_the_inputs_dtype():
    m = layerlab.manifest(module=torch.nn.ReLU(), inputs=[torch.zeros(2, dtype=torch.bfloat16)])
    assert (m["dtype"], m["device"]) == ("bfloat16", "cpu")


def test_public_names_stay_functions_after_their_modules_are_imported():
    """``layerlab.manifest`` / ``layerlab.diff`` are functions even once the modules behind them
    were imported (a submodule called ``manifest`` or ``diff`` would shadow them)."""
    import layerlab.report_diff  # noqa: F401
    import layerlab.run_manifest  # noqa: F401

    assert callable(layerlab.manifest) and callable(layerlab.diff)


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_explain_shape_manifest_has_torch_version_without_importing_torch():
    from importlib.metadata import version

    code = (
        "import contextlib, io, json, sys\n"
        "from layerlab.cli.app import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    main(['explain-shape', '--input', '32', '--kernel', '3', '--json'])\n"
        "m = json.loads(buf.getvalue())['manifest']\n"
        "print(json.dumps({'m': m, 'torch_loaded': 'torch' in sys.modules}))\n"
    )
    got = _run(code)
    assert got["torch_loaded"] is False
    assert got["m"]["torch"] == version("torch") == torch.__version__
    assert got["m"]["threads"] is None and got["m"]["dtype"] is None  # nobody can know them: no model ran
    assert got["m"]["command"] == ["layerlab", "explain-shape", "--input", "32", "--kernel", "3", "--json"]


def test_diff_never_imports_torch(tmp_path):
    code = (
        "import contextlib, io, json, sys\n"
        "from layerlab.cli.app import main\n"
        f"a, b = {str(tmp_path / 'a.json')!r}, {str(tmp_path / 'b.json')!r}\n"
        "for path, k in ((a, '3'), (b, '5')):\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        main(['explain-shape', '--input', '32', '--kernel', k, '--json'])\n"
        "    open(path, 'w').write(buf.getvalue())\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['diff', '--help'])\n"
        "    code = main(['diff', a, b])\n"
        "print(json.dumps({'code': code, 'torch_loaded': 'torch' in sys.modules}))\n"
    )
    got = _run(code)
    assert got == {"code": 1, "torch_loaded": False}
