"""Pieces the renderers share: status marks, shapes, the layers × checks matrix, the progress bar.

Used by :mod:`~layerlab.cli.render_gradcheck`, :mod:`~layerlab.cli.render_export`,
:mod:`~layerlab.cli.render_inspect`, :mod:`~layerlab.cli.render_shapes` and
:mod:`~layerlab.cli.render_profile`; like them, it only formats (no computation here).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from rich.markup import escape
from rich.table import Table

from layerlab.checks.report import Status

#: status → (mark, Rich style)
MARK = {Status.PASS: ("✓", "green"), Status.FAIL: ("✗", "bold red"), Status.WARN: ("!", "yellow"),
        Status.SKIP: ("·", "dim")}


def status_mark(status: Any) -> str:
    """``✓`` / ``✗`` / ``!`` / ``·`` in the status's colour (Rich markup)."""
    mark, style = MARK[Status(status)]
    return f"[{style}]{mark}[/]"


def status_cell(status: Any) -> str:
    """``✓ pass`` / ``✗ fail`` / ``! warn`` / ``· skip`` in the status's colour (Rich markup)."""
    mark, style = MARK[Status(status)]
    return f"[{style}]{mark} {Status(status).value}[/]"


def verdict(ok: bool) -> str:
    """The first word of a verdict line: ``ok`` or ``FAILED`` (Rich markup)."""
    return "[bold green]ok[/]" if ok else "[bold red]FAILED[/]"


def shape(s: Optional[Sequence[int]]) -> str:
    """``(8, 3, 32, 32)``; ``—`` for none."""
    return "(" + ", ".join(map(str, s)) + ")" if s is not None else "—"


def inputs(named: Optional[Mapping[str, Any]]) -> str:
    """``x (4, 7, 8), h0 (1, 4, 16)``: each input's name and description."""
    return ", ".join(f"{k} {v}" for k, v in (named or {}).items())


def matrix_table(rows: List[Tuple[str, Dict[str, str]]], names: Sequence[str], short: Mapping[str, str],
                 justify: str) -> Table:
    """Layers × ``names`` (column titles from ``short``): ``rows`` is ``[(target, {name: cell})]``;
    a name missing from a row's cells is an empty cell."""
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    table.add_column("layer", no_wrap=True, min_width=max([len(target) for target, _ in rows] + [5]))
    for name in names:
        title = short.get(name, name)
        table.add_column(title, justify=justify, no_wrap=True, min_width=len(title))
    for target, cells in rows:
        table.add_row(escape(target), *(cells.get(name, "") for name in names))
    return table


@contextlib.contextmanager
def progress(console, total: int, label: str) -> Iterator[Callable[[str, int, int], None]]:
    """A transient progress bar titled ``label`` on ``console`` (stderr); yields the
    ``progress(name, i, n)`` callback."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeElapsedColumn(), console=console, transient=True)
    task = bar.add_task("", total=total)

    def advance(name: str, i: int, n: int) -> None:
        bar.update(task, completed=i, description=name)

    with bar:
        yield advance
