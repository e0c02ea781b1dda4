"""``layerlab ddp-check`` end to end: exit codes, JSON, --ranks-json, a failing spec, bad options."""

from __future__ import annotations

import json


def test_ddp_check_help(run):
    code, out, err = run("ddp-check", "--help")
    assert code == 0, err
    assert "--nproc" in out and "torchrun" in out


def test_healthy_spec_passes_with_json(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "ddp-check-report" and data["ok"] is True and data["world_size"] == 2
    assert data["backend"] == "gloo" and data["batch"] == 8 and data["findings"] == []
    assert [r["inputs"][0]["shape"] for r in data["ranks"]] == [[8, 16], [4, 16], [4, 16]]


def test_ranks_json_has_each_ranks_raw_results(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--ranks-json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "ddp-check-ranks" and [r["rank"] for r in data["ranks"]] == [0, 1]
    norms = [r["ddp"]["grad_norms"]["0.weight"] for r in data["ranks"]]
    assert norms[0] == norms[1] > 0  # one gradient after the all-reduce


def test_batchnorm_spec_is_warned_and_rendered(run):
    code, out, err = run("ddp-check", "configs/cnn_block.yaml")
    assert code == 0, out + err  # per-rank BatchNorm: warnings, not a failure
    assert "BatchNorm without SyncBatchNorm" in out and "running stats differ" in out
    assert "rank 1" in out and "ok: 0 error(s), 2 warning(s)" in out


def test_uneven_batch_is_a_usage_error(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--nproc", "3", "--json")
    assert code == 2, out + err
    assert json.loads(err.strip().splitlines()[-1])["message"] == "a batch of 8 (dim 0 of input) does not split into 3 equal shards"


def test_bad_timeout_is_a_usage_error(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--timeout", "0")
    assert code == 2 and "timeout" in err


HANGS = '''import time
import torch.distributed as dist
from torch import nn


class Hangs(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 8)

    def forward(self, x):
        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(600)
        return self.body(x)


def make():
    return Hangs()
'''


def _session(sid):
    """Pids of the processes in session ``sid`` (the CLI, its fork server, the ranks)."""
    import os

    found = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                found.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return found


def test_ctrl_c_during_a_hang_exits_130_and_leaves_no_process(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    if not os.path.isdir("/proc"):
        import pytest

        pytest.skip("reads /proc to find the ranks")
    (tmp_path / "hang.py").write_text(HANGS)
    (tmp_path / "hang.yaml").write_text("build: ./hang.py:make\ninput: {shape: [8, 16]}\nmode: train\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "layerlab", "ddp-check", str(tmp_path / "hang.yaml"),
                             "--allow-import", "--timeout", "60"], cwd=root, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while len(_session(proc.pid)) < 4 and time.monotonic() < end:  # the CLI, the fork server, 2 ranks
            time.sleep(0.2)
        time.sleep(2.0)  # rank 1 reaches its sleep, rank 0 waits for it in a collective
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err
    end = time.monotonic() + 10
    while _session(proc.pid) and time.monotonic() < end:
        time.sleep(0.2)
    assert _session(proc.pid) == []
