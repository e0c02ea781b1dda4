"""ddp-check under torchrun's variables set by hand, with MASTER_PORT held by another program.

Rank 0 hosts the rendezvous store on MASTER_PORT when no torchrun agent does; a taken port used to
end the run in a ``DistNetworkError`` traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

import layerlab
from layerlab.distributed import rendezvous
from layerlab.errors import UsageError
from tests.distributed import planted as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def taken_port():
    """A port another program listens on, for the test's duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def as_rank(monkeypatch, port: int, world: int) -> None:
    for key, value in {"RANK": "0", "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)


def test_one_process_moves_to_a_free_port_and_says_so(monkeypatch, taken_port, capfd):
    as_rank(monkeypatch, taken_port, 1)
    r = layerlab.ddp_check(P.mlp(), torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), timeout=30)
    assert r.launcher == "torchrun" and r.world_size == 1 and r.ranks[1].status == "ok"
    assert f"MASTER_PORT {taken_port} is in use" in capfd.readouterr().err


def test_several_processes_cannot_move_and_get_one_clear_error(monkeypatch, taken_port):
    as_rank(monkeypatch, taken_port, 2)
    monkeypatch.setattr(rendezvous, "RETRY_S", 0.3)
    with pytest.raises(UsageError) as err:
        layerlab.ddp_check(P.mlp(), torch.randn(8, 16), timeout=30)
    assert f"MASTER_PORT {taken_port} is in use" in err.value.message and err.value.where == "MASTER_PORT"
    assert "free port" in err.value.hint


@pytest.mark.slow
def test_the_cli_exits_2_with_one_line(taken_port):
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(taken_port)}
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    done = subprocess.run([sys.executable, "-m", "layerlab", "ddp-check", "configs/ddp_mlp.yaml", "--timeout", "5"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and f"MASTER_PORT {taken_port} is in use" in done.stderr
