"""Untrusted text through every command: no raw control sequence, no interpreted Rich markup, no
forged line, no traceback, and under ``--json`` one JSON document on stdout — on a pipe and on a
terminal (a pty). The payloads are data: ``tests/corpora/injection_payloads/payloads.json``; the
places and commands: :mod:`tests.hostile.injection_matrix`."""

from __future__ import annotations

import pytest

from tests.hostile import injection_matrix as matrix

#: (command, place) cells whose output must show the place's payload, made visible — so that "no
#: leak" cannot pass because the text never reached the output
SHOWN = {
    "inspect": ("MOD", "WARN", "EXC", "SPEC"),
    "gradcheck": ("WARN", "EXC", "FILE"),
    "export-check": ("WARN", "EXC", "FILE"),
    "profile": ("MOD", "WARN", "EXC", "FILE"),
    "train-check": ("MOD", "WARN", "EXC", "FILE"),
    "precision-check": ("MOD", "WARN", "EXC", "FILE"),
    "ddp-check": ("WARN", "EXC", "FILE"),
    "verify (Python)": ("EXC",),
    "diff": ("FILE", "JSONF"),
    "explain-shape": ("ARG",),
}


def _check(results, commands):
    assert results and all(r["rc"] is not None for r in results)
    leaked = {cell: what for cell, what in matrix.cells(results).items() if what}
    assert not leaked, "\n".join(f"{cell}: {what[:3]}" for cell, what in sorted(leaked.items()))
    shown = {(r["id"].split("|")[0], tag) for r in results for tag in matrix.TAGS if matrix.visible(r, tag)}
    missing = [(c, tag) for c in commands for tag in SHOWN[c] if (c, tag) not in shown]
    assert not missing, f"the payload never reached the output here (the test would prove nothing): {missing}"


def test_inspect_on_a_pipe_and_a_terminal_shows_hostile_text_literally():
    """The quick version: inspect, both models, human on a pty and --json on a pipe."""
    results = matrix.run_matrix(str(matrix.REPO), ["inspect"], extra=False,
                                keep=lambda job: job.endswith(("|pty|human", "|pipe|json")))
    _check(results, ["inspect"])


@pytest.mark.slow
def test_every_command_on_a_pipe_and_a_terminal_shows_hostile_text_literally():
    commands = list(matrix.COMMANDS)
    _check(matrix.run_matrix(str(matrix.REPO), commands), commands + ["diff", "explain-shape"])
