"""Shared by the silent-bug tests: run inspect, pick the silent findings, find a marked source line."""

from __future__ import annotations

import inspect as pyinspect
import os
from typing import List

import torch

import layerlab


def silent(model: torch.nn.Module, *inputs, **kwargs) -> List:
    """The ``silent/…`` problems of a default ``layerlab.inspect`` of ``model``."""
    torch.manual_seed(0)
    report = layerlab.inspect(model, *inputs, fix=False, **kwargs)
    assert report.failure is None, report.failure
    return [p for p in report.problems if p.code.startswith("silent/")]


def line_of(obj, marker: str) -> str:
    """``file.py:N`` of the line of ``obj``'s source (a class or function) that holds ``marker``."""
    lines, start = pyinspect.getsourcelines(obj)
    for k, line in enumerate(lines):
        if marker in line:
            return f"{os.path.basename(pyinspect.getsourcefile(obj))}:{start + k}"
    raise AssertionError(f"no line with {marker!r}")


def at(findings, rule: str, line: str):
    """The finding of ``rule`` whose ``where`` ends with ``line`` (``file.py:N``), else None."""
    for f in findings:
        if f.code == rule and f.where and os.path.basename(f.where.rsplit(":", 1)[0]) + ":" + f.where.rsplit(":", 1)[1] == line:
            return f
    return None
