"""layerlab.output_files: every file the user names is written all at once, never over an input, never
through a symbolic link unless forced."""

import os

import pytest

from layerlab.errors import UsageError
from layerlab.output_files import check_outputs, source_files, write_output


def test_writes_text_bytes_and_a_writer(tmp_path):
    write_output(tmp_path / "a.txt", "héllo", flag="--x")
    write_output(tmp_path / "b.bin", b"\x00\x01", flag="--x")
    write_output(tmp_path / "c.txt", lambda f: f.write(b"drawn"), flag="--x")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "c.txt").read_bytes() == b"drawn"
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.bin", "c.txt"]  # no temporary file left


def test_a_writer_that_fails_half_way_leaves_the_old_file_and_no_stray_file(tmp_path):
    path = tmp_path / "report.svg"
    path.write_text("old")

    def half(f):
        f.write(b"<svg>half")
        raise KeyboardInterrupt  # Ctrl-C, a timeout, a full disk: any way out

    with pytest.raises(KeyboardInterrupt):
        write_output(path, half, flag="--svg")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["report.svg"]


def test_an_existing_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "out.html"
    path.write_text("old")
    os.chmod(path, 0o640)
    write_output(path, "new", flag="--html")
    assert path.read_text() == "new" and (os.stat(path).st_mode & 0o777) == 0o640


def test_a_symbolic_link_is_refused_unless_forced(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "out.svg"
    link.symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link") as info:
        write_output(link, "x", flag="--svg")
    assert info.value.where == "--svg" and "--force" in info.value.hint
    assert victim.read_text() == "keep"
    write_output(link, "written", flag="--svg", force=True)
    assert link.is_symlink() and victim.read_text() == "written"  # the link stays, its target is written


def test_an_input_or_a_second_output_with_the_same_path_is_refused(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("layer: linear\n")
    with pytest.raises(UsageError, match="one of this run's inputs"):
        check_outputs([("--svg", tmp_path / "." / "spec.yaml")], [spec])
    hard = tmp_path / "hard.yaml"
    os.link(spec, hard)
    with pytest.raises(UsageError, match="one of this run's inputs"):  # the same file under another name
        check_outputs([("--html", hard)], [spec])
    with pytest.raises(UsageError, match="--svg and --plot name the same file") as info:
        check_outputs([("--svg", tmp_path / "a.svg"), ("--plot", str(tmp_path / "a.svg"))])
    assert info.value.where == "--plot"
    check_outputs([("--svg", tmp_path / "a.svg"), ("--plot", tmp_path / "b.svg"), ("--html", None)], [spec])


def test_a_missing_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot write") as info:
        write_output(tmp_path / "nope" / "a.svg", "x", flag="--plot")
    assert info.value.where == "--plot"


def test_source_files_are_the_users_own():
    import torch

    class Mine(torch.nn.Module):
        pass

    assert source_files([Mine(), torch.nn.Linear(1, 1)]) == [__file__]
