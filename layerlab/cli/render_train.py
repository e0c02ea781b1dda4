"""Rich renderables for train-check reports (the only place that formats them for people)."""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence

from layerlab.text_safety import displays, escape
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import inputs as _inputs, verdict
from layerlab.cli.render_fold import BARS
from layerlab.train.report import TrainReport

_STATUS = {"ok": "[green]ok[/]", "unstable": "[bold red]unstable[/]", "not-learning": "[bold red]not learning[/]",
           "no-grad": "[bold red]no gradient[/]", "wrong-output": "[bold red]wrong output[/]",
           "unread-output": "[yellow]output not read[/]", "large-first-step": "[yellow]large first step[/]",
           "large-steps": "[yellow]large steps[/]",
           "not-in-optimizer": "[bold red]not in optimizer[/]", "zero-grad": "[bold red]zero gradient[/]",
           "requires-grad-false": "[yellow]frozen[/]"}


def loss_curve(values: Sequence[float], width: int = 40) -> str:
    """The loss curve in block characters, min to max on a log scale when every value is > 0 (``·``
    for NaN/Inf); unlike :func:`~layerlab.cli.render_fold.sparkline`, whose bars start at 0, a fall
    from 1.03 to 0.85 fills the whole height."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "·" * min(len(values), width)
    log = min(finite) > 0
    f = (lambda v: math.log(v)) if log else (lambda v: v)
    lo, hi = min(map(f, finite)), max(map(f, finite))
    n = len(values)
    picks = [values[min(n - 1, round(i * (n - 1) / max(width - 1, 1)))] for i in range(min(width, n))]
    out = []
    for v in picks:
        if not math.isfinite(v):
            out.append("·")
        elif hi == lo:
            out.append(BARS[0])
        else:
            out.append(BARS[min(len(BARS) - 1, int((f(v) - lo) / (hi - lo) * len(BARS)))])
    return "".join(out)


def _num(v: Optional[float]) -> str:
    if v is None:
        return "—"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.2e}" if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4) else f"{v:.3g}"


def _first_last(values: List[Optional[float]]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "—"
    return f"{_num(got[0])} → {_num(got[-1])}"


@displays
def report(r: TrainReport) -> List[Any]:
    """Header, the loss curve and its verdict, one row per parameter group, the findings, the verdict."""
    model = f"  {escape(r.model)}" if r.model != r.target else ""  # a module given in Python is named after its class
    parts: List[Any] = [Text.from_markup(f"[bold]train-check {escape(r.target)}[/]{model}")]
    parts.append(Text.from_markup("[dim]" + escape(
        f"inputs: {_inputs(r.inputs)}  mode: {r.mode}  device: {r.device}  {r.dtype}  seed {r.seed}") + "[/]"))
    target = f" ({r.target_source})" if r.loss == "model" else f", target: {r.target_source}"
    parts.append(Text.from_markup("[dim]" + escape(
        f"{r.optimizer}, {r.steps_run}/{r.steps} steps on one batch; loss: {r.loss} on {r.output}{target}") + "[/]"))
    if r.losses:
        parts.append(Text.from_markup(
            f"loss  {escape(_num(r.losses[0]))} {loss_curve(r.losses)} {escape(_num(r.losses[-1]))}   "
            f"[bold]{escape(r.fit.verdict)}[/]: {escape(r.fit.message)}"))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    # a long Hugging Face path wraps inside its column (at 80 columns it used to squeeze status to "…")
    table.add_column("module", overflow="fold", max_width=32)
    table.add_column("class", no_wrap=True, overflow="ellipsis", max_width=20)
    for title in ("params", "‖grad‖ first → last", "update/weight", "status"):
        table.add_column(title, justify="right" if title != "status" else "left", no_wrap=True)
    for g in r.groups:
        table.add_row(escape(g.label), escape(g.class_name), f"{g.numel:,}", _first_last(g.grad_norm),
                      _num(g.median_ratio), _STATUS.get(g.status, escape(g.status)))
    parts.append(table)
    parts.append(Text.from_markup("[dim]update/weight = median over the steps of ‖Δw‖ / ‖w‖ per module's own "
                                  "parameters (healthy ≈ 1e-3 … 1e-2); gradient norms per step in --json[/]"))
    for f in r.flags:
        mark = "[bold red]✗[/]" if f.severity == "error" else "[yellow]![/]"
        where = f.where or ""
        where = where if where.startswith("(") else f"({where})"  # "(loss)", "(root)" come in brackets
        parts.append(Text.from_markup(f"{mark} [bold]{escape(f.code)}[/] [dim]{escape(where)}[/] {escape(f.message)}"))
        if f.hint:
            parts.append(Text.from_markup(f"  [cyan]hint:[/] {escape(f.hint)}"))
    errors, warnings = len(r.errors), len(r.warnings)
    if errors:
        tail = f"{errors} failed check(s)" + (f", {warnings} warning(s)" if warnings else "")
    elif warnings:  # a warning may be about a parameter that did not learn: don't claim they all did
        tail = f"no check failed, {warnings} warning(s) above"
    else:
        tail = "the loss falls and every trainable parameter learns"
    parts.append(Text.from_markup(f"{verdict(r.ok)}: {escape(tail)}  [dim]({r.seconds:.2f} s)[/]"))
    return parts
