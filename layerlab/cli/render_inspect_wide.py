"""The ``--wide`` forward table of ``layerlab inspect``: every field of every call in its own column
(all tensor inputs, dtype, device, requires_grad, grad_fn, params, NaN, Inf), nothing folded or cut:
for wide terminals, ``less -S`` and ``--svg``/``--html``."""

from __future__ import annotations

from typing import Any, Optional

from layerlab.text_safety import escape
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import shape
from layerlab.cli.render_inspect_forward import (
    _shown_outputs, common_kind, pct_zeros, stat, table, visible_calls,
)
from layerlab.probe.report import CallRecord, InspectReport, TensorInfo

_WIDE_COLUMNS = ("#", "path", "class", "inputs", "output", "dtype", "device", "requires_grad", "grad_fn",
                 "params", "mean", "std", "min", "max", "zeros", "NaN", "Inf")
_RIGHT = {"#", "params", "mean", "std", "min", "max", "zeros", "NaN", "Inf"}


def _wide_table(report: InspectReport, depth: Optional[int]) -> Table:
    """``--wide``: every field of every call in its own column; a sub-row per further tensor output."""
    common = common_kind(report)
    t = table("Forward")
    for name in _WIDE_COLUMNS:
        t.add_column(name, justify="right" if name in _RIGHT else "left", no_wrap=True,
                     style="dim" if name == "#" else None)
    for call in visible_calls(report, depth):
        outs = _shown_outputs(call)
        path = Text("  " * call.depth + call.label)
        if call.status == "raised":
            path.stylize("bold red")
        elif call.status == "unfinished":
            path.stylize("red")
        params = f"{call.params:,}"
        if call.trainable != call.params:
            params += f" [dim]({call.trainable:,} trainable)[/]"
        head = [str(call.index), path, escape(call.class_name), _inputs_cell(call, common)]
        if call.status != "ok":
            status = "[red]raised[/]" if call.status == "raised" else "[red]unfinished[/]"
            t.add_row(*head, status, "", "", "", "", params, *[""] * 7)
            continue
        for k, info in enumerate(outs or [None]):
            cells = _wide_tensor_cells(info)
            if k == 0:
                t.add_row(*head, cells[0], *cells[1:5], params, *cells[5:])
            else:
                t.add_row("", Text("  " * call.depth + "  └", style="dim"), "", "", cells[0], *cells[1:5], "",
                          *cells[5:])
    return t


def _inputs_cell(call: CallRecord, common: tuple) -> str:
    """Every tensor input: ``(8, 3, 32, 32)``, or ``name (shape)`` each when there are several;
    the dtype (device) added where it differs from the common one."""
    ins = call.tensor_inputs
    if not ins:
        return "—"
    parts = []
    for i in ins:
        text = escape(f"{i.name} {shape(i.shape)}" if len(ins) > 1 and i.name else shape(i.shape))
        if i.dtype and i.dtype != common[0]:
            text += f" [yellow]{escape(i.dtype)}[/]"
        if i.device and i.device != common[1]:
            text += f" [yellow]{escape(i.device)}[/]"
        parts.append(text)
    return ", ".join(parts)


def _wide_tensor_cells(info: Optional[TensorInfo]) -> list:
    """output, dtype, device, requires_grad, grad_fn, mean, std, min, max, zeros, NaN, Inf."""
    if info is None:
        return ["—"] + [""] * 11
    if not info.is_tensor:
        return [escape(repr(info.value))] + [""] * 11
    out = escape(f"{info.name} {shape(info.shape)}" if info.name else shape(info.shape))
    meta = [escape(info.dtype or "—"), escape(info.device or "—"), str(info.requires_grad),
            escape(info.grad_fn or "—")]
    s = info.stats
    if s is None:
        return [out, *meta] + [""] * 7
    bad = lambda n: f"[red]{n}[/]" if n else "0"  # noqa: E731
    return [out, *meta, stat(s.mean), stat(s.std), stat(s.min), stat(s.max), pct_zeros(s.zeros), bad(s.nan), bad(s.inf)]


class WideForward:
    """The ``--wide`` forward table. It is meant to be printed whole: :meth:`width_needed` says
    how many cells the console must have for no column to be squeezed."""

    def __init__(self, report: InspectReport, depth: Optional[int]) -> None:
        self.table = _wide_table(report, depth)

    def width_needed(self, console: Any) -> int:
        from rich.measure import Measurement

        return Measurement.get(console, console.options.update_width(100_000), self.table).maximum

    def __rich_console__(self, console, options):
        yield self.table

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        return Measurement.get(console, options, self.table)
