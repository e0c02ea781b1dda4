"""The forward table of ``layerlab inspect``: the default one, laid out to fit the terminal, and
the ``--wide`` one with every field in its own column. Also the cell formatters the other
inspect tables share (numbers, counts, module names)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, List, Optional

from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import shape
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


def grad_fn_name(info: TensorInfo) -> str:
    if info.grad_fn:
        name = info.grad_fn
        return name[: -len("Backward0")] if name.endswith("Backward0") else name
    return "leaf" if info.requires_grad else "—"


def table(title: str, pad: int = 2) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                 header_style="bold", pad_edge=False, padding=(0, 0, 0, pad), show_edge=False)


def module_cell(call: CallRecord, max_width: Optional[int] = None, indent: int = 2) -> Text:
    """``  path Class`` indented ``indent`` cells per level. Cut to ``max_width`` cells in this
    order: the class name down to 8 cells (``Multihe…``), the path from the left down to 8 (the
    leaf name and ``(call N)`` stay; the indentation shows the parents), the class name down to 3;
    what is still too long ends in an ellipsis."""
    if call.path == "":
        text = Text(call.class_name if call.call == 1 else f"{call.class_name} (call {call.call})", style="bold")
    else:
        pad, label, cls = " " * indent * call.depth, call.label, call.class_name
        if max_width is not None and len(pad) + len(label) + 1 + len(cls) > max_width:
            label, cls = _cut(label, cls, max_width - len(pad) - 1)
        text = Text(pad + label)
        text.append(f" {cls}", style="dim")
    if call.status == "raised":
        text.stylize("bold red")
    elif call.status == "unfinished":
        text.stylize("red")
    return text


def _cut(label: str, cls: str, room: int) -> tuple:
    """Shorten ``label`` (from the left) and ``cls`` (from the right) to ``room`` cells together."""

    def shrink(text: str, over: int, floor: int, left: bool) -> tuple:
        keep = max(min(len(text), floor), len(text) - over)
        if keep < len(text):
            over -= len(text) - keep
            text = "…" + text[len(text) - keep + 1:] if left else text[: keep - 1] + "…"
        return text, over

    over = len(label) + len(cls) - room
    cls, over = shrink(cls, over, 8, left=False)
    label, over = shrink(label, over, 8, left=True)
    cls, over = shrink(cls, over, 3, left=False)
    return label, cls


def stat(x: Optional[float]) -> str:
    """A statistic to 3 significant digits, fixed or exponent notation, whichever is shorter:
    ``0.165``, ``-1.07e-4`` (not ``-0.000107``), ``-8.73e-10``, ``1.23e4``."""
    text = num(x, 3)
    if x is None or x == 0 or not math.isfinite(x):
        return text
    mantissa, exp = f"{x:.2e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    short = f"{mantissa}e{int(exp)}"
    return short if len(short) < len(text) else text


def pct_zeros(fraction: float) -> str:
    """Fraction of exact zeros as a percentage; never rounds a few zeros to ``0`` or all-but-a-few to 100%."""
    if fraction == 0:
        return "0"
    if fraction < 0.005:
        return "<1%"
    if fraction < 1 and fraction > 0.995:
        return ">99%"
    return f"{100 * fraction:.0f}%"


def _flags(info: TensorInfo, common: tuple, grad: Optional[bool] = None) -> str:
    """NaN/Inf counts, dtype·device where it differs from the common one, and ``no grad`` /
    ``requires grad`` where requires_grad differs from most outputs (``grad``)."""
    out = []
    s = info.stats
    if s is not None and s.nan:
        out.append(f"[red]{s.nan} NaN[/]")
    if s is not None and s.inf:
        out.append(f"[red]{s.inf} Inf[/]")
    if info.dtype and (info.dtype, info.device) != common:
        out.append(f"[yellow]{escape(info.dtype)}·{escape(info.device or '')}[/]")
    if grad is not None and info.is_tensor and info.requires_grad != grad:
        out.append("[yellow]requires grad[/]" if info.requires_grad else "[yellow]no grad[/]")
    return " ".join(out)


def common_kind(report: InspectReport) -> tuple:
    kinds = Counter((t.dtype, t.device) for c in report.calls for t in (*c.outputs, *c.inputs)
                    if t.dtype and t.is_tensor and (t.dtype.startswith(("float", "bfloat")) or not c.outputs))
    return kinds.most_common(1)[0][0] if kinds else (None, None)


def _common_grad(report: InspectReport) -> Optional[bool]:
    """``requires_grad`` of most tensor outputs (``None`` when there are none)."""
    seen = Counter(o.requires_grad for c in report.calls for o in c.tensor_outputs)
    return seen.most_common(1)[0][0] if seen else None


def visible_calls(report: InspectReport, depth: Optional[int]) -> List[CallRecord]:
    return [c for c in report.calls if depth is None or c.depth <= depth or c.status == "raised"]


def _shown_outputs(call: CallRecord) -> List[TensorInfo]:
    """One row per tensor output; a call that returned no tensor shows its first value."""
    return call.tensor_outputs or call.outputs[:1]


#: The module column keeps at least this many cells before the flags column starts to wrap.
_MODULE_MIN = 12  # below this a name says nothing; the stats columns are never cut
_STATS = ("mean", "std", "min", "max", "zeros")


def forward_table(report: InspectReport, depth: Optional[int] = None, width: Optional[int] = None,
                  wide: bool = False) -> Table:
    """One row per module call (a sub-row per further tensor output).

    The default table fits ``width`` cells: index, module (cut with an ellipsis when needed),
    first tensor input (``+N`` more), output, stats and a flags column (NaN/Inf, an unusual
    dtype·device, ``no grad``). ``wide=True`` gives every field its own column instead.
    """
    if wide:
        return _wide_table(report, depth)
    common, grad = common_kind(report), _common_grad(report)
    rows = []  # (call, output name of a sub-row or None, the cells but the module); (None, op, cells) for an op
    ops = visible_ops(report, depth)
    for call in visible_calls(report, depth):
        while ops and ops[0].after_call <= call.index:
            rows.append(_op_row(report, ops.pop(0)))
        outs = _shown_outputs(call)
        first = outs[0] if outs else None
        rows.append((call, None, [str(call.index), _input_cell(call),
                                  *_tensor_cells(call, first, common, grad, head=True)]))
        for extra in outs[1:]:
            rows.append((call, extra.name, ["", "", *_tensor_cells(call, extra, common, grad, head=False)]))
    rows += [_op_row(report, op) for op in ops]

    def module(call: Optional[CallRecord], sub: Any, max_width: Optional[int] = None, indent: int = 2) -> Text:
        if call is None:
            return op_cell(report, sub, indent)
        if sub is None:
            return module_cell(call, max_width, indent)
        return Text(" " * indent * (call.depth + 1) + f"└ {sub}", style="dim")

    cells = [r[2] for r in rows]
    headers = ["#", "input", "output", *_STATS, ""]
    widths = [max(_width(cells, i), len(h)) for i, h in enumerate(headers)]
    with_flags = widths[-1] > 0 and any(r[-1] for r in cells)
    module_need = max([len("module")] + [module(c, sub).cell_len for c, sub, _ in rows if c is not None]
                      + [min(module(c, sub).cell_len, 40) for c, sub, _ in rows if c is None])
    module_w, pad, indent = module_need, 2, 2
    if width is not None:  # 2 cells of padding as in the other tables, 1 rather than cut the module names
        ncols = len(headers) + 1 - (0 if with_flags else 1)
        for pad in (2, 1):
            rest = sum(widths[:-1]) + (widths[-1] if with_flags else 0) + (ncols - 1) * (1 + pad)
            if module_need <= width - rest:
                break
        module_w = max(min(module_need, width - rest), min(module_need, _MODULE_MIN))
        if module_w < module_need:  # names get cut: first, one cell of indentation per level
            indent = 1
    t = table("Forward", pad=pad)
    t.add_column("#", justify="right", style="dim", no_wrap=True)
    t.add_column("module", overflow="ellipsis", no_wrap=True, max_width=module_w)
    t.add_column("input", no_wrap=True, min_width=widths[1])
    t.add_column("output", no_wrap=True, min_width=widths[2])
    for i, name in enumerate(_STATS, start=3):
        t.add_column(name, justify="right", no_wrap=True, min_width=widths[i])
    if with_flags:
        t.add_column("", overflow="fold")
    for call, sub, row in rows:
        t.add_row(row[0], module(call, sub, module_w, indent), *row[1:] if with_flags else row[1:-1])
    return t


def visible_ops(report: InspectReport, depth: Optional[int]) -> list:
    """The recorded ops (``--ops``) shown at this depth: an op sits one level below its module."""
    if not report.ops:
        return []
    return [op for op in report.ops
            if depth is None or op.status == "raised" or _op_depth(report, op) <= depth]


def _op_depth(report: InspectReport, op) -> int:
    return report.calls[op.call].depth + 1 if op.call is not None and op.call < len(report.calls) else 0


def op_cell(report: InspectReport, op, indent: int = 2) -> Text:
    """``    · x.transpose(1, 2)`` one level below the module call it ran in."""
    from layerlab.probe.context import op_text

    text = Text(" " * indent * _op_depth(report, op) + "· " + op_text(op), style="cyan",
                overflow="fold", no_wrap=False)  # an op wraps in its cell rather than lose its arguments
    if op.status == "raised":
        text.stylize("bold red")
    if op.source:  # the file's name and line: the directory is in --json
        text.append(f" {op.source.replace(chr(92), '/').rsplit('/', 1)[-1]}", style="dim")
    return text


def _op_row(report: InspectReport, op) -> tuple:
    ins = op.inputs
    first = escape(shape(ins[0].shape)) + (f" [dim]+{len(ins) - 1}[/]" if len(ins) > 1 else "") if ins else "—"
    if op.status == "raised":
        out = "[red]raised[/]"
    else:
        out = escape(shape(op.outputs[0])) + (f" [dim]+{len(op.outputs) - 1}[/]" if len(op.outputs) > 1 else "")
    return None, op, ["", first, out, "", "", "", "", "", ""]


def _width(rows: List[list], column: int) -> int:
    return max((Text.from_markup(r[column]).cell_len for r in rows if isinstance(r[column], str)), default=0)


def _input_cell(call: CallRecord) -> str:
    """The first tensor input's shape, ``+N`` when there are N more (all of them: ``--wide``)."""
    ins = call.tensor_inputs
    if not ins:
        return "—"
    return escape(shape(ins[0].shape)) + (f" [dim]+{len(ins) - 1}[/]" if len(ins) > 1 else "")


def _tensor_cells(call: CallRecord, info: Optional[TensorInfo], common: tuple, grad: Optional[bool],
                  head: bool) -> list:
    """output, mean, std, min, max, zeros, flags."""
    if call.status != "ok" and head:
        return ["[red]raised[/]" if call.status == "raised" else "[red]unfinished[/]"] + [""] * 6
    if info is None:
        return ["—"] + [""] * 6
    if not info.is_tensor:
        return [escape(repr(info.value))] + [""] * 6
    s = info.stats
    prefix = f"{info.name} " if head and info.name else ""
    stats = [""] * 5 if s is None else [stat(s.mean), stat(s.std), stat(s.min), stat(s.max), pct_zeros(s.zeros)]
    return [escape(prefix + shape(info.shape)), *stats, _flags(info, common, grad)]


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


class FitForward:
    """The default forward table, laid out for the width it is printed at."""

    def __init__(self, report: InspectReport, depth: Optional[int]) -> None:
        self.report, self.depth = report, depth

    def __rich_console__(self, console, options):
        yield forward_table(self.report, self.depth, width=options.max_width)

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        table = forward_table(self.report, self.depth, width=options.max_width)
        return Measurement.get(console, options, table)
