"""The forward table of ``layerlab inspect``: the default one, laid out to fit the terminal, and
the ``--wide`` one with every field in its own column. Also the cell formatters the other
inspect tables share (numbers, counts, module names)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, List, Optional

from rich import box
from rich.console import Group
from layerlab.text_safety import escape
from rich.table import Table
from rich.text import Text

from layerlab.cli.render_common import fit_columns, shape
from layerlab.cli.render_fold import Row, container_summary, short_path, sparkline
from layerlab.cli.render_fold import rows as fold_rows
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
    return Table(title=title or None, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                 header_style="bold", pad_edge=False, padding=(0, 0, 0, pad), show_edge=False)


def titled(title: str, legend: str, body: Table) -> Group:
    """The title (bold) and its legend (dim) on lines of their own above ``body``: a table's
    own title would wrap at the table's width, however wide the terminal."""
    return Group(Text.assemble((title, "bold"), (f"  ({legend})" if legend else "", "dim")), body)


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
            leaf, suffix = short_path(call.path), call.label[len(call.path):]  # the parents are the indentation
            label = leaf + suffix
            if len(pad) + len(label) + 1 + len(cls) > max_width:
                numbered = leaf[-1:].isdigit()  # h.10: the number is the name; word_embeddings: its start
                label, cls = _cut(leaf, cls, max_width - len(pad) - 1 - len(suffix), left=numbered)
                label += suffix
        text = Text(pad + label)
        text.append(f" {cls}", style="dim")
    if call.status == "raised":
        text.stylize("bold red")
    elif call.status == "unfinished":
        text.stylize("red")
    return text


def _cut(label: str, cls: str, room: int, left: bool = True) -> tuple:
    """Shorten ``label`` (from the left, or the right when not ``left``) and ``cls`` (from the
    right) to ``room`` cells together."""

    def shrink(text: str, over: int, floor: int, left: bool) -> tuple:
        keep = max(min(len(text), floor), len(text) - over)
        if keep < len(text):
            over -= len(text) - keep
            text = "…" + text[len(text) - keep + 1:] if left else text[: keep - 1] + "…"
        return text, over

    over = len(label) + len(cls) - room
    cls, over = shrink(cls, over, 8, left=False)
    label, over = shrink(label, over, 8, left=left)
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


#: The module column keeps at least this many cells before a column is dropped; below this a
#: name says nothing. Number columns are never cut (see render_common.fit_columns).
_MODULE_MIN = 12
_STATS = ("mean", "std", "min", "max", "zeros")
#: What goes first when even the cut names leave too little room (at 80 columns, typically):
#: the row index (only for cross-reading with the formula checks), then the share of zeros,
#: then the input shape (the previous row's output, mostly). Output, mean, std, min, max and
#: the flags (NaN/Inf) always stay.
_FORWARD_DROP = ("#", "zeros", "input")


def name_cell(row: Row, max_width: Optional[int] = None, indent: int = 2) -> Text:
    """The module column of any :class:`~layerlab.cli.render_fold.Row`: a call
    (:func:`module_cell`), an uncalled container (``h  12 × GPT2Block``) or a fold of identical
    blocks (``h.0–11 GPT2Block ×12``: the ``×12`` is never cut)."""
    pad = " " * indent * row.depth
    if row.caption:
        return Text(pad + "└ " + row.caption, style="dim")
    if not row.is_fold and not row.is_container:
        return module_cell(row.call, max_width, indent)
    if row.is_container:
        label, cls, suffix = row.path, container_summary(row), ""
    else:
        label, cls, suffix = row.path, row.call.class_name, f" ×{len(row.blocks)}"
    if max_width is not None and len(pad) + len(label) + 1 + len(cls) + len(suffix) > max_width:
        label = short_path(label)
        if len(pad) + len(label) + 1 + len(cls) + len(suffix) > max_width:
            label, cls = _cut(label, cls, max_width - len(pad) - 1 - len(suffix))
    text = Text(pad + label)
    text.append(f" {cls}", style="dim")
    if suffix:
        text.append(suffix, style="bold")
    return text


