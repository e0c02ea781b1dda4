"""Rich renderables for an :class:`~layerlab.probe.report.InspectReport` (no computation here).

Tables are laid out to read at 100 columns: the forward table (one row per module call, one
sub-row per extra element of a tuple/dict output: first input, output, value statistics, and
flags for NaN/Inf, an unusual dtype·device or an output whose requires_grad differs from the
rest), the backward table (gradient norms per call), parameter gradients, formula checks,
problems, notes (findings that need no action, each with its reason), the failure panel and a
summary. ``--wide`` swaps in a forward table with every field
in its own column (all tensor inputs, dtype, device, requires_grad, grad_fn, params, NaN, Inf).
"""

from __future__ import annotations

from typing import Any, List, Optional

from rich.console import Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import shape
from layerlab.cli.render_inspect_forward import (  # noqa: F401  (WideForward, shape: re-exported)
    FitForward, WideForward, common_kind, count, grad_fn_name, module_cell, num, table,
    visible_calls,
)
from layerlab.probe.report import InspectReport, TensorInfo


def backward_table(report: InspectReport, depth: Optional[int] = None) -> Optional[Table]:
    if not report.backward.ran:
        return None
    t = table("Backward  (gradient norms of the loss L, see the summary)")
    t.add_column("#", justify="right", style="dim")
    t.add_column("module", overflow="ellipsis", no_wrap=True, max_width=40)
    t.add_column("params", justify="right")
    t.add_column("grad_fn", overflow="ellipsis", max_width=18, no_wrap=True)
    t.add_column("‖∂L/∂out‖", justify="right")
    t.add_column("‖∂L/∂in‖", justify="right")
    t.add_column("", overflow="fold")
    for call in visible_calls(report, depth):
        outs = [o for o in call.outputs if o.is_tensor]
        ins = [i for i in call.inputs if i.is_tensor and i.requires_grad]
        grad_fn = grad_fn_name(outs[0]) if outs else "—"
        t.add_row(str(call.index), module_cell(call), count(call.params), escape(grad_fn), _grads(outs),
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
    t = table("Parameters")
    t.add_column("parameter", overflow="fold", max_width=40)
    t.add_column("shape")
    t.add_column("‖w‖", justify="right")
    t.add_column("‖grad‖", justify="right")
    t.add_column("‖grad‖/‖w‖", justify="right")
    t.add_column("", overflow="fold")
    for p in report.params:
        flags = " ".join(f"[{_PARAM_FLAG_STYLE.get(f, 'yellow')}]{f}[/]" for f in p.flags)
        if p.expected:  # small or zero by construction: see the notes
            flags = "[dim]" + " ".join(p.flags) + " (expected)[/]"
        if not p.trainable:
            flags = "[dim]frozen[/]"
        t.add_row(escape(p.name), shape(p.shape), num(p.norm),
                  num(p.grad_norm) if report.backward.ran and p.trainable else "—", num(p.ratio), flags)
    return t


def checks_table(report: InspectReport) -> Optional[Table]:
    if not report.checks:
        return None
    t = table("Formula checks  (explain-shape arithmetic vs. what came out)")
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


def notes_block(report: InspectReport) -> Optional[Group]:
    """Findings that need no action, each with its reason (gradients zero by construction …)."""
    if not report.notes:
        return None
    lines = [Text.from_markup(f"[cyan]ℹ[/] [bold]{escape(n.code)}[/] {escape(n.message)}") for n in report.notes]
    return Group(Text("Notes", style="bold"), *lines)


def failure_panel(report: InspectReport) -> Optional[Panel]:
    f = report.failure
    if f is None:
        return None
    lines = [f"[red]{escape(f.exception)}: {escape(_first_lines(f.message))}[/]"]
    if f.chain:
        lines.append("[dim]call chain:[/] " + escape(" → ".join(f.chain)))
    if f.op is not None:
        lines.append(f"[bold]op that raised:[/] {escape(f.op.code or f.op.op)}"
                     + (f"  [dim]({escape(f.op.source)})[/]" if f.op.source else ""))
    tensors = [i for i in f.inputs] if f.op is None else []
    if tensors:
        lines.append("[bold]inputs of the failing call[/]")
        for i in tensors:
            if i.is_tensor:
                lines.append(f"  {escape(i.name)}: {shape(i.shape)} {escape(i.dtype or '')} on {escape(i.device or '')}"
                             + (" requires_grad" if i.requires_grad else ""))
            else:
                lines.append(f"  {escape(i.name)} = {escape(repr(i.value))}")
    if any(o.steps for o in f.origins):
        lines.append("[bold]where the inputs came from[/]")
        lines += [f"  {escape(o.text)}" for o in f.origins]
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
        if d.verified is not None:
            lines.append(f"  [bold]verified on a copy:[/] {escape(verification_text(d.verified))}")
        for alt in d.alternatives:
            lines.append(f"  [dim]or: {escape(alt)}[/]")
    else:
        lines.append("")
        lines.append("[dim]no rule recognises this failure: torch's message above is all layerlab can say[/]")
    title = f"{f.phase} failed {_where(f)}"
    return Panel("\n".join(lines), title=escape(title), title_align="left", border_style="red")


def _where(f) -> str:
    module = (f"{f.path} ({f.class_name})" if f.path else f.class_name) if f.class_name else "outside any module"
    if f.op is not None:
        return f"at {f.op.op} ({f.op.source}) in {module}" if f.op.source else f"at {f.op.op} in {module}"
    return f"in {module}"


def verification_text(v) -> str:
    """One sentence: what re-running with the fix on a copy of the model gave."""
    out = ", ".join(shape(o) for o in v.outputs)
    if v.status == "runs":
        if not v.then:
            return f"with this fix the model runs → output {out}"
        nexts = "; ".join(f"then {t.where} fails: {t.message} — also: {t.fix.code}" for t in v.then)
        return f"{nexts}; with these {len(v.steps)} fixes the model runs → output {out}"
    if v.status == "still-fails":
        done = "; ".join(f"then {t.where} fails: {t.message} — also: {t.fix.code}" for t in v.then if t.fix)
        last = v.then[-1] if v.then else None
        tail = f"then {last.where} fails: {last.message}" if last is not None else "it still fails"
        why = f" ({v.note})" if v.note else "; no rule has a mechanical fix for that"
        return (done + "; " if done else "") + tail + why
    return f"not verified: {v.note}"


def _first_lines(text: str, n: int = 4) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:n]) + ("\n…" if len(lines) > n else "")


