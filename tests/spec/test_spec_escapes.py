"""Spec files that try to run code without ``--allow-import`` (``tests/corpora/spec_escapes/``).

Each case's payload tries to create a marker file; every case must end in exit 2 (a
:class:`SpecError`) naming what was refused, with the marker absent — through the CLI
(``layerlab inspect SPEC``, in process) and through the Python API (``load_spec`` + ``build``).
A few run as a real ``python -m layerlab`` process too, whose working directory is on ``sys.path``.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from layerlab.errors import SpecError
from layerlab.spec import build, load_spec

CORPUS = Path(__file__).resolve().parents[1] / "corpora" / "spec_escapes"
ROOT = Path(__file__).resolve().parents[2]
CASES = [case for path in sorted(CORPUS.glob("*.yaml")) for case in yaml.safe_load(path.read_text())]


class _Payload:
    """Unpickling this creates the marker file (what a malicious pickle would do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _materialise(case: dict, where: Path) -> tuple:
    """Write the case's spec, helper files and pickles under ``where``; return (spec path, marker)."""
    marker = where / "MARKER"

    def fill(text: str) -> str:
        return text.replace("{marker}", str(marker)).replace("{dir}", str(where))

    for name, text in (case.get("files") or {}).items():
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fill(text))
    for kind, name in (case.get("make") or {}).items():
        payload = _Payload(str(marker))
        if kind == "torch_pickle":
            torch.save(payload, where / name)
        elif kind == "npy_pickle":
            np.save(where / name, np.array([payload], dtype=object), allow_pickle=True)
        elif kind == "plain_pickle":
            (where / name).write_bytes(pickle.dumps(payload))
        else:
            raise AssertionError(f"unknown make: {kind}")
    spec = where / "spec.yaml"
    spec.write_text(fill(case["spec"]))
    return spec, marker


def _needs(case: dict) -> None:
    if case["id"].startswith("hf_"):
        pytest.importorskip("transformers", reason="Hugging Face cases need the [hf] extra")


def test_the_corpus_is_large_and_named_uniquely():
    ids = [case["id"] for case in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    assert all(case.get("expect") and case.get("why") for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_python_api_refuses(case, tmp_path, monkeypatch):
    _needs(case)
    spec, marker = _materialise(case, tmp_path)
    if case.get("on_path"):
        monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as err:
        build(load_spec(str(spec)))
    text = f"{err.value.message}\n{err.value.hint}"
    assert err.value.exit_code == 2
    assert not marker.exists(), f"{case['id']}: the payload ran"
    for expected in case["expect"]:
        assert expected in text, f"{case['id']}: {expected!r} not in {text!r}"
    assert re.fullmatch(re.escape(str(spec)) + r":\d+:\d+", err.value.where or ""), err.value.where


@pytest.fixture
def cli(capsys, monkeypatch):
    from layerlab.cli.app import main

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)

    def run(*args):
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_cli_refuses(case, tmp_path, monkeypatch, cli):
    _needs(case)
    spec, marker = _materialise(case, tmp_path)
    if case.get("on_path"):
        monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("inspect", str(spec))
    flat = " ".join(err.split())  # the message may wrap
    assert code == 2, (code, out, err)
    assert not marker.exists(), f"{case['id']}: the payload ran"
    assert "Traceback" not in err and re.search(re.escape(str(spec)) + r":\d+:\d+", flat), err
    for expected in case["expect"]:
        assert " ".join(expected.split()) in flat, f"{case['id']}: {expected!r} not in {err!r}"


#: the escapes the issue reported, and the local-package shadows that only a real process shows
#: (``python -m`` puts the working directory first on ``sys.path``)
PROCESS_CASES = ["factory_torch_os_system", "class_arg_torch_os_system", "torch_hub_load_local",
                 "torch_load_pickle", "layerlab_load_spec_allow_import", "local_timm_package",
                 "local_torchvision_package", "importlib_import_module"]


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c["id"] in PROCESS_CASES], ids=PROCESS_CASES)
def test_a_real_process_refuses(case, tmp_path):
    spec, marker = _materialise(case, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("LAYERLAB_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "layerlab", "inspect", "spec.yaml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert not marker.exists(), f"{case['id']}: the payload ran"
    assert "Traceback" not in proc.stderr and "--allow-import" in proc.stderr
