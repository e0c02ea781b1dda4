"""Rich renderables for ddp-check reports (the only place that formats them for people).

Order: what ran (one line), the per-rank table (inputs, outputs, status), the findings with cause
and fix, the parameters (every one up to :data:`MAX_ROWS`, else the ones that differ), the buffers,
then the verdict with the tolerances and times.
"""

from __future__ import annotations

from typing import Any, List, Optional

from layerlab.text_safety import displays, escape
from rich.table import Table

from layerlab.cli.render_common import verdict
from layerlab.distributed.report import DdpReport, RankRow, TensorInfo

#: parameters shown when all are ok; beyond it only those that differ
MAX_ROWS = 24
_SEVERITY = {"error": "[bold red]✗[/]", "warning": "[yellow]![/]", "info": "[dim]·[/]"}
_STATUS = {"ok": "[green]✓ ok[/]", "unused": "[dim]· unused[/]", "differs from single": "[bold red]✗ ≠ 1 proc[/]"}


def num(x: Optional[float]) -> str:
    return "—" if x is None else "0" if x == 0 else f"{x:.3g}"


def _tensors(items: List[TensorInfo]) -> str:
    return ", ".join(f"{escape(t.path)} {t.dtype}({', '.join(map(str, t.shape))})" for t in items) or "—"


def _rank_label(row: RankRow) -> str:
    return "1 process" if row.rank < 0 else f"rank {row.rank}"


@displays
def report(r: DdpReport) -> List[Any]:
    parts: List[Any] = [
        f"[b]ddp-check[/b] {escape(r.target)} ({escape(r.model)}): {r.world_size} rank(s), {r.backend} on {r.device}"
        f" ({r.launcher}) against one process · batch {r.batch} → {r.batch // max(r.world_size, 1)} per rank · "
        f"loss {escape(r.loss)}"]
    ranks = Table(title="ranks", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("", "status", "inputs", "outputs", "time s"):
        ranks.add_column(col, justify="right" if col == "time s" else "left", overflow="fold")
    for row in r.ranks:
        status = "[green]ok[/]" if row.status == "ok" else f"[bold red]{row.status}[/]"
        detail = _tensors(row.inputs) if row.status == "ok" else escape(row.error or "")
        ranks.add_row(_rank_label(row), status, detail, _tensors(row.outputs), f"{row.seconds:.2f}")
    parts.append(ranks)
    for f in r.findings:
        lines = [f"{_SEVERITY.get(f.severity, '·')} [b]{escape(f.title)}[/b]: {escape(f.message)}"]
        if f.cause:
            lines.append(f"    [dim]cause:[/] {escape(f.cause)}")
        if f.fix:
            lines.append(f"    [dim]fix:[/] {escape(f.fix)}")
        failed = [row for row in r.ranks if row.frames and f"rank {row.rank}" in f.where]
        for row in failed:
            lines.extend(f"    [dim]at[/] {escape(frame)}" for frame in row.frames)
        parts.append("\n".join(lines))
    if r.params:
        shown = r.params if len(r.params) <= MAX_ROWS else [p for p in r.params if p.status != "ok"]
        table = Table(title="gradients after the all-reduce" + ("" if shown is r.params else
                                                                f" ({len(shown)} of {len(r.params)}: those that differ)"),
                      title_justify="left", show_edge=False, pad_edge=False)
        for col, just in (("parameter", "left"), ("shape", "left"), ("max |grad|", "right"),
                          ("Δ ranks", "right"), ("Δ one process", "right"), ("unused on", "left"), ("", "left")):
            table.add_column(col, justify=just, overflow="fold")
        for p in shown:
            table.add_row(escape(p.name), f"({', '.join(map(str, p.shape))})", num(p.single_scale), num(p.ranks_diff),
                          num(p.single_diff), ", ".join(map(str, p.unused_on)) or "",
                          _STATUS.get(p.status, f"[bold red]✗ {p.status}[/]"))
        parts.append(table)
    if r.buffers:
        table = Table(title="buffers", title_justify="left", show_edge=False, pad_edge=False)
        for col, just in (("buffer", "left"), ("shape", "left"), ("changed on", "left"), ("Δ ranks", "right"),
                          ("Δ after DDP", "right"), ("", "left")):
            table.add_column(col, justify=just, overflow="fold")
        for b in r.buffers:
            table.add_row(escape(b.name), f"({', '.join(map(str, b.shape))})",
                          ", ".join(map(str, b.changed_on)) or "—", num(b.ranks_diff), num(b.after_diff),
                          "[green]✓ ok[/]" if b.status == "ok" else f"[yellow]! {b.status}[/]")
        parts.append(table)
    errors = sum(f.severity == "error" for f in r.findings)
    warnings = sum(f.severity == "warning" for f in r.findings)
    tail = [f"{verdict(r.ok)}: {errors} error(s), {warnings} warning(s) · rtol {r.tolerance.get('rtol', '—')}, "
            f"atol {r.tolerance.get('atol', '—')} × the parameter's largest gradient · "
            + " · ".join(f"{k} {v:.1f} s" for k, v in r.seconds.items())]
    tail += [f"[dim]note:[/] {escape(n)}" for n in r.notes]
    parts.append("\n".join(tail))
    return parts
