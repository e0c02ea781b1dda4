"""Pictures of layerlab reports (the optional ``layerlab[plot]`` extra: matplotlib).

* :func:`gradient_flow` — gradient norm, weight norm and output std of every layer by depth, for
  one report or several side by side (pre-LN vs post-LN);
* :func:`histograms` — one small panel per layer with its output's value histogram (the
  ``histogram`` probe's counts).

Both return a ``matplotlib.figure.Figure`` and save it when given ``path=`` (``.svg`` or ``.png``).
The drawing lives in ``flow_chart`` and ``histogram_chart`` (module names that cannot shadow these
functions). Importing this package does not import matplotlib; drawing without it raises a UsageError that
names ``pip install 'layerlab[plot]'``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gradient_flow", "histograms"]


def gradient_flow(report: Any, *more: Any, **kwargs: Any):
    """See :func:`layerlab.plot.flow_chart.gradient_flow`."""
    from layerlab.plot.flow_chart import gradient_flow as draw

    return draw(report, *more, **kwargs)


def histograms(report: Any, **kwargs: Any):
    """See :func:`layerlab.plot.histogram_chart.histograms`."""
    from layerlab.plot.histogram_chart import histograms as draw

    return draw(report, **kwargs)
