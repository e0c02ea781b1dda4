"""Rich renderables for diff reports (the only place that formats them for people).

Readable at 100 columns: the manifest lines that differ, where the forward starts to differ,
then one table of changes, largest first, cut at ``--top``.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional

from layerlab.text_safety import displays, escape
from rich.table import Table
from rich.text import Text

from layerlab.report_diff.numbers import as_number
from layerlab.report_diff.report import Change, DiffReport

_KINDS = {"inspect-report": "inspect reports", "profile-report": "profile reports",
          "gradcheck-report": "gradcheck reports", "gradcheck-matrix": "gradcheck --all reports"}


@displays
def render(report: DiffReport, top: Optional[int] = 25) -> List[Any]:
    parts: List[Any] = [
        Text.from_markup(f"[bold]layerlab diff[/] of two {_KINDS.get(report.kind, escape(report.kind))}\n"
                         f"  A (before) {escape(report.a)}\n  B (after)  {escape(report.b)}"),
        Text.from_markup(f"[dim]numbers differ when |a − b| > atol + rtol·max(|a|, |b|); rtol {report.rtol:g}, "
                         f"atol {report.atol:g}[/]"),
    ]
    parts.append(manifest(report))
    if report.origins:
        where = ", ".join(report.origins[:6]) + (f" … (+{len(report.origins) - 6})" if len(report.origins) > 6 else "")
        parts.append(Text.from_markup(f"[bold]starts to differ at:[/] {escape(where)} "
                                      "[dim](same inputs in A and B, different outputs)[/]"))
    if report.changes:
        parts.append(changes_table(report.top(top)))
    parts.append(summary(report, top))
    for note in report.notes:
        parts.append(Text.from_markup(f"[dim]note: {escape(note)}[/]"))
    return parts


def manifest(report: DiffReport) -> Any:
    if not report.manifest:
        return Text.from_markup("[bold]runs:[/] made the same way [dim](manifests agree, or are missing: see notes)[/]")
    table = Table(title="how the runs differ (manifest)", title_justify="left", show_edge=False, pad_edge=False,
                  box=None, header_style="bold")
    table.add_column("", overflow="fold", max_width=24)
    table.add_column("A", overflow="fold", ratio=1)
    table.add_column("B", overflow="fold", ratio=1)
    for c in report.manifest:
        short = 12 if c.where.endswith("sha256") else 60  # 12 hex digits tell two files apart
        table.add_row(escape(c.where), escape(value(c.a, short)), escape(value(c.b, short)))
    return table


def changes_table(changes: List[Change]) -> Table:
    table = Table(show_edge=False, pad_edge=False, header_style="bold", expand=False)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("where", overflow="fold", max_width=34)
    table.add_column("what", overflow="fold", max_width=22)
    table.add_column("A", justify="right", overflow="fold", max_width=14)
    table.add_column("B", justify="right", overflow="fold", max_width=14)
    table.add_column("change", justify="right", no_wrap=True)
    for i, c in enumerate(changes, 1):
        table.add_row(str(i), escape(c.where), escape(c.what), escape(value(c.a)), escape(value(c.b)),
                      change_text(c))
    return table


def summary(report: DiffReport, top: Optional[int]) -> Text:
    n = len(report.changes)
    counted = ", ".join(f"{v} {k if v != 1 else k.rstrip('s')}" for k, v in report.compared.items())
    if not n:
        return Text.from_markup(f"[green]no differences beyond tolerance[/]\n[dim]compared {counted}[/]")
    shown = "" if top is None or n <= top else f"; showing the {top} largest (--top N, 0 for all)"
    places = len({c.where for c in report.changes})
    return Text.from_markup(f"[yellow]{n} difference{'s' if n != 1 else ''}[/] in {places} place"
                            f"{'s' if places != 1 else ''}{shown}\n[dim]compared {counted}[/]")


def value(v: Any, width: int = 14) -> str:
    """A value in a cell: numbers to 4 significant digits, shapes as lists, long text cut."""
    if v is None:
        return "—"
    x = as_number(v)
    if x is not None:
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        return f"{x:.4g}"
    text = str(v) if not isinstance(v, list) else "[" + ", ".join(map(str, v)) + "]"
    return text if len(text) <= width else text[: width - 1] + "…"


def change_text(c: Change) -> str:
    """×3.2 or +12.0% for numbers of one sign, the difference otherwise; nothing for structure."""
    if not c.numeric:
        return ""
    a, b = as_number(c.a), as_number(c.b)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return "∞" if not math.isfinite(c.score) else ""
    if a != 0 and b != 0 and (a > 0) == (b > 0):
        r = b / a
        if 0.5 <= r <= 2:
            pct = (r - 1) * 100
            return f"{pct:+.1f}%" if abs(pct) >= 0.1 else f"{pct:+.2g}%"
        return f"×{r:.3g}"
    return f"{b - a:+.3g}"
