"""The hostile spec corpus: every entry is Python data; :func:`materialize` writes it to disk.

Nothing here is committed as a spec file: a test fixture (or ``measure.py``) writes each entry
into its own fresh folder, so helper modules, FIFOs and odd file names never touch the checkout.

An :class:`Entry` says what to write (``text``, or a ``kind`` such as a FIFO or ``/dev/zero``),
which extra command-line options go with it, and which exit codes are acceptable: 2 for input
layerlab can refuse (the default), 1 when the user's own layer raises, 0 when the spec is valid
however odd it looks. ``cause`` names the issue-11 item the entry probes, for the report.

The entries themselves live in :mod:`tests.hostile.corpus_yaml` (file and YAML level) and
:mod:`tests.hostile.corpus_values` (values, resources, imports, devices, echo).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Optional, Tuple, Union

COMMANDS = ("inspect", "gradcheck", "profile", "export-check")

#: A spec every command accepts and runs in well under a second; valid entries start from it.
TINY = (
    "layer: Conv2d\n"
    "args: {in_channels: 1, out_channels: 2, kernel_size: 3}\n"
    "input: {shape: [1, 1, 5, 5]}\n"
)
TINY_ARGS = "{in_channels: 1, out_channels: 2, kernel_size: 3}"


@dataclass(frozen=True)
class Entry:
    """One hostile input.

    Args:
        name: identifier (test id, report key).
        cause: the issue-11 item it probes (``alias-bomb``, ``seed-overflow``, …).
        text: the spec file's content (``str`` is written as UTF-8, ``bytes`` as they are).
        kind: ``file`` (default), ``fifo`` (a named pipe nobody writes), ``dev_zero``, ``dir``.
        expect: acceptable exit codes for every command, unless ``per_command`` says otherwise.
        args: extra command-line options.
        commands: the commands this entry is run through (options one command lacks).
        files: helper files next to the spec (Python modules for import paths).
        filename: the spec's file name.
        forbid: a file whose existence after the run proves code ran that must not have.
        per_command: acceptable exit codes for one command, where they differ.
        expect_json: acceptable exit codes under ``--json`` (an option ``--json`` makes moot).
    """

    name: str
    cause: str
    text: Union[str, bytes, None] = None
    kind: str = "file"
    expect: FrozenSet[int] = frozenset({2})
    args: Tuple[str, ...] = ()
    commands: Tuple[str, ...] = COMMANDS
    files: Dict[str, str] = field(default_factory=dict)
    filename: str = "spec.yaml"
    forbid: Optional[str] = None
    per_command: Dict[str, FrozenSet[int]] = field(default_factory=dict)
    expect_json: Optional[FrozenSet[int]] = None

    def expected(self, command: str, json_mode: bool = False) -> FrozenSet[int]:
        if json_mode and self.expect_json is not None:
            return self.expect_json
        return self.per_command.get(command, self.expect)


def codes(*values: int) -> FrozenSet[int]:
    return frozenset(values)


def materialize(entry: Entry, folder: Path) -> str:
    """Write ``entry`` (and its helper files) into ``folder``; return the path to pass as SPEC."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in entry.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    if entry.kind == "dev_zero":
        return "/dev/zero"
    path = folder / entry.filename
    if entry.kind == "fifo":
        if not path.exists():
            os.mkfifo(path)
        return str(path)
    if entry.kind == "dir":
        path.mkdir(exist_ok=True)
        return str(path)
    data = entry.text.encode("utf-8") if isinstance(entry.text, str) else entry.text
    path.write_bytes(data or b"")
    return str(path)


def all_entries() -> Tuple[Entry, ...]:
    """Every entry, names unique."""
    from tests.hostile.corpus_values import ENTRIES as VALUES
    from tests.hostile.corpus_yaml import ENTRIES as YAML

    entries = tuple(YAML) + tuple(VALUES)
    names = [e.name for e in entries]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"duplicate corpus names: {duplicates}"
    return entries


#: Entries every command runs in CI (the resource guards and the per-command items of issue 11);
#: the others rotate through gradcheck, profile and export-check (see test_hostile_specs.py).
CORE = (
    "alias_bomb_1e9", "recursive_alias_list", "nested_brackets_2000", "nested_blocks_300", "nul_byte",
    "dev_zero", "fifo", "repeat_1e9", "seed_2_63", "cli_seed_2_63", "dim_1e26", "input_4pb",
    "device_mps", "device_xla", "device_meta", "forward_raises", "name_ansi_escape", "escape_in_file_name", "name_5mb",
    "tiny_valid",
)