def summary(report: InspectReport) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    dtype, device = common_kind(report)
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
    t.add_row("formula checks", check_text + (f", {skipped} not checked" if skipped else ""))
    errors, warnings = len(report.errors) + (report.failure is not None), len(report.warnings)
    t.add_row("problems", (f"[bold red]{errors} error{'s' * (errors != 1)}[/]" if errors else "0 errors")
              + (" (the failure above)" if report.failure is not None and errors == 1 else "") + ", "
              + (f"[yellow]{warnings} warnings[/]" if warnings else "0 warnings")
              + (f", {len(report.notes)} note{'s' * (len(report.notes) != 1)}" if report.notes else ""))
    if report.ops is not None:
        t.add_row("ops", f"{len(report.ops)} op{'s' * (len(report.ops) != 1)} of the model's own code recorded")
    timing = report.timing
    if timing:
        parts = [f"{k.replace('_s', '')} {1e3 * v:.1f} ms" for k, v in timing.items()]
        t.add_row("time", ", ".join(parts))
    verdict = "[bold green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    t.add_row("result", verdict)
    return t


def render(report: InspectReport, depth: Optional[int] = None, title: Optional[str] = None,
           wide: bool = False) -> List[Any]:
    """Everything shown by ``layerlab inspect``, in order (``wide``: the forward table with every
    field in its own column, a :class:`WideForward`: print it on a console that wide)."""
    parts: List[Any] = []
    if title:
        parts.append(Text(title, style="bold"))
    parts.append(WideForward(report, depth) if wide else FitForward(report, depth))
    failure = failure_panel(report)
    if failure is not None:
        parts += [Text(""), failure]
    for part in (backward_table(report, depth), param_table(report) if report.backward.ran else None,
                 checks_table(report), problems_block(report), notes_block(report)):
        if part is not None:
            parts += [Text(""), part]
    parts += [Text(""), Text("Summary", style="bold"), summary(report)]
    return parts
