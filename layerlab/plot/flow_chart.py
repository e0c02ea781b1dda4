"""The gradient-flow chart: gradient norm, weight norm and output std of every layer, by depth.

    >>> import layerlab, layerlab.plot
    >>> pre, post = layerlab.inspect(pre_ln, x), layerlab.inspect(post_ln, x)
    >>> fig = layerlab.plot.gradient_flow(pre, post, labels=["pre-LN", "post-LN"], path="flow.svg")

One column per report (side by side, the same y range in each row so the runs compare directly),
three rows: the gradient norm ``‖∂L/∂w‖`` of each parameter-bearing layer (log scale), its weight
norm ``‖w‖`` (log scale), and the std of its output in the forward pass (linear scale: a dead
layer's 0 must show). The x axis is depth: the layers in execution order, labelled by module path
(see :mod:`layerlab.plot.layers` for what a layer is and how its numbers are formed).

Each layer group — one role repeated through depth, ``layers.*.linear2 (Linear)``, or one class
when nothing repeats — is one series with its own colour, the same in every column, so that
"every linear2 of the stack" reads as one line through depth. In the std row, a dashed black line
adds the output std of each block of a stack (``layers.*``: the residual stream). Every series has
a ``gid`` (``grad:0:layers.N.linear2_Linear``: quantity, column, group; ``std:0:block_layers.N``;
see :func:`gid`), written as the ``id`` of its group in the SVG. Values that a log axis cannot show (zero,
no gradient, NaN/Inf) are not drawn; the panel says how many were left out.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from layerlab.plot import backend
from layerlab.plot.layers import LayerPoint, block_points, layer_points

__all__ = ["gradient_flow", "gid", "PANELS"]

#: (key, LayerPoint attribute, title, y label, log scale), one row each
PANELS = (
    ("grad", "grad_norm", "gradient norm ‖∂L/∂w‖ per layer", "‖∂L/∂w‖", True),
    ("weight", "weight_norm", "weight norm ‖w‖ per layer", "‖w‖", True),
    ("std", "output_std", "forward: std of each layer's output", "output std", False),
)
#: layer names on the x axis: at most this many, evenly thinned beyond
_MAX_TICKS = 40


def gradient_flow(report: Any, *more: Any, path: Optional[Union[str, Path]] = None,
                  labels: Optional[Sequence[str]] = None):
    """Draw the gradient-flow chart of one or more inspect reports, side by side.

    Args:
        report, *more (InspectReport): reports from ``layerlab.inspect`` (with a backward pass for
            the gradient row); two of them compare two runs, e.g. pre-LN and post-LN.
        path (str or Path, optional): also save the figure there (``.svg`` or ``.png``).
        labels (list of str, optional): one title per report. Default: each report's model class
            (numbered when two are the same).

    Returns:
        matplotlib.figure.Figure: three rows (gradient norm, weight norm, output std) and one
        column per report.

    Raises:
        UsageError: matplotlib is not installed (the message names ``pip install 'layerlab[plot]'``),
            ``path`` has another suffix, or a report has no layer with parameters.
    """
    from layerlab.text_safety import clean, display_copy

    reports = [display_copy(r, limit=200) for r in (report, *more)]  # module names become titles and ticks
    names = [clean(name, 200) for name in _labels(reports, labels)]
    if path is not None:
        backend.format_of(path)  # a bad suffix is refused before anything is drawn
    columns = []
    for name, rep in zip(names, reports):
        if type(rep).__name__ != "InspectReport":
            raise TypeError(f"gradient_flow takes reports from layerlab.inspect, got {type(rep).__name__}")
        points = layer_points(rep)
        if not points:
            raise backend.no_picture(f"{name} has no layer with parameters (its report lists none)")
        columns.append((name, rep, points))
    groups = _groups(points for _, _, points in columns)
    with backend.style():
        widest = max(len(points) for _, _, points in columns)
        fig = backend.new_figure(width=max(4.5, 2.0 + 0.16 * widest) * len(columns), height=9.0)
        fig.get_layout_engine().set(h_pad=0.12, hspace=0.06)  # room for the rotated layer names
        axes = fig.subplots(len(PANELS), len(columns), squeeze=False, sharey="row")
        for col, (name, rep, points) in enumerate(columns):
            for row, panel in enumerate(PANELS):
                _draw_panel(axes[row][col], panel, col, name, rep, points, groups, first=col == 0,
                            last=row == len(PANELS) - 1)
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], marker="o", color=colour, label=group) for group, colour in groups.items()]
        if any((line.get_gid() or "").startswith("std:") and ":block_" in line.get_gid()
               for ax in fig.axes for line in ax.get_lines()):
            handles.append(Line2D([], [], marker="s", linestyle="--", color="black", label="block output"))
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), frameon=False,
                   title="layer group")
        fig.suptitle("gradient flow by depth (layers in execution order)")
    if path is not None:
        backend.save(fig, path)
    return fig


def _draw_panel(ax, panel, col: int, name: str, report, points: List[LayerPoint], groups: Dict[str, str],
                first: bool, last: bool) -> None:
    key, attr, title, ylabel, log = panel
    ax.set_title(f"{name}\n{title}" if key == "grad" else title, fontsize=9)
    if log:
        ax.set_yscale("log")
    if first:
        ax.set_ylabel(ylabel)
    left_out = 0
    for group, colour in groups.items():
        xs, ys = [], []
        for x, point in enumerate(points):
            if point.group != group:
                continue
            value = getattr(point, attr)
            if value is None or not math.isfinite(value) or (log and value <= 0):
                left_out += 1
                continue
            xs.append(x)
            ys.append(value)
        if xs:
            line, = ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.2, color=colour, label=group)
            line.set_gid(gid(key, col, group))
    if key == "std":
        _draw_blocks(ax, col, report, points)
    if log:
        _plain_log_labels(ax)
    note = _panel_note(key, report, left_out)
    if note:
        ax.text(0.01, 0.97, note, transform=ax.transAxes, fontsize=7, va="top", color="0.35")
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    ticks = _ticks(len(points))
    ax.set_xticks(ticks)
    if last:
        ax.set_xticklabels([points[i].label for i in ticks], rotation=90, fontsize=6)
    else:
        ax.set_xticklabels([])


def _draw_blocks(ax, col: int, report, points: List[LayerPoint]) -> None:
    """The output std of each block of a stack (the residual stream), one dashed line per pattern."""
    from layerlab.plot.layers import _INDEX

    by_pattern: Dict[str, list] = {}
    for block in block_points(report, points):
        if block.output_std is not None and math.isfinite(block.output_std):
            by_pattern.setdefault(_INDEX.sub("*", block.path), []).append(block)
    for pattern, blocks in by_pattern.items():
        line, = ax.plot([b.x for b in blocks], [b.output_std for b in blocks], linestyle="--", marker="s",
                        markersize=3, linewidth=1.0, color="black", label=f"block output ({pattern})")
        line.set_gid(gid("std", col, "block " + pattern))


def gid(key: str, col: int, group: str) -> str:
    """The SVG id of a series: ``grad:0:layers.N.linear2_Linear`` for ``layers.*.linear2 (Linear)``
    (an XML name: ``*`` becomes ``N``, anything else outside letters, digits and ``.-_`` a ``_``)."""
    slug = re.sub(r"[^A-Za-z0-9.\-_]+", "_", group.replace("*", "N")).strip("_")
    return f"{key}:{col}:{slug}"


def _plain_log_labels(ax) -> None:
    """Log-axis labels as plain numbers (0.2, 0.5, 1, 2, 5; 1e-08 … 1 over many decades) rather than
    2×10⁻¹, with labelled ticks at any span (see :func:`log_ticks`)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    class SpanLogLocator(FixedLocator):  # ticks chosen when drawn: sharey may widen the range later
        def __call__(self):
            return log_ticks(*self.axis.get_view_interval())

    ax.yaxis.set_major_locator(SpanLogLocator([]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def log_ticks(vmin: float, vmax: float, most: int = 8) -> List[float]:
    """Major ticks of a log axis from ``vmin`` to ``vmax``: 1-2-5 per decade over a few decades, powers
    of ten (every k-th, at most ``most``) over many — matplotlib's LogLocator with subs (1, 2, 5) draws
    no major tick at all once the span needs a stride, which left a vanishing gradient's axis blank —
    and 1…9 per decade (or plain steps) when the span is too narrow for two 1-2-5 ticks."""
    lo, hi = min(vmin, vmax), max(vmin, vmax)
    if not (lo > 0 and math.isfinite(lo) and math.isfinite(hi)):
        return []
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))

    def within(subs, stride=1):
        return [s * 10.0 ** e for e in range(first, last + 1) if (e - first) % stride == 0
                for s in subs if lo <= s * 10.0 ** e <= hi * (1 + 1e-9)]

    if last - first > 3:
        return within((1.0,), stride=math.ceil((last - first + 1) / most))
    ticks = within((1.0, 2.0, 5.0))
    if len(ticks) < 2:
        ticks = within(tuple(float(s) for s in range(1, 10)))
    if len(ticks) < 2:  # a range inside one digit (2.5 … 2.9): evenly spaced plain numbers
        from matplotlib.ticker import MaxNLocator

        ticks = [float(t) for t in MaxNLocator(4).tick_values(lo, hi) if lo <= t <= hi]
    return ticks


