"""matplotlib is optional: never imported by `import layerlab`, and missing → a clear usage error."""

import subprocess
import sys

import pytest
import torch
from torch import nn

import layerlab
from layerlab.errors import UsageError


def test_import_layerlab_and_help_do_not_import_matplotlib():
    code = ("import sys, layerlab, layerlab.plot, layerlab.cli.app as app\n"
            "try:\n    app.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_missing_matplotlib_names_the_extra(monkeypatch):
    report = layerlab.inspect(nn.Linear(3, 2), torch.randn(4, 3))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    from layerlab.plot import gradient_flow

    with pytest.raises(UsageError, match="draws with matplotlib, which is not installed") as info:
        gradient_flow(report)
    assert "pip install 'layerlab[plot]'" in info.value.hint
    assert info.value.exit_code == 2
