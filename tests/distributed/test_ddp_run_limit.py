"""ddp-check's --timeout is the collectives'; the whole command still has a wall clock derived from
it, so a forward that never returns cannot hang it (neither in the spec's shape-only memory check,
nor in the single-process step of the driver)."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import layerlab
from layerlab.distributed.launch import deadline_for
from layerlab.distributed.run import whole_run_limit
from layerlab.faults import TimedOut


class Looping(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        while True:
            x = x + 0


def test_the_whole_run_limit_follows_the_collective_timeout():
    assert whole_run_limit({"timeout": 5}) == 2 * deadline_for(5)
    assert whole_run_limit({}) == 2 * deadline_for(60.0)  # the default collective timeout


@pytest.mark.slow
def test_a_forward_that_never_returns_stops_the_python_api():
    with pytest.raises(TimedOut, match="stopped after .* in ddp-check"):
        layerlab.ddp_check(Looping(), torch.randn(4, 4), nproc=2, timeout=0.5)


@pytest.mark.slow
def test_a_forward_that_never_returns_stops_the_cli(tmp_path):
    (tmp_path / "loopmod.py").write_text(textwrap.dedent("""
        import torch.nn as nn

        class Looping(nn.Module):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(4, 4)

            def forward(self, x):
                while True:
                    x = x + 0
    """))
    (tmp_path / "loop.yaml").write_text("layer: ./loopmod.py:Looping\ninput: [4, 4]\n")
    done = subprocess.run([sys.executable, "-m", "layerlab", "ddp-check", "loop.yaml", "--allow-import",
                           "--nproc", "2", "--timeout", "0.5"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stopped after" in done.stderr and "loopmod.py:" in done.stderr
    assert "Traceback" not in done.stderr