def _panel_note(key: str, report, left_out: int) -> str:
    if key == "grad" and not report.backward.ran:
        return "no backward pass ran" + (f" ({report.backward.skipped})" if report.backward.skipped else "")
    if key == "std" and left_out:
        return f"{left_out} layer(s) without output statistics"
    if left_out:
        return f"{left_out} layer(s) not drawn (zero, no gradient, or NaN/Inf)"
    return ""


def _ticks(n: int) -> List[int]:
    if n <= _MAX_TICKS:
        return list(range(n))
    step = math.ceil(n / _MAX_TICKS)
    return list(range(0, n, step))


def _groups(columns) -> Dict[str, str]:
    """Layer group -> colour, in order of first appearance over all columns."""
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
    groups: Dict[str, str] = {}
    for points in columns:
        for point in points:
            if point.group not in groups:
                groups[point.group] = palette[len(groups) % len(palette)]
    return groups


def _labels(reports: list, labels: Optional[Sequence[str]]) -> List[str]:
    if labels is not None:
        labels = [str(label) for label in labels]
        if len(labels) != len(reports):
            raise ValueError(f"gradient_flow got {len(reports)} report(s) and {len(labels)} label(s)")
        return labels
    names = [getattr(r, "model", "model") for r in reports]
    if len(set(names)) < len(names):
        names = [f"{n} #{i + 1}" for i, n in enumerate(names)]
    return names
