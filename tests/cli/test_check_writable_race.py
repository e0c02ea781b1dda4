"""Two runs writing the same plot at once: the second sees the first's probe file appear or vanish
between its two looks. Seen in the hostile-input suite as "--plot: cannot write 'f.svg': File
exists" when a case ran with and without --json in one folder at the same time."""

from __future__ import annotations

import os

import pytest

from layerlab.cli import output
from layerlab.errors import UsageError


def test_a_file_created_between_the_two_looks_is_checked_as_an_existing_file(tmp_path, monkeypatch):
    target = tmp_path / "f.svg"
    real_open = os.open
    calls = []

    def racing_open(path, flags, *args):
        calls.append(flags)
        if flags & os.O_EXCL and len(calls) == 1:  # another run's probe lands first
            os.close(real_open(path, os.O_WRONLY | os.O_CREAT, 0o644))
            raise FileExistsError(17, "File exists")
        return real_open(path, flags, *args)

    monkeypatch.setattr(output.os, "open", racing_open)
    output.check_writable(target, "--plot")  # no UsageError
    assert target.exists() and target.stat().st_size == 0  # the other run's file, untouched


def test_a_file_removed_between_the_two_looks_is_checked_as_a_new_one(tmp_path, monkeypatch):
    target = tmp_path / "f.svg"
    target.write_text("")
    real_open = os.open

    def racing_open(path, flags, *args):
        if flags & os.O_APPEND and target.exists():  # the other run removes its probe first
            target.unlink()
            raise FileNotFoundError(2, "No such file or directory")
        return real_open(path, flags, *args)

    monkeypatch.setattr(output.os, "open", racing_open)
    output.check_writable(target, "--plot")
    assert not target.exists()  # the probe was removed again


def test_an_unwritable_path_is_still_refused(tmp_path):
    with pytest.raises(UsageError):
        output.check_writable(tmp_path / "missing" / "f.svg", "--plot")
