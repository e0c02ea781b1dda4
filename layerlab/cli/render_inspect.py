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
from layerlab.text_safety import displays, escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import Fit, fit_columns, shape
from layerlab.cli.render_fold import Row
from layerlab.cli.render_fold import rows as fold_rows
from layerlab.cli.render_fold import fold_paths, short_path, sparkline
from layerlab.cli.render_inspect_forward import (  # noqa: F401  (shape, module_cell: re-exported)
    _MODULE_MIN, FitForward, _inline, inline_len, common_kind, count, grad_fn_name, module_cell, name_cell, num,
    table, titled, visible_calls,
)
from layerlab.cli.render_inspect_params import param_table  # noqa: F401  (re-exported)
from layerlab.cli.render_inspect_wide import WideForward
from layerlab.cli.render_probes import probe_parts
from layerlab.probe.report import InspectReport, TensorInfo


#: Dropped, in this order, when the cut names leave too little room; gradient norms always stay.
_BACKWARD_DROP = ("#", "grad_fn")


def backward_table(report: InspectReport, depth: Optional[int] = None, width: Optional[int] = None) -> Optional[Group]:
    """Gradient norms per call; containers and folds as in the forward table (a fold's
    ``‖∂L/∂out‖`` is its last block's, ``‖∂L/∂in‖`` its first block's, ▁▃▆ each block's
    ``‖∂L/∂out‖``)."""
    if not report.backward.ran:
        return None
    body = []  # (row, [#, params, grad_fn, out, in, flags])
    for row in fold_rows(report, depth):
        call = row.call
        if call is None:  # an uncalled container
            body.append((row, [""] * 6))
            continue
        outs = [o for o in call.outputs if o.is_tensor]
        ins = [i for i in row.first.inputs if i.is_tensor and i.requires_grad]
        grad_fn = grad_fn_name(outs[0]) if outs else "—"
        flags = _grad_flags(outs + ins)
        params = sum(b.params for b in row.blocks) if row.is_fold else call.params
        body.append((row, [str(row.first.index), count(params), escape(grad_fn), _grads(outs), _grads(ins), flags]))
        if row.is_fold:  # each block's ‖∂L/∂out‖, on a line of its own
            norms = [b.tensor_outputs[0].grad.norm if b.tensor_outputs and b.tensor_outputs[0].grad else None
                     for b in row.blocks]
            body.append((Row("", row.depth + 1, caption=f"‖∂L/∂out‖ {sparkline(norms)}", fold=row), [""] * 6))
    titles = ["#", "module", "params", "grad_fn", "‖∂L/∂out‖", "‖∂L/∂in‖", ""]
    others = [t for t in titles if t != "module"]
    need = {t: max([len(t)] + [Text.from_markup(cells[k]).cell_len for _, cells in body]) for k, t in enumerate(others)}
    need["module"] = max([len("module")] + [name_cell(r).cell_len for r, _ in body if not r.caption]
                         + [inline_len(r) for r, _ in body if r.caption])
    need = {t: need[t] for t in titles}
    if not any(cells[-1] for _, cells in body):
        del need[""]
    short = max([len("module")] + [name_cell(r).cell_len - len(r.path) + len(short_path(r.path))
                                   for r, _ in body if not r.caption])
    flags = min(need.get("", 0), 12)
    soft = {"": flags, "grad_fn": min(need["grad_fn"], 12), "module": min(need["module"], short)}
    hard = {"": flags, "grad_fn": min(need["grad_fn"], 8), "module": min(need["module"], _MODULE_MIN)}
    widths, pad = fit_columns(need, width, soft=soft, hard=hard, drop=_BACKWARD_DROP)
    indent = 2 if widths["module"] >= soft["module"] else 1
    t = table("", pad=pad)
    for name in widths:
        if name == "module":
            t.add_column(name, no_wrap=True, overflow="ellipsis", max_width=widths[name])
        elif name == "grad_fn":
            t.add_column(name, no_wrap=True, overflow="ellipsis", max_width=widths[name])
        elif name == "":
            t.add_column(name, overflow="fold")
        else:
            t.add_column(name, justify="right", no_wrap=True, min_width=widths[name], style="dim" if name == "#" else None)
    shown: List[dict] = []
    for row, cells in body:
        if row.caption and _inline(shown, row, widths["module"], indent):
            continue
        named = dict(zip(others, cells))
        named["module"] = name_cell(row, widths["module"], indent)
        shown.append(named)
    for named in shown:
        t.add_row(*(named[n] for n in widths))
    legend = "gradient norms of the loss L, see the summary" + ("; ×N as in Forward, ▁▃▆ ‖∂L/∂out‖ per block" if any(r.is_fold for r, _ in body)
                                                              else "")
    return titled("Backward", legend, t)


