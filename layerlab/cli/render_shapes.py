"""Rich renderables for explain-shape results (the only place that formats them for people)."""

from __future__ import annotations

from typing import Any, Dict, List

from rich.console import Group
from layerlab.text_safety import displays, escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import shape
from layerlab.shapes.chain import ChainResult
from layerlab.shapes.inverse import InverseResult
from layerlab.shapes.result import Explanation
from layerlab.shapes.table import SizeTable
from layerlab.shapes.torch_version import MEASURED


def _notes(ex: Explanation) -> List[Any]:
    rows = []
    for note in ex.notes:
        style, mark = ("yellow", "⚠") if note.severity == "warning" else ("cyan", "ℹ")
        rows.append(Text.from_markup(f"[{style}]{mark} {escape(note.code)}:[/] {escape(note.message)}"))
    return rows


def _error(ex: Explanation) -> Panel:
    err = ex.error
    lines = [f"[bold]{escape(err.message)}[/]"]
    if err.expected is not None or err.got is not None:  # an unknown side is left out, not shown as None
        lines.append("   ".join(f"{k}: {escape(str(v))}" for k, v in (("expected", err.expected), ("got", err.got))
                                if v is not None))
    lines.append(f"torch raises: [red]{escape(err.torch_exception)}: {escape(err.torch_message)}[/]")
    if err.rule:
        lines.append(f"[dim]rule: shape_rules {escape(err.rule)}[/]")
    for s in err.suggestions:
        lines.append(f"[green]→ {escape(str(s))}[/]")
    if err.hint:
        lines.append(f"[cyan]hint:[/] {escape(err.hint)}")
    return Panel("\n".join(lines), title="torch would raise", border_style="red", expand=False)


def _torch_line(ex: Explanation) -> List[Any]:
    """Which torch the prediction is for — shown only when it is not simply the installed,
    measured one (the common case stays as it was)."""
    rules = ex.torch_rules
    if rules is None or (rules.source == "installed" and rules.measured):
        return []
    why = {"given": "as asked", "assumed": "torch is not installed", "installed": "the installed torch"}[rules.source]
    text = f"predicted for torch {rules.version} ({why})"
    if not rules.measured:
        text += f"; the rules were measured on torch {', '.join(MEASURED)} only"
    return [Text(text, style="dim")]


@displays
def explanation(ex: Explanation) -> List[Any]:
    """Header, one row per dim (formula, numbers, result), the notes, and the error if any."""
    parts: List[Any] = [
        Text.from_markup(
            f"[bold]{escape(ex.call)}[/]  input {shape(ex.input_shape)} → "
            + (f"[bold green]{shape(ex.output_shape)}[/]" if ex.ok else "[bold red]error[/]")
        )
    ]
    parts.extend(_torch_line(ex))
    if ex.steps:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("dim", "in", "values", "formula", "with the numbers", "out"):
            table.add_column(col, justify="right" if col in ("in", "out") else "left")
        for step in ex.steps:
            out_style = "green" if step.output >= 1 else "red"
            values = " ".join(f"{k}={v}" for k, v in step.values.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
            table.add_row(step.dim, "" if step.input is None else str(step.input), escape(values),
                          escape(step.formula), escape(step.substituted), f"[{out_style}]{step.output}[/]")
        parts.append(table)
    parts.extend(_notes(ex))
    if ex.error is not None:
        parts.append(_error(ex))
    return parts


@displays
def size_table(table: SizeTable) -> List[Any]:
    parts: List[Any] = [Text.from_markup(f"[bold]{escape(table.call)}[/]")]
    if table.formula:
        parts.append(Text.from_markup(f"formula: [bold]{escape(table.formula)}[/]  (per spatial dim)"))
    if table.keep_size:
        parts.append(Text.from_markup(f"keeps the size: {escape(table.keep_size)}"))
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False, title_justify="left")
    t.add_column("input", justify="right")
    t.add_column("output", justify="right")
    t.add_column("pixels lost", justify="right")
    t.add_column("")
    for row in table.rows:
        if row.output is None:
            t.add_row(str(row.input), "[red]error[/]", "", f"[red]{escape(row.error or '')}[/]")
        else:
            mark = "[green]✓ no pixel lost[/]" if row.lost_pixels == 0 else ""
            t.add_row(str(row.input), str(row.output), str(row.lost_pixels), mark)
    parts.append(t)
    parts.append(Text("Give --input for the step-by-step arithmetic, --target for the inverse question.",
                      style="dim"))
    return parts


def _params(params: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


@displays
def inverse(result: InverseResult) -> List[Any]:
    parts: List[Any] = [Text.from_markup(f"[bold]{escape(result.question)}[/]  ({escape(result.op)})")]
    # Dims with the same question and the same answers are shown once ("H, W: 32 → 16").
    groups: List[Any] = []
    for dim in result.dims:
        key = (dim.input, dim.target, [c.params for c in dim.candidates], dim.derivation)
        if groups and groups[-1][0] == key:
            groups[-1][1].append(dim.dim)
        else:
            groups.append((key, [dim.dim], dim))
    for _, names, dim in groups:
        title = f"{', '.join(names)}: {dim.input} → {dim.target}"
        lines = [f"[dim]{escape(line)}[/]" for line in dim.derivation]
        if dim.candidates:
            t = Table(show_header=False, box=None, pad_edge=False)
            t.add_column()
            t.add_column(style="dim")
            for c in dim.candidates[:12]:
                t.add_row(f"[green]{escape(_params(c.params))}[/]", escape(c.comment))
            more = len(dim.candidates) - 12
            body: List[Any] = [Text.from_markup(l) for l in lines] + [t]
            if more > 0:
                body.append(Text(f"… {more} more (--json lists all)", style="dim"))
        else:
            body = [Text.from_markup(l) for l in lines] + [Text("no setting in the searched grid reaches it", style="red")]
        parts.append(Panel(Group(*body), title=title, title_align="left", expand=False))
    return parts


def _note_codes(ex: Explanation) -> str:
    """The stage's notes by code, warnings first (``cropped ×2``): what to look for below the table."""
    counts: Dict[tuple, int] = {}
    for note in sorted(ex.notes, key=lambda n: n.severity != "warning"):
        code = "note" if note.code == "info" else note.code  # a plain-words fact has no code of its own
        counts[(note.severity, code)] = counts.get((note.severity, code), 0) + 1
    return ", ".join(("[yellow]⚠ {}[/]" if sev == "warning" else "[dim]ℹ {}[/]").format(
        escape(code) + (f" ×{n}" if n > 1 else "")) for (sev, code), n in counts.items())


@displays
def chain(result: ChainResult) -> List[Any]:
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("#", "op", "input", "output", "notes"):
        t.add_column(col)
    for i, ex in enumerate(result.stages, 1):
        out = f"[green]{shape(ex.output_shape)}[/]" if ex.ok else "[red]torch would raise[/]"
        t.add_row(str(i), escape(ex.call), shape(ex.input_shape), out, _note_codes(ex))
    final = shape(result.output_shape) if result.ok else "error"
    parts: List[Any] = [Text.from_markup(f"[bold]chain[/] {shape(result.input_shape)} → [bold]{final}[/]"), t]
    for i, ex in enumerate(result.stages, 1):
        if ex.notes or not ex.ok:
            parts.append(Text(f"stage {i}: {ex.call}", style="bold"))
            parts.extend(explanation(ex)[1:])
    return parts
