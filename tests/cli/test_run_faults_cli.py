"""The CLI's answer to a model that exits, raises KeyboardInterrupt or never returns, and to a real Ctrl-C
(layerlab.faults under the error boundary): exit 1 with where, 130 for Ctrl-C, --timeout on
every command."""

import os
import signal
import sys
import textwrap

import pytest

MODELS_PY = textwrap.dedent("""
    import sys
    from torch import nn

    class Exits(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            sys.exit(3)

    class Interrupts(Exits):
        def forward(self, x):
            raise KeyboardInterrupt

    class Spin(nn.Module):
        def forward(self, x):
            if x.is_meta:  # the spec's shape-only build forward passes; the command's own run loops
                return x
            while True:
                x = x + 0

    class Stuck(nn.Module):  # deaf to the alarm, as a native call that never returns is
        def forward(self, x):
            import signal, time
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
            time.sleep(120)
            return x

    class Loops(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 4), Spin())

        def forward(self, x):
            return self.body(x)
""")


def _spec(tmp_path, cls):
    (tmp_path / "models.py").write_text(MODELS_PY)
    spec = tmp_path / f"{cls}.yaml"
    spec.write_text(f"layer: ./models.py:{cls}\ninput: {{shape: [2, 4]}}\n")
    return str(spec)


def test_cli_sys_exit_is_exit_1_with_where(run, tmp_path):
    code, out, err = run("gradcheck", _spec(tmp_path, "Exits"), "--allow-import")
    assert code == 1, out + err
    assert "the model called sys.exit(3)" in err and "models.py:11" in err


def test_cli_model_keyboard_interrupt_is_exit_1(run, tmp_path):
    code, out, err = run("inspect", _spec(tmp_path, "Interrupts"), "--allow-import", "--json")
    assert code == 1, out + err
    assert "KeyboardInterrupt (no Ctrl-C was pressed)" in err


def test_cli_timeout_stops_inspect_in_its_forward(run, tmp_path):
    code, out, err = run("inspect", _spec(tmp_path, "Loops"), "--allow-import", "--timeout", "10")
    assert code == 1, out + err
    assert "stopped after 10 s in inspect forward (forward of body.1)" in err


@pytest.mark.slow
@pytest.mark.parametrize("command", ["inspect", "profile", "train-check", "precision-check", "gradcheck",
                                     "export-check"])
def test_cli_timeout_stops_every_command(run, tmp_path, command):
    code, out, err = run(command, _spec(tmp_path, "Loops"), "--allow-import", "--timeout", "15")
    assert code == 1, out + err
    assert "stopped after 15 s in " + command in err and "(forward of body.1)" in err
    assert "while preparing" not in err and "while building" not in err  # in the command's own run
    step = {"inspect": "inspect forward", "train-check": "train-check step 0", "profile": "profile first step"}
    assert step.get(command, command) in err


def test_cli_bad_timeout_is_a_usage_error(run):
    code, out, err = run("inspect", "conv2d", "--timeout", "-3")
    assert code == 2, out + err
    assert "--timeout" in err


@pytest.mark.slow
def test_cli_real_ctrl_c_exits_130(tmp_path):
    import subprocess
    import time

    spec = _spec(tmp_path, "Loops")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "layerlab", "inspect", spec, "--allow-import"], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(15)  # torch imported, the forward looping
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "interrupted" in err


@pytest.mark.slow
def test_cli_ends_a_run_stuck_where_python_cannot_interrupt_it(tmp_path):
    import subprocess
    import time

    spec = _spec(tmp_path, "Stuck")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "layerlab", "inspect", spec, "--allow-import", "--timeout", "30"],
                          cwd=root, capture_output=True, text=True, timeout=110)  # 30 s: torch imported by then
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "stopped after 30 s in inspect" in proc.stderr and "the process was ended" in proc.stderr
    assert time.monotonic() - start < 100  # not the model's 120 s sleep
