"""``layerlab explain-shape``: output-size arithmetic of conv/pool-type ops, step by step."""

from __future__ import annotations

from layerlab.cli.options import JsonOpt


def command(json: JsonOpt = False) -> int:
    """Explain the output size of a conv/pool-type op, exactly as torch computes it."""
    return 0
