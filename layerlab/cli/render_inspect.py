"""Rich renderables for an :class:`~layerlab.probe.report.InspectReport` (no computation here).

Tables are laid out to read at 100 columns: the forward table (one row per module call, one
sub-row per extra element of a tuple/dict output), the backward table (gradient norms per call),
parameter gradients, formula checks, problems, the failure panel and a summary.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, List, Optional

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from layerlab.probe.report import CallRecord, InspectReport, TensorInfo


def num(x: Optional[float], digits: int = 3) -> str:
    """Compact number: ``0.123``, ``1.23e+04``, ``nan``; ``—`` for missing."""
    if x is None:
        return "—"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    if x == 0:
        return "0"
    text = f"{x:.{digits}g}"
    if "e" in text:  # 1.86e-09 → 1.86e-9
        mantissa, exp = text.split("e")
        text = f"{mantissa}e{int(exp)}"
    return text


def count(n: int) -> str:
    if n == 0:
        return "—"
    return f"{n:,}" if n < 1_000_000 else f"{n / 1e6:.2f}M"


def shape(s: Optional[List[int]]) -> str:
    return "(" + ", ".join(map(str, s)) + ")" if s is not None else "—"


def _grad_fn(info: TensorInfo) -> str:
    if info.grad_fn:
        name = info.grad_fn
        return name[: -len("Backward0")] if name.endswith("Backward0") else name
    return "leaf" if info.requires_grad else "—"


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                 header_style="bold", pad_edge=False, padding=(0, 0, 0, 2), show_edge=False)


def _module_cell(call: CallRecord) -> Text:
    if call.path == "":
        text = Text(call.class_name if call.call == 1 else f"{call.class_name} (call {call.call})", style="bold")
    else:
        text = Text("  " * call.depth + call.label)
        text.append(f" {call.class_name}", style="dim")
    if call.status == "raised":
        text.stylize("bold red")
    elif call.status == "unfinished":
        text.stylize("red")
    return text


def _flags(info: TensorInfo, common: tuple) -> str:
    out = []
    s = info.stats
    if s is not None and s.nan:
        out.append(f"[red]{s.nan} NaN[/]")
    if s is not None and s.inf:
        out.append(f"[red]{s.inf} Inf[/]")
    if info.dtype and (info.dtype, info.device) != common:
        out.append(f"[yellow]{escape(info.dtype)}·{escape(info.device or '')}[/]")
    return " ".join(out)


def _common_kind(report: InspectReport) -> tuple:
    kinds = Counter((t.dtype, t.device) for c in report.calls for t in (*c.outputs, *c.inputs)
                    if t.dtype and t.is_tensor and (t.dtype.startswith(("float", "bfloat")) or not c.outputs))
    return kinds.most_common(1)[0][0] if kinds else (None, None)


def _visible(report: InspectReport, depth: Optional[int]) -> List[CallRecord]:
    return [c for c in report.calls if depth is None or c.depth <= depth or c.status == "raised"]


def forward_table(report: InspectReport, depth: Optional[int] = None) -> Table:
    common = _common_kind(report)
    rows = []
    for call in _visible(report, depth):
        outs = [o for o in call.outputs if o.is_tensor] or call.outputs[:1]
        first = outs[0] if outs else None
        rows.append([str(call.index), _module_cell(call), *_tensor_cells(call, first, common, head=True)])
        for extra in outs[1:]:
            label = Text("  " * call.depth + f"  └ {extra.name}", style="dim")
            rows.append(["", label, *_tensor_cells(call, extra, common, head=False)])
    t = _table("Forward")
    t.add_column("#", justify="right", style="dim")
    t.add_column("module", overflow="ellipsis", no_wrap=True, max_width=30)
    t.add_column("output", no_wrap=True, min_width=_width(rows, 2))
    for i, name in enumerate(("mean", "std", "min", "max", "zeros"), start=3):
        t.add_column(name, justify="right", no_wrap=True, min_width=max(_width(rows, i), len(name)))
    t.add_column("", overflow="fold")
    for row in rows:
        t.add_row(*row)
    return t


def _width(rows: List[list], column: int) -> int:
    return max((Text.from_markup(r[column]).cell_len for r in rows if isinstance(r[column], str)), default=1)


def _tensor_cells(call: CallRecord, info: Optional[TensorInfo], common: tuple, head: bool) -> list:
    if call.status != "ok":
        return ["[red]raised[/]" if call.status == "raised" else "[red]unfinished[/]"] + [""] * 6
    if info is None:
        return ["—"] + [""] * 6
    if not info.is_tensor:
        return [escape(repr(info.value))] + [""] * 6
    s = info.stats
    prefix = f"{info.name} " if head and info.name else ""
    stats = ["", "", "", "", ""] if s is None else [
        num(s.mean), num(s.std), num(s.min), num(s.max), f"{100 * s.zeros:.0f}%" if s.zeros else "0",
    ]
    return [escape(prefix + shape(info.shape)), *stats, _flags(info, common)]


def backward_table(report: InspectReport, depth: Optional[int] = None) -> Optional[Table]:
    if not report.backward.ran:
        return None
    t = _table("Backward  (gradient norms of the loss L, see the summary)")
    t.add_column("#", justify="right", style="dim")
    t.add_column("module", overflow="ellipsis", no_wrap=True, max_width=40)
    t.add_column("params", justify="right")
    t.add_column("grad_fn", overflow="ellipsis", max_width=18, no_wrap=True)
    t.add_column("‖∂L/∂out‖", justify="right")
    t.add_column("‖∂L/∂in‖", justify="right")
    t.add_column("", overflow="fold")
    for call in _visible(report, depth):
        outs = [o for o in call.outputs if o.is_tensor]
        ins = [i for i in call.inputs if i.is_tensor and i.requires_grad]
        grad_fn = _grad_fn(outs[0]) if outs else "—"
        t.add_row(str(call.index), _module_cell(call), count(call.params), escape(grad_fn), _grads(outs),
                  _grads(ins), _grad_flags(outs + ins))
    return t


def _grads(infos: List[TensorInfo]) -> str:
    shown = [num(i.grad.norm) for i in infos if i.grad is not None]
    if not shown:
        return "—" if not infos else "[dim]none[/]"
    return ", ".join(shown[:3]) + (" …" if len(shown) > 3 else "")


def _grad_flags(infos: List[TensorInfo]) -> str:
    bad = [i for i in infos if i.grad is not None and not i.grad.finite]
    return "[red]" + ", ".join(f"{i.name or 'out'}: {'NaN' if i.grad.nan else 'Inf'}" for i in bad) + "[/]" if bad else ""


_PARAM_FLAG_STYLE = {"no-grad": "red", "nan": "red", "inf": "red", "zero-grad": "yellow",
                     "vanishing": "yellow", "exploding": "yellow"}


def param_table(report: InspectReport) -> Optional[Table]:
    if not report.params:
        return None
    t = _table("Parameters")
    t.add_column("parameter", overflow="fold", max_width=40)
    t.add_column("shape")
    t.add_column("‖w‖", justify="right")
    t.add_column("‖grad‖", justify="right")
    t.add_column("‖grad‖/‖w‖", justify="right")
    t.add_column("", overflow="fold")
    for p in report.params:
        flags = " ".join(f"[{_PARAM_FLAG_STYLE.get(f, 'yellow')}]{f}[/]" for f in p.flags)
        if not p.trainable:
            flags = "[dim]frozen[/]"
        t.add_row(escape(p.name), shape(p.shape), num(p.norm),
                  num(p.grad_norm) if report.backward.ran and p.trainable else "—", num(p.ratio), flags)
    return t


def checks_table(report: InspectReport) -> Optional[Table]:
    if not report.checks:
        return None
    t = _table("Formula checks  (explain-shape arithmetic vs. what came out)")
    t.add_column("#", justify="right", style="dim")
    t.add_column("module", overflow="fold", max_width=24)
    t.add_column("formula, numbers substituted", overflow="fold")
    t.add_column("predicted", overflow="fold")
    t.add_column("actual", overflow="fold")
    t.add_column("")
    for c in report.checks:
        mark = {True: "[green]✓[/]", False: "[bold red]✗[/]", None: "[dim]–[/]"}[c.passed]
        lines = [escape(c.formula_call)] + [escape(s) for s in c.steps]
        if c.note and (c.passed is not True or c.predicted is None):
            lines.append(f"[dim]{escape(c.note)}[/]")
        t.add_row(str(c.call), escape(c.path or "(root)"), "\n".join(lines), shape(c.predicted), shape(c.actual), mark)
    return t


def problems_block(report: InspectReport) -> Optional[Group]:
    if not report.problems:
        return None
    lines = []
    for p in report.problems:
        mark = "[bold red]✗[/]" if p.severity == "error" else "[yellow]⚠[/]"
        lines.append(Text.from_markup(f"{mark} [bold]{escape(p.code)}[/] {escape(p.message)}"))
        if p.hint:
            lines.append(Text.from_markup(f"    [cyan]hint:[/] {escape(p.hint)}"))
    return Group(Text("Problems", style="bold"), *lines)


def failure_panel(report: InspectReport) -> Optional[Panel]:
    f = report.failure
    if f is None:
        return None
    where = (f"{f.path} ({f.class_name})" if f.path else f.class_name) if f.class_name else "outside any module"
    lines = [f"[red]{escape(f.exception)}: {escape(_first_lines(f.message))}[/]"]
    if f.chain:
        lines.append("[dim]call chain:[/] " + escape(" → ".join(f.chain)))
    tensors = [i for i in f.inputs]
    if tensors:
        lines.append("[bold]inputs of the failing call[/]")
        for i in tensors:
            if i.is_tensor:
                lines.append(f"  {escape(i.name)}: {shape(i.shape)} {escape(i.dtype or '')} on {escape(i.device or '')}"
                             + (" requires_grad" if i.requires_grad else ""))
            else:
                lines.append(f"  {escape(i.name)} = {escape(repr(i.value))}")
    d = f.diagnosis
    if d is not None:
        lines.append("")
        lines.append(f"[bold]why:[/] {escape(d.message)}")
        if d.expected is not None or d.got is not None:
            lines.append(f"  expected: {escape(str(d.expected))}   got: {escape(str(d.got))}")
        if d.rule:
            lines.append(f"  [dim]rule: {escape(d.rule)}[/]")
        if d.hint:
            lines.append(f"  [green]fix:[/] {escape(d.hint)}")
    title = f"{f.phase} failed in {where}"
    return Panel("\n".join(lines), title=escape(title), title_align="left", border_style="red")


def _first_lines(text: str, n: int = 4) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:n]) + ("\n…" if len(lines) > n else "")


def summary(report: InspectReport) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    dtype, device = _common_kind(report)
    t.add_row("model", f"{escape(report.model)}  ({report.mode} mode, {escape(str(dtype))} on {escape(str(device))})")
    t.add_row("parameters", f"{report.total_params:,} ({report.trainable_params:,} trainable)")
    ins = [i for i in report.inputs if i.is_tensor]
    if ins:
        t.add_row("input", escape(", ".join(f"{i.name} {shape(i.shape)}" for i in ins)))
    outs = [o for o in report.outputs if o.is_tensor]
    if outs:
        t.add_row("output", escape(", ".join(f"{o.name + ' ' if o.name else ''}{shape(o.shape)}" for o in outs)))
    calls = len(report.calls)
    modules = len({c.path for c in report.calls})
    t.add_row("calls", f"{calls} module call{'s' * (calls != 1)} ({modules} module{'s' * (modules != 1)})")
    b = report.backward
    if b.ran:
        t.add_row("backward", f"L = {num(b.loss_value, 4)}  ({escape(b.loss)})")
    else:
        t.add_row("backward", f"[dim]skipped: {escape(b.skipped or '')}[/]")
    ran = [c for c in report.checks if c.passed is not None]
    failed = report.checks_failed
    check_text = f"{len(ran) - len(failed)} passed, " + (f"[bold red]{len(failed)} failed[/]" if failed else "0 failed")
    skipped = len(report.checks) - len(ran)
    t.add_row("formula checks", check_text + (f", {skipped} not checkable" if skipped else ""))
    errors, warnings = len(report.errors), len(report.warnings)
    t.add_row("problems", (f"[bold red]{errors} errors[/]" if errors else "0 errors") + ", "
              + (f"[yellow]{warnings} warnings[/]" if warnings else "0 warnings"))
    timing = report.timing
    if timing:
        parts = [f"{k.replace('_s', '')} {1e3 * v:.1f} ms" for k, v in timing.items()]
        t.add_row("time", ", ".join(parts))
    verdict = "[bold green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    t.add_row("result", verdict)
    return t


def render(report: InspectReport, depth: Optional[int] = None, title: Optional[str] = None) -> List[Any]:
    """Everything shown by ``layerlab inspect``, in order."""
    parts: List[Any] = []
    if title:
        parts.append(Text(title, style="bold"))
    parts.append(forward_table(report, depth))
    failure = failure_panel(report)
    if failure is not None:
        parts += [Text(""), failure]
    for part in (backward_table(report, depth), param_table(report) if report.backward.ran else None,
                 checks_table(report), problems_block(report)):
        if part is not None:
            parts += [Text(""), part]
    parts += [Text(""), Text("Summary", style="bold"), summary(report)]
    return parts