def _grads(infos: List[TensorInfo]) -> str:
    shown = [num(i.grad.norm) for i in infos if i.grad is not None]
    if not shown:
        return "—" if not infos else "[dim]none[/]"
    return ", ".join(shown[:2]) + (f" [dim]+{len(shown) - 2}[/]" if len(shown) > 2 else "")


def _grad_flags(infos: List[TensorInfo]) -> str:
    bad = [i for i in infos if i.grad is not None and not i.grad.finite]
    return "[red]" + ", ".join(f"{i.name or 'out'}: {'NaN' if i.grad.nan else 'Inf'}" for i in bad) + "[/]" if bad else ""


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


def findings_block(report: InspectReport) -> Optional[Group]:
    """What matters, before the tables: the failure, failed formula checks, then errors and
    warnings grouped by cause (one line per cause, ``×N`` and where, the hint once)."""
    lines: List[Text] = []
    f = report.failure
    if f is not None:
        why = f.diagnosis.message if f.diagnosis is not None else _first_lines(f.message, 1)
        lines.append(Text.from_markup(f"[bold red]✗[/] [bold]{escape(f.phase)} failed {escape(_where(f))}[/]: "
                                      f"{escape(why)} [dim](details below the forward table)[/]"))
    failed = report.checks_failed
    if failed:
        where = ", ".join(c.path or "(root)" for c in failed[:3]) + (" …" if len(failed) > 3 else "")
        lines.append(Text.from_markup(f"[bold red]✗[/] [bold]{len(failed)} formula check{'s' * (len(failed) != 1)} "
                                      f"failed[/]: {escape(where)} [dim](see Formula checks)[/]"))
    groups: dict = {}
    for p in sorted(report.problems, key=lambda p: p.severity != "error"):  # errors first, order kept
        groups.setdefault((p.severity, p.code), []).append(p)
    for (severity, code), ps in groups.items():
        mark = "[bold red]✗[/]" if severity == "error" else "[yellow]⚠[/]"
        times = f" ×{len(ps)}" if len(ps) > 1 else ""
        lines.append(Text.from_markup(f"{mark} [bold]{escape(code)}{times}[/] {escape(compact_message(ps[0]))}"))
        for step in (ps[0].data or {}).get("evidence", [])[:4]:  # the provenance behind a silent/… finding
            lines.append(Text.from_markup(f"    [dim]evidence:[/] {escape(str(step))}"))
        others = [p.where for p in ps[1:] if p.where]
        if others:
            shown = ", ".join(others[:4]) + (f" … ({len(ps)} in all)" if len(others) > 4 else "")
            lines.append(Text.from_markup(f"    [dim]also at:[/] {escape(shown)}"))
        hint = next((p.hint for p in ps if p.hint), None)
        if hint:
            lines.append(Text.from_markup(f"    [cyan]hint:[/] {escape(hint)}"))
    if not lines:
        return None
    return Group(Text("Problems", style="bold"), *lines)


def problems_block(report: InspectReport) -> Optional[Group]:
    """The problems grouped by cause (kept under its old name; :func:`findings_block`)."""
    return findings_block(report)


def notes_block(report: InspectReport) -> Optional[Group]:
    """Findings that need no action, each with its reason (gradients zero by construction …)."""
    if not report.notes:
        return None
    lines = [Text.from_markup(f"[cyan]ℹ[/] [bold]{escape(n.code)}[/] {escape(compact_message(n))}") for n in report.notes]
    return Group(*lines)  # each line starts with ℹ: a heading would only cost a line


def compact_message(problem) -> str:
    """The message, with a list of paths from its data that differ only in a block number said
    once: ``encoder.layer.{0–11}.attention.self.key.bias`` rather than twelve paths."""
    text = problem.message
    for value in (problem.data or {}).values():
        if not (isinstance(value, list) and len(value) > 1 and all(isinstance(v, str) for v in value)):
            continue
        folded = fold_paths(value)
        if folded is None:
            continue
        for k in range(len(value), 1, -1):
            joined = ", ".join(value[:k])
            if joined in text:
                tail = f" … ({len(value)} in all)"
                span = joined + tail if joined + tail in text else joined
                if k == len(value) or span.endswith(tail):
                    text = text.replace(span, folded)
                break
    return text


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
        if d.expected is not None or d.got is not None:  # an unknown side is left out, not shown as None
            sides = [f"{k}: {escape(str(v))}" for k, v in (("expected", d.expected), ("got", d.got)) if v is not None]
            lines.append("  " + "   ".join(sides))
        rule_id = getattr(d, "rule_id", None)  # the registered rule that answered: one grep finds it
        tag = f"(rule {rule_id})" if rule_id else ""
        if d.rule and tag and len(d.rule) + len(tag) < 80:  # on the rule's line when both fit on one
            lines.append(f"  [dim]rule: {escape(d.rule)} {escape(tag)}[/]")
        else:
            lines += [f"  [dim]{escape(text)}[/]" for text in (f"rule: {d.rule}" if d.rule else "", tag) if text]
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