def forward_table(report: InspectReport, depth: Optional[int] = None, width: Optional[int] = None,
                  wide: bool = False) -> Any:
    """One row per module call (a sub-row per further tensor output), uncalled containers as their
    own level and runs of identical blocks folded (see :mod:`~layerlab.cli.render_fold`).

    Laid out for ``width`` cells: names are cut with an ellipsis down to a floor, then whole
    columns are dropped (``_FORWARD_DROP``); a number is never cut. ``wide=True`` gives the
    ``--wide`` table instead (every field in its own column).
    """
    if wide:
        from layerlab.cli.render_inspect_wide import _wide_table

        return _wide_table(report, depth)
    common, grad = common_kind(report), _common_grad(report)
    lines = []  # (row or None, op or output name of a sub-row or None, [#, input, (name, shape), stats…, flags])
    ops = visible_ops(report, depth)
    for row in fold_rows(report, depth):
        call = row.call
        while ops and call is not None and ops[0].after_call <= call.index:
            lines.append(_op_row(report, ops.pop(0)))
        if call is None:  # an uncalled container
            lines.append((row, None, ["", "", ("", "")] + [""] * 6))
            continue
        outs = _shown_outputs(call)
        first = outs[0] if outs else None
        cells = [str(row.first.index), _input_cell(row.first), *_tensor_cells(call, first, common, grad, head=True)]
        lines.append((row, None, cells))
        if row.is_fold:  # each block's output std, on a line of its own: it needs no column
            stds = [b.tensor_outputs[0].stats.std if b.tensor_outputs and b.tensor_outputs[0].stats else None
                    for b in row.blocks]
            lines.append((Row("", row.depth + 1, caption=f"std {sparkline(stds)}", fold=row), None,
                          ["", "", ("", "")] + [""] * 6))
        for extra in outs[1:]:
            lines.append((row, extra.name, ["", "", *_tensor_cells(call, extra, common, grad, head=False)]))
    lines += [_op_row(report, op) for op in ops]

    def module(row: Optional[Row], sub: Any, max_width: Optional[int] = None, indent: int = 2) -> Text:
        if row is None:
            return op_cell(report, sub, indent)
        if sub is None:
            return name_cell(row, max_width, indent)
        return Text(" " * indent * (row.depth + 1) + f"└ {sub}", style="dim")

    titles = ["#", "module", "input", "output", *_STATS, ""]
    body = [[r[2][0], None, *r[2][1:]] for r in lines]
    need = {t: max([_cell_len(b[i]) for b in body] + [len(t)]) for i, t in enumerate(titles) if t != "module"}
    need["module"] = max([len("module")] + [module(r, sub).cell_len for r, sub, _ in lines if r is not None and not r.caption]
                         + [inline_len(r) for r, _, _ in lines if r is not None and r.caption]
                         + [min(module(r, sub).cell_len, 40) for r, sub, _ in lines if r is None])
    need = {t: need[t] for t in titles}
    if not any(b[-1] for b in body):
        del need[""]
    out_floor = max([len("output")] + [_cell_len(("", b[3][1])) + min(len(b[3][0]), 6) for b in body
                                        if isinstance(b[3], tuple)])
    short = max([len("module")] + [_short_len(r) for r, sub, _ in lines if r is not None and sub is None])
    flags = min(need.get("", 0), 12)
    soft = {"": flags, "output": out_floor, "module": min(need["module"], short)}
    hard = {"": flags, "output": out_floor, "module": min(need["module"], _MODULE_MIN)}
    widths, pad = fit_columns(need, width, soft=soft, hard=hard, drop=_FORWARD_DROP)
    indent = 2 if widths["module"] >= soft["module"] else 1  # names get cut: one cell of indentation per level
    t = table("", pad=pad)
    for name in widths:
        if name == "module":
            t.add_column(name, overflow="ellipsis", no_wrap=True, max_width=widths[name])
        elif name == "":
            t.add_column(name, overflow="fold")
        else:
            t.add_column(name, justify="left" if name in ("input", "output") else "right", no_wrap=True,
                         style="dim" if name == "#" else None, min_width=widths[name])
    shown: List[dict] = []
    for (row, sub, _), b in zip(lines, body):
        if row is not None and row.caption and _inline(shown, row, widths["module"], indent):
            continue
        cells = dict(zip(titles, b))
        cells["module"] = module(row, sub, widths["module"], indent)
        cells["output"] = _output_text(cells["output"], widths["output"])
        shown.append(cells)
    for cells in shown:
        t.add_row(*(cells[name] for name in widths))
    return titled("Forward", _FOLD_LEGEND if any(r is not None and r.is_fold for r, _, _ in lines) else "", t)


_FOLD_LEGEND = "×N: N identical blocks as one row: first's input, last's output, ▁▃▆ std per block"


def _inline(shown: List[Any], row: Row, width: int, indent: int) -> bool:
    """Put a fold's sparkline (``row.caption``, the line after the fold) after the fold's name
    when the module column has room, shortening the name to what the indentation leaves (then
    the sparkline needs no line of its own): says whether it did."""
    if not shown or row.fold is None:
        return False
    name, spark = shown[-1]["module"], row.caption.rsplit(" ", 1)[-1]  # the legend says what it shows
    if name.cell_len + 2 + len(spark) > width:
        name = name_cell(row.fold, width - 2 - len(spark), indent)
        if "…" in name.plain or name.cell_len + 2 + len(spark) > width:
            return False
    name.append("  " + spark, style="dim")
    shown[-1]["module"] = name
    return True


def inline_len(caption: Row) -> int:
    """Cells of a fold's name with its sparkline after it."""
    return name_cell(caption.fold).cell_len + 2 + len(caption.caption.rsplit(" ", 1)[-1])


def _short_len(row: Row) -> int:
    """Cells of the row's name without its parents (what the indentation shows) and with its
    class name cut to 8 cells (``Multihe…``)."""
    full = name_cell(row).cell_len
    cls = row.call.class_name if row.call is not None else ""
    return (full - len(row.path) + len(short_path(row.path)) if row.path else full) - max(len(cls) - 8, 0)


def _cell_len(cell: Any) -> int:
    if isinstance(cell, tuple):  # (output name, shape)
        return Text.from_markup(escape(cell[0]) + cell[1]).cell_len
    return Text.from_markup(cell).cell_len if isinstance(cell, str) else 0


def _output_text(cell: Any, width: int) -> str:
    """``name shape``, the name cut with an ellipsis when the column is narrower (never the shape)."""
    if not isinstance(cell, tuple):
        return cell
    name, body = cell
    room = width - Text.from_markup(body).cell_len
    if len(name) > room:
        name = (name[: max(room - 2, 1)] + "… ") if room >= 3 else ""
    return escape(name) + body


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
    prefix = f"{info.name} " if head and info.name else ""  # cut before the shape when room is short
    stats = [""] * 5 if s is None else [stat(s.mean), stat(s.std), stat(s.min), stat(s.max), pct_zeros(s.zeros)]
    return [(prefix, escape(shape(info.shape))), *stats, _flags(info, common, grad)]


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
