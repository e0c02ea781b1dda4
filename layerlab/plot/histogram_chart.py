"""Per-layer output histograms: one small panel per layer, from the ``histogram`` probe's counts.

    >>> report = layerlab.inspect(model, x, probes=["histogram"])
    >>> fig = layerlab.plot.histograms(report, path="histograms.png")

Each panel draws one layer call's bin counts as steps over its own bin edges (the x range is that
output's min..max, so the panels do not share an x axis); its title is the module path and class.
Which layers get a panel is the probe's rule (innermost calls, at most
:data:`~layerlab.probe.probes.histogram.MAX_LAYERS`, evenly spaced); the figure's title says when
some were left out. Each panel's step artist has the ``gid`` ``hist:PATH:CALL``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Union

from layerlab.plot import backend

__all__ = ["histograms"]

_COLUMNS = 4


def histograms(report: Any, *, path: Optional[Union[str, Path]] = None, label: Optional[str] = None):
    """Draw the ``histogram`` probe's result of ``report``: one panel per layer.

    Args:
        report (InspectReport): from ``layerlab.inspect(..., probes=["histogram"])``.
        path (str or Path, optional): also save the figure there (``.svg`` or ``.png``).
        label (str, optional): the run's name in the title. Default: the model's class.

    Raises:
        UsageError: matplotlib is missing, ``path`` has another suffix, or the probe did not run.
    """
    from layerlab.text_safety import clean, display_copy

    if path is not None:
        backend.format_of(path)
    report = display_copy(report, limit=200)  # module names become the panels' titles
    label = clean(label, 200) if label is not None else None
    try:
        result = report.probe("histogram")
    except (KeyError, AttributeError):
        raise backend.no_picture("the histogram probe did not run; run layerlab.inspect(..., "
                                 "probes=['histogram']) or inspect --probe histogram") from None
    rows = [r for r in result.rows if r.series.get("counts")]
    if not rows:
        raise backend.no_picture("no layer produced a floating-point output with finite values")
    ncols = min(_COLUMNS, len(rows))
    nrows = math.ceil(len(rows) / ncols)
    with backend.style():
        fig = backend.new_figure(width=2.6 * ncols, height=1.9 * nrows + 0.6)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for i, ax in enumerate(ax for row in axes for ax in row):
            if i >= len(rows):
                ax.set_visible(False)
                continue
            row = rows[i]
            steps = ax.stairs(row.series["counts"], row.series["edges"], fill=True, alpha=0.8)
            steps.set_gid(f"hist:{row.path}:{row.call or 1}")
            call = f" (call {row.call})" if row.call and row.call > 1 else ""
            ax.set_title(f"{row.path}{call}\n{row.class_name}", fontsize=8)
            ax.tick_params(labelsize=6)
            nonfinite = row.values.get("nonfinite") or 0
            if nonfinite:
                ax.text(0.98, 0.95, f"{int(nonfinite)} NaN/Inf not binned", transform=ax.transAxes,
                        fontsize=6, ha="right", va="top", color="#d62728")
        name = label or getattr(report, "model", "model")
        shown = result.summary.get("shown", len(rows))
        total = result.summary.get("layers", shown)
        more = f" — {shown} of {total} layers, evenly spaced" if shown < total else ""
        fig.suptitle(f"{name}: output value histograms per layer ({result.summary.get('bins', '?')} bins "
                     f"over each output's min..max){more}", fontsize=10)
    if path is not None:
        backend.save(fig, path)
    return fig