#: How the oracles a fixed copy passed are named (layerlab.engine.oracles).
_CHECK_NAMES = {"backward": "backward runs", "batch": "samples stay independent",
                "sizes": "other batch and sequence sizes", "causal": "stays causal"}


@displays
def verification_text(v) -> str:
    """One sentence: what re-running with the fix on a copy of the model gave."""
    out = ", ".join(shape(o) for o in v.outputs)
    checked = f"; checked: {', '.join(_CHECK_NAMES.get(c, c) for c in v.checks)}" if v.checks else ""
    if v.status in ("runs", "implausible"):
        but = f", but {v.note} — not a verified fix" if v.status == "implausible" else checked
        if not v.then:
            return f"with this fix the model runs → output {out}{but}"
        nexts = "; ".join(f"then {t.where} fails: {t.message} — also: {t.fix.code}" for t in v.then)
        return f"{nexts}; with these {len(v.steps)} fixes the model runs → output {out}{but}"
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
    """A few lines: the model and its size, input → output, calls and formula checks, the loss,
    the time, and the verdict with the problem counts."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    dtype, device = common_kind(report)
    trainable = ("all trainable" if report.trainable_params == report.total_params
                 else f"{report.trainable_params:,} trainable")
    t.add_row("model", f"{escape(report.model)}  ({report.mode} mode, {escape(str(dtype))} on {escape(str(device))}), "
                       f"{report.total_params:,} parameters ({trainable})")
    ins = ", ".join(f"{i.name} {shape(i.shape)}" for i in report.inputs if i.is_tensor)
    outs = ", ".join(f"{o.name + ' ' if o.name else ''}{shape(o.shape)}" for o in report.outputs if o.is_tensor)
    if ins or outs:
        t.add_row("in → out", escape(f"{ins or '—'} → {outs or '—'}"))
    calls = len(report.calls)
    modules = len({c.path for c in report.calls})
    call_text = f"{calls} module call{'s' * (calls != 1)} ({modules} module{'s' * (modules != 1)})"
    if report.checks:
        ran = [c for c in report.checks if c.passed is not None]
        failed = report.checks_failed
        checks = f"{len(ran) - len(failed)} passed, " + (f"[bold red]{len(failed)} failed[/]" if failed else "0 failed")
        skipped = len(report.checks) - len(ran)
        t.add_row("calls", call_text)
        t.add_row("formula checks", checks + (f", {skipped} not checked" if skipped else ""))
    else:
        t.add_row("calls", call_text + ", no formula check applies")
    b = report.backward
    if b.ran:
        t.add_row("backward", f"L = {num(b.loss_value, 4)}  ({escape(b.loss)})")
    else:
        t.add_row("backward", f"[dim]skipped: {escape(b.skipped or '')}[/]")
    if report.ops is not None:
        t.add_row("ops", f"{len(report.ops)} op{'s' * (len(report.ops) != 1)} of the model's own code recorded")
    timing = report.timing
    if timing:
        parts = [f"{k.replace('_s', '')} {1e3 * v:.1f} ms" for k, v in timing.items()]
        t.add_row("time", ", ".join(parts))
    errors, warnings = len(report.errors) + (report.failure is not None), len(report.warnings)
    counts = ((f"[bold red]{errors} error{'s' * (errors != 1)}[/]" if errors else "0 errors")
              + (" (the failure above)" if report.failure is not None and errors == 1 else "") + ", "
              + (f"[yellow]{warnings} warnings[/]" if warnings else "0 warnings")
              + (f", {len(report.notes)} note{'s' * (len(report.notes) != 1)}" if report.notes else ""))
    verdict = "[bold green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    t.add_row("result", f"{verdict}  ({counts})")
    return t


@displays
def render(report: InspectReport, depth: Optional[int] = None, title: Optional[str] = None,
           wide: bool = False) -> List[Any]:
    """Everything shown by ``layerlab inspect``, in order: the problems that matter (grouped by
    cause), the forward table, the failure panel, backward, parameters, formula checks, notes,
    summary. Each table lays itself out for the width it is printed at (``wide``: the forward
    table with every field in its own column, a :class:`WideForward`: print it on a console
    that wide)."""
    parts: List[Any] = []
    if title:
        parts.append(Text(title, style="bold"))
    findings = findings_block(report)
    if findings is not None:
        parts += [findings, Text("")]
    parts.append(WideForward(report, depth) if wide else FitForward(report, depth))
    failure = failure_panel(report)
    if failure is not None:
        parts += [Text(""), failure]
    tables = [Fit(lambda w: backward_table(report, depth, w)) if report.backward.ran else None,
              Fit(lambda w: param_table(report, depth, w)) if report.backward.ran and report.params else None,
              checks_table(report), *probe_parts(report), notes_block(report)]
    for part in tables:
        if part is not None:
            parts += [Text(""), part]
    parts += [Text(""), Text("Summary", style="bold"), summary(report)]
    return parts
