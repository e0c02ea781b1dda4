"""Rich renderables for precision-check reports (the only place that formats them for people).

Errors are shown in units of the run's ``eps`` (``0.6ε``): the bars are multiples of it, so a
reader compares a cell with the bar without knowing the dtype (the JSON carries the raw values).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional

from layerlab.text_safety import displays, escape
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import inputs as _inputs
from layerlab.cli.render_common import verdict
from layerlab.cli.render_fold import short_path
from layerlab.mixed.report import Finding, ModuleRow, PrecisionReport, PrecisionRun

MARK = {"error": "[bold red]✗[/]", "warning": "[yellow]![/]", "info": "[dim]·[/]"}
FLAG_STYLE = {"precision": "bold red", "non-finite": "bold red", "overflow": "bold red", "inherited": "dim",
              "upstream": "dim"}


def in_eps(value: Optional[float], eps: float) -> str:
    """``0.6ε``, ``140ε``, ``inf``; ``—`` for none."""
    if value is None:
        return "—"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    units = value / eps
    if units == 0:
        return "0"
    return f"{units:.1f}ε" if units < 10 else f"{units:.0f}ε" if units < 1e4 else f"{units:.0e}ε"


def magnitude(value: Optional[float]) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if value < 1e4 else f"{value:.2e}"


def _label(row: ModuleRow) -> str:
    name = short_path(row.path) if row.path else "(root)"
    if row.call > 1:
        name += f" #{row.call}"
    return "  " * row.depth + name


def _shown(rows: List[ModuleRow], depth: Optional[int], limit: Optional[int]) -> List[ModuleRow]:
    picked = [r for r in rows if depth is None or r.depth <= depth or (r.flags and "inherited" not in r.flags)]
    if limit is not None and len(picked) > limit:
        flagged = [r for r in picked[limit:] if r.flags and "inherited" not in r.flags]
        picked = picked[:limit] + flagged
    return picked


def run_table(run: PrecisionRun, depth: Optional[int] = None, limit: Optional[int] = None) -> Table:
    tol = run.tolerance
    table = Table(title=f"[b]{escape(run.label)}[/] vs float32 (ε = {tol.eps:g}): flagged when out > "
                        f"{tol.output / tol.eps:g}ε and > {tol.gain:g}× in; param grad > {tol.grad / tol.eps:g}ε",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("module", overflow="fold")
    table.add_column("class", overflow="ellipsis", max_width=22)
    table.add_column("dtype")
    table.add_column("out", justify="right")
    table.add_column("in", justify="right")
    table.add_column("grad", justify="right")
    table.add_column("param grad", justify="right")
    table.add_column("max|x| fp32", justify="right")
    table.add_column("ops / flags", overflow="fold")
    rows = _shown(run.rows, depth, limit)
    for row in rows:
        flags = " ".join(f"[{FLAG_STYLE.get(f, '')}]{f}[/]" for f in row.flags)
        ops = escape("; ".join(row.ops))
        table.add_row(escape(_label(row)), escape(row.class_name), row.dtype or "—", in_eps(row.error, tol.eps),
                      in_eps(row.input_error, tol.eps), in_eps(row.grad_error, tol.eps),
                      in_eps(row.param_error, tol.eps), magnitude(row.amax), " ".join(p for p in (flags, ops) if p))
    hidden = len(run.rows) - len(rows)
    if hidden:
        table.caption = f"{hidden} more module call(s) not shown (--all-rows, --depth)"
    return table


def finding(f: Finding, first: bool = False) -> Text:
    head = "first: " if first else ""
    lines = [f"{MARK.get(f.severity, '')} [b]{head}[/]{escape(f.message)}"]
    if f.cause:
        lines.append(f"    why: {escape(f.cause)}" + (f" [dim]({escape(f.source)})[/]" if f.source else ""))
    if f.fix:
        lines.append(f"    [cyan]fix:[/] {escape(f.fix)}")
    return Text.from_markup("\n".join(lines))


@displays
def report(rep: PrecisionReport, depth: Optional[int] = None, limit: Optional[int] = 40) -> List[Any]:
    """The renderables ``layerlab precision-check`` prints, in order."""
    parts: List[Any] = [Text.from_markup(
        f"[b]precision-check[/] {escape(rep.target)} · {escape(rep.model)} · {escape(rep.device)} · {rep.mode} · "
        f"inputs {escape(_inputs(rep.inputs))}")]
    for run in rep.runs:
        parts.append(Text(""))
        if run.raised is None:
            parts.append(run_table(run, depth, limit))
        first = run.first
        for f in run.findings:
            parts.append(finding(f, first=f is first))
        summary = (f"output error {in_eps(run.output_error, run.tolerance.eps)}, worst parameter gradient "
                   f"{in_eps(run.grad_error, run.tolerance.eps)}" if run.raised is None else "did not run through")
        if run.ok and any(f.kind == "float32-non-finite" for f in run.findings):
            # nothing failed, but the reference it was compared with is broken: say so, not "ok"
            parts.append(Text.from_markup(f"[yellow]? not judged[/] {escape(run.label)}: {summary} "
                                          "(float32 itself is not finite)"))
            continue
        parts.append(Text.from_markup(f"{verdict(run.ok)} {escape(run.label)}: {summary}"))
    if rep.forecast:
        parts.append(Text(""))
        parts.append(Text.from_markup("[b]float16 forecast[/] (read from the float32 values)"))
        parts.extend(finding(f) for f in rep.forecast)
    for line in rep.notes:
        parts.append(Text.from_markup(f"[dim]note: {escape(line)}[/]"))
    parts.append(Text.from_markup(f"[dim]loss: {escape(rep.loss)}[/]"))
    ran = ", ".join(r.label for r in rep.runs)
    broken = rep.ok and any(f.kind == "float32-non-finite" for r in rep.runs for f in r.findings)
    parts.append(Text.from_markup((f"[yellow]? not judged[/] {escape(ran)} vs float32: float32 itself is not finite"
                                   if broken else f"{verdict(rep.ok)} {escape(ran)} vs float32")
                                  + ("" if rep.ok else f": {sum(not r.ok for r in rep.runs)} run(s) failed")))
    return parts
