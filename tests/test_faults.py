"""What the model's code may do besides raising an Exception: exit, raise KeyboardInterrupt, never
return (layerlab.faults), through the Python API and the CLI."""

import os
import signal
import sys
import threading

import pytest
import torch
from torch import nn

import layerlab
from layerlab.errors import CheckFailed, UsageError
from layerlab.faults import TimedOut


class Exits(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        sys.exit(3)  # the line the message names


class RaisesKeyboardInterrupt(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        raise KeyboardInterrupt


class SignalsItself(nn.Module):
    """A real SIGINT arrives while the forward runs: what a user's Ctrl-C does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        os.kill(os.getpid(), signal.SIGINT)
        return self.lin(x)


class Spin(nn.Module):
    def forward(self, x):
        while True:
            x = x + 0


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4), Spin()])

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x


class Looping(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x):
        return self.encoder(x)


class LoopsAtStep(nn.Module):
    """Trains normally, then loops forever in the forward of step ``n``."""

    def __init__(self, n):
        super().__init__()
        self.lin, self.n, self.calls = nn.Linear(4, 2), n, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > self.n:
            while True:
                x = x + 0
        return self.lin(x)


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


@pytest.mark.parametrize("command", ["inspect", "profile", "train_check", "gradcheck"])
def test_sys_exit_in_a_forward_is_a_failure_naming_the_line(command):
    with pytest.raises(CheckFailed) as info:
        getattr(layerlab, command)(Exits(), torch.randn(2, 4))
    assert "the model called sys.exit(3)" in info.value.message
    assert info.value.where == f"{__file__}:{_line_of('sys.exit(3)  # the line')}"
    assert info.value.exit_code == 1


def test_keyboard_interrupt_raised_by_the_model_is_a_failure():
    with pytest.raises(CheckFailed, match="the model raised KeyboardInterrupt"):
        layerlab.inspect(RaisesKeyboardInterrupt(), torch.randn(2, 4))


def test_a_real_sigint_stays_an_interruption():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    with pytest.raises(KeyboardInterrupt):
        layerlab.inspect(SignalsItself(), torch.randn(2, 4))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # our handler is gone again


def test_an_infinite_loop_ends_naming_the_step_and_the_module():
    with pytest.raises(TimedOut) as info:
        layerlab.inspect(Looping(), torch.randn(2, 4), timeout=1)
    assert info.value.message == "stopped after 1 s in inspect forward (forward of encoder.layer.2)"
    assert info.value.exit_code == 1


def test_train_check_names_the_optimizer_step():
    with pytest.raises(TimedOut, match=r"stopped after 1 s in train-check step 3 \(forward of \(root\)\)"):
        layerlab.train_check(LoopsAtStep(3), torch.randn(3, 4), steps=10, timeout=1)  # steps 0, 1, 2 run


def test_timeout_is_checked():
    for bad in (0, -1, float("nan"), "10", True, 1e9):
        with pytest.raises(UsageError):
            layerlab.inspect(nn.Linear(2, 2), torch.randn(1, 2), timeout=bad)


def test_a_timeout_that_does_not_expire_changes_nothing():
    report = layerlab.inspect(nn.Linear(2, 2), torch.randn(1, 2), timeout=600)
    assert report.ok
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
