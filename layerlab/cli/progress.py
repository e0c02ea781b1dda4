"""Signs of life on stderr for long runs: the CLI side of the library's ``progress(what, i, n)`` callbacks.

Library functions (``export_check``, ``profile``, ``verify``) call ``progress(what, i, n)`` before
each step; they never draw. :func:`steps` turns that into a transient Rich bar (label, bar, i/n,
what, elapsed time) on the stderr console, and into nothing at all when stderr is not a terminal
(a pipe, a file, CI logs) or under ``--json``: stdout stays clean data, stderr clean messages.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

Progress = Callable[[str, int, int], None]


def _quiet(what: str, i: int, n: int) -> None:
    return None


@contextlib.contextmanager
def steps(console, label: str, *, json_mode: bool = False) -> Iterator[Progress]:
    """Yields the ``progress(what, i, n)`` callback; ``n`` may change between calls (it sets the
    bar's length), ``n = 0`` shows a bar without a total."""
    if json_mode or not console.is_terminal:
        yield _quiet
        return
    from layerlab.text_safety import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

    bar = Bar(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
              TimeElapsedColumn(), console=console, transient=True)
    task = bar.add_task("", total=None)

    def advance(what: str, i: int, n: int) -> None:
        bar.update(task, completed=i, total=n or None, description=escape(what))  # a layer's name: shown as typed

    with bar:
        yield advance
