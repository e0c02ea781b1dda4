"""Rich renderables for export-check reports (the only place that formats them for people)."""

from __future__ import annotations

from typing import Any, List

from layerlab.text_safety import displays, escape
from rich.table import Table
from rich.text import Text

from layerlab.checks.report import Status, status_counts
from layerlab.cli import render_common as C
from layerlab.deploy.report import PATH_TITLES, ExportMatrix, ExportReport, PathResult

#: column titles of the matrix
SHORT = {"trace": "trace", "script": "script", "compile": "compile", "export": "export",
         "export_dynamic": "export(dyn B)", "onnx": "onnx"}


def _eager(r: PathResult) -> str:
    if r.matches_eager is None:
        return "[dim]—[/]"
    return "[green]yes[/]" if r.matches_eager else "[bold red]no[/]"


@displays
def report(r: ExportReport, strict: bool = False) -> List[Any]:
    """Header, one row per path (result, outputs = eager, reason, where), the fixes, the verdict."""
    s = r.settings
    parts: List[Any] = [Text.from_markup(f"[bold]export-check {escape(r.target)}[/]  {escape(r.module)}")]
    inputs = C.inputs(s.get("inputs"))
    sub = [f"inputs: {inputs}" if inputs else "", f"mode: {s.get('mode', 'eval')}",
           f"compile backend: {s.get('compile_backend')}"]
    parts.append(Text.from_markup("[dim]" + escape("  ".join(x for x in sub if x)) + "[/]"))
    parts.append(Text.from_markup("[dim]" + escape(f"outputs compared with rtol {s.get('rtol', 0):g}, "
                                                   f"atol {s.get('atol', 0):g} (integers exactly)") + "[/]"))
    if s.get("variants"):
        parts.append(Text.from_markup("[dim]" + escape("other inputs tried: " + ", ".join(s["variants"])) + "[/]"))
    for note in s.get("notes", []):  # e.g. a constant eager output, and what was done about it
        parts.append(Text.from_markup(f"[yellow]note:[/] {escape(note)}"))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("path", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("= eager", no_wrap=True)
    table.add_column("why", ratio=1)
    for p in r.paths:
        where = f" [dim]({escape(p.where)})[/]" if p.where else ""
        table.add_row(escape(SHORT.get(p.path, p.path)), C.status_cell(p.status), _eager(p),
                      escape(p.reason) + where)
    parts.append(table)
    legend = "  ".join(f"{SHORT.get(p.path, p.path)} = {PATH_TITLES.get(p.path, p.path)}" for p in r.paths)
    parts.append(Text.from_markup(f"[dim]{escape(legend)}[/]"))
    for p in r.paths:
        if p.hint and p.status in (Status.FAIL, Status.WARN, Status.SKIP):
            parts.append(Text.from_markup(f"{C.status_mark(p.status)} {escape(p.path)}: [cyan]fix:[/] {escape(p.hint)}"))
    parts.append(_verdict(r.ok_for(strict), r.counts(), r.seconds, strict))
    return parts


def _verdict(ok: bool, counts: dict, seconds: float, strict: bool) -> Text:
    word = C.verdict(ok)
    warn = f"{counts['warn']} warning(s)" + (" (counted as failures: --strict)" if strict and counts["warn"] else "")
    return Text.from_markup(f"{word}: {counts['fail']} failed, {counts['pass']} passed, {warn}, "
                            f"{counts['skip']} skipped  [dim]({seconds:.1f} s)[/]")


@displays
def matrix(m: ExportMatrix, strict: bool = False, verbose: bool = True) -> List[Any]:
    """Layers × paths, then the reason of every cell that did not pass."""
    cells = [{p.path: p for p in r.paths if p.path in m.path_names} for r in m.reports]
    counts = status_counts(p for by in cells for p in by.values())
    rows = [(r.target, {name: C.status_cell(p.status) for name, p in by.items()}) for r, by in zip(m.reports, cells)]
    table = C.matrix_table(rows, m.path_names, SHORT, justify="left")
    legend = "  ".join(f"{SHORT.get(n, n)} = {PATH_TITLES[n]}" for n in m.path_names)
    parts: List[Any] = [table, Text.from_markup("[dim]✓ pass (outputs equal eager)  ! warn (input-specific, "
                                                "graph breaks)  ✗ fail  · skipped[/]"),
                        Text.from_markup(f"[dim]{escape(legend)}[/]")]
    for r in m.reports:
        for p in r.paths:
            if p.status == Status.FAIL or (verbose and p.status in (Status.WARN, Status.SKIP)):
                where = f" ({p.where})" if p.where else ""
                parts.append(Text.from_markup(f"{C.status_mark(p.status)} {escape(r.target)} · {escape(p.path)}: "
                                              f"{escape(p.reason)}{escape(where)}"))
    n = len(m.reports)
    bad = sum(1 for r in m.reports if not r.ok_for(strict))
    word = C.verdict(m.ok_for(strict))
    warn = f"{counts['warn']} warned" + (" (counted as failures: --strict)" if strict and counts["warn"] else "")
    parts.append(Text.from_markup(
        f"{word}: {n} layer{'s' if n != 1 else ''}, {bad} with a failing path · cells: {counts['pass']} passed, "
        f"{warn}, {counts['fail']} failed, {counts['skip']} skipped  [dim]({m.seconds:.1f} s)[/]"))
    return parts
