"""Rich renderables for profile reports (the only place that formats them for people)."""

from __future__ import annotations

from typing import Any, List, Optional

from layerlab.text_safety import displays, escape
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import inputs as _inputs
from layerlab.cli.render_fold import short_path
from layerlab.profiling.report import Comparison, ProfileReport, ProfileRow


def ms(seconds: Optional[float]) -> str:
    if seconds is None:
        return "—"
    v = seconds * 1e3
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def size(n: Optional[float]) -> str:
    if not n:
        return "—" if n is None else "0"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def flops(n: Optional[float]) -> str:
    if not n:
        return "—" if n is None else "0"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(int(n))


def _flops_cell(n: float, not_counted: dict) -> str:
    """FLOPs, with a ``+`` when some compute op ran uncounted (the number is a lower bound)."""
    return flops(n) + ("+" if not_counted else "")


def _fold(rows: List[ProfileRow], depth: Optional[int]) -> List[ProfileRow]:
    """Rows down to ``depth``; a hidden row's self values go to its nearest shown ancestor."""
    if depth is None:
        return rows
    import copy

    shown = {r.index: copy.copy(r) for r in rows if r.depth <= depth}
    by_index = {r.index: r for r in rows}
    for r in rows:
        if r.depth <= depth:
            continue
        up = r.parent
        while up is not None and up not in shown:
            up = by_index[up].parent
        if up is None:
            continue
        t = shown[up]
        t.forward_s += r.forward_s
        t.backward_s += r.backward_s
        t.share += r.share
        t.flops_forward += r.flops_forward
        t.flops_backward += r.flops_backward
        t.activation_bytes += r.activation_bytes
        t.param_bytes += r.param_bytes
        t.flops_not_counted = {**t.flops_not_counted, **r.flops_not_counted}  # only read for the "+" mark
    return [shown[i] for i in sorted(shown)]


@displays
def report(r: ProfileReport, depth: Optional[int] = None, top: Optional[int] = None) -> List[Any]:
    """Header, one row per module call (self times), the step and overhead, then any comparison."""
    parts: List[Any] = [Text.from_markup(f"[bold]profile {escape(r.target)}[/]  {escape(r.model)}")]
    parts.append(Text.from_markup("[dim]" + escape(
        f"inputs: {_inputs(r.inputs)}  mode: {r.mode}  device: {r.device}  {r.threads} thread(s)  "
        f"median of {r.repeats} (warm-up {r.warmup}), {r.timer}") + "[/]"))
    rows = _fold(r.rows, depth)
    if top is not None:
        keep = {x.index for x in sorted(rows, key=lambda x: -x.share)[:top]}
        rows = [x for x in rows if x.index in keep]
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    table.add_column("module", no_wrap=True)
    table.add_column("class", no_wrap=True, overflow="ellipsis", max_width=20)
    for title in ("fwd ms", "bwd ms", "share", "FLOPs", "act. mem", "params"):
        table.add_column(title, justify="right", no_wrap=True)
    for x in rows:
        # below its parent, as the indentation shows; a numbered block keeps its container (h.0, not 0)
        name = x.label if x.path == "" else ("  " * x.depth + short_path(x.path) + x.label[len(x.path):])
        table.add_row(escape(name), escape(x.class_name), ms(x.forward_s), ms(x.backward_s) if r.backward else "—",
                      f"{100 * x.share:.1f}%", _flops_cell(x.flops_forward, x.flops_not_counted),
                      size(x.activation_bytes), size(x.param_bytes))
    t = r.totals
    table.add_row("[bold]total[/]", "", ms(t["forward_s"]), ms(t["backward_s"]) if r.backward else "—", "100%",
                  _flops_cell(t["flops_forward"], r.flops_not_counted), size(t["activation_bytes"]),
                  size(t["param_bytes"]))
    parts.append(table)
    parts.append(Text.from_markup(
        "[dim]self time and forward FLOPs (children have their own rows; backward FLOPs "
        f"{escape(flops(t['flops_backward']))} in all, per row in --json); act. mem = bytes autograd saved for "
        "backward during the call; each parameter counted once, on the first call of the module holding it "
        "(or of its nearest caller that ran, when that module is used through F.linear and the like)[/]"))
    parts.extend(_step(r))
    for comp in (r.compile, r.reference):
        if comp is not None:
            parts.extend(comparison(comp))
    for note in r.notes:
        parts.append(Text.from_markup(f"[yellow]note:[/] {escape(note)}"))
    return parts


def _step(r: ProfileReport) -> List[Any]:
    s = r.step
    lines = [f"step without hooks: [bold]{ms(s.step_s)} ms[/] = forward {ms(s.forward_s)} + backward "
             f"{ms(s.backward_s)} ms",
             f"rows add up to {ms(s.rows_sum_s)} ms: {100 * s.rows_error:+.1f}% of the step"
             + (f"  [dim](autograd engine between nodes, not in any row: {ms(s.unattributed_s)} ms)[/]"
                if r.backward else ""),
             f"profiler overhead: {ms(s.profiled_step_s)} ms with hooks, {100 * s.overhead:+.1f}% vs without"]
    if s.peak_bytes is not None:
        lines.append(f"peak device memory of a step: {size(s.peak_bytes)}")
    return [Text.from_markup(line) for line in lines]


def _value(v: Optional[float], unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{ms(v)} ms"
    if unit == "bytes":
        return size(v)
    return f"{v:,.1f} {unit}"


def comparison(c: Comparison) -> List[Any]:
    """``metric | a | b | a / b`` (``--compile``: eager vs compiled; ``--vs-reference``: layer vs torch.nn)."""
    title = "eager vs torch.compile" if c.kind == "compile" else "vs reference"
    parts: List[Any] = [Text.from_markup(f"\n[bold]{escape(title)}[/]")]
    if c.error:
        parts.append(Text.from_markup(f"[bold red]✗[/] {escape(c.error)}"))
        return parts
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 1))
    table.add_column("")
    if c.kind == "reference":
        a, b = "ours: " + c.a.rsplit(".", 1)[-1], "reference: " + c.b.rsplit(".", 1)[-1]
    else:
        a, b = c.a, c.b
    table.add_column(escape(a), justify="right")
    table.add_column(escape(b), justify="right")
    table.add_column("ratio", justify="right")
    for m in c.metrics:
        ratio = m.ratio
        text = "—" if ratio is None else f"{ratio:.2f}×"
        if ratio is not None and ratio != 1:
            good = ratio < 1 if m.better == "lower" else ratio > 1
            text = f"[{'green' if good else 'yellow'}]{text}[/]"
        table.add_row(escape(m.name), _value(m.a, m.unit), _value(m.b, m.unit), text)
    parts.append(table)
    for note in c.notes:
        parts.append(Text.from_markup(f"[dim]{escape(note)}[/]"))
    return parts
