"""Pieces the renderers share: status marks, shapes, the layers × checks matrix, the progress bar.

Used by :mod:`~layerlab.cli.render_gradcheck`, :mod:`~layerlab.cli.render_export`,
:mod:`~layerlab.cli.render_inspect`, :mod:`~layerlab.cli.render_shapes` and
:mod:`~layerlab.cli.render_profile`; like them, it only formats (no computation here).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from layerlab.text_safety import escape
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


def fit_columns(need: Mapping[str, int], width: Optional[int], soft: Optional[Mapping[str, int]] = None,
                hard: Optional[Mapping[str, int]] = None, drop: Sequence[str] = (),
                pads: Sequence[int] = (2, 1)) -> Tuple[Dict[str, int], int]:
    """Column widths that fit ``width`` cells, and the padding between columns.

    ``need`` is each column's full width, in table order. Tried in this order, the first that
    fits wins: everything at full width (padding ``pads[0]``, then less); the text columns cut to
    their ``soft`` floor (a name without the parents its indentation shows), then to their
    ``hard`` floor (cut with an ellipsis); then, with the soft floors again, the columns of
    ``drop`` left out one by one; last, all of ``drop`` out and the hard floors. Every column is
    kept while the names can give up cells; below that a readable name is worth more than a
    secondary column. A column in neither floor is never narrowed, so a number is never
    cut: it is shown whole or its column is left out. Columns are separated by 1 cell plus the
    padding (``box.SIMPLE_HEAD`` without edges).
    """
    def total(cols: Mapping[str, int], pad: int) -> int:
        return sum(cols.values()) + max(len(cols) - 1, 0) * (1 + pad)

    if width is None:
        return dict(need), pads[0]
    soft, hard = dict(soft or {}), dict(hard or soft or {})
    stages = [({}, 0), (soft, 0), (hard, 0)] + [(soft, k) for k in range(1, len(drop) + 1)] + [(hard, len(drop))]
    for n, (floor, k) in enumerate(stages):
        cols = {c: w for c, w in need.items() if c not in drop[:k]}
        for pad in pads if n == 0 else pads[-1:]:
            over = total(cols, pad) - width
            for c, f in floor.items():  # in the floor's order: the first gives up its cells first
                if c in cols and over > 0:
                    cut = min(over, max(cols[c] - f, 0))
                    cols[c] -= cut
                    over -= cut
            if over <= 0 or n == len(stages) - 1 and pad == pads[-1]:
                return cols, pad
    raise AssertionError("unreachable: the last stage returns")


class Fit:
    """A renderable laid out for the width it is printed at: ``build(width)`` makes it
    (a table that drops columns rather than cut numbers needs to know its width)."""

    def __init__(self, build: Callable[[int], Any]) -> None:
        self.build = build

    def __rich_console__(self, console, options):
        yield self.build(options.max_width)

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        return Measurement.get(console, options, self.build(options.max_width))
