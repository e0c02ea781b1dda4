"""The numbers a gradient-flow chart draws, read from an :class:`~layerlab.probe.report.InspectReport`.

No matplotlib here: the points are plain data, so they can be checked (and used) without drawing.

A *layer* is a module that ran (it has a call in the report) and holds parameters, its own or those
of submodules that never ran as modules: ``nn.MultiheadAttention`` uses ``out_proj``'s weight
through a function call, so its point covers ``in_proj_weight`` and ``out_proj.*`` together, as the
forward table shows it as one row. Layers are in *execution order* (the index of their first call);
a module called several times is placed, and its output std taken, at its first call.

Per layer:

* ``grad_norm`` — the L2 norm of the gradient of all its parameters together,
  ``sqrt(sum ‖∂L/∂p‖²)``; ``None`` when none of them got a gradient (or no backward ran);
* ``weight_norm`` — ``sqrt(sum ‖p‖²)`` over the same parameters;
* ``output_std`` — the std of the first tensor output of its first call (``None`` without statistics).

Layer *groups* are the series of the chart: a group is one role repeated through depth, the path
with its list indices replaced by ``*`` plus the class (``layers.*.linear2 (Linear)``: the second
linear of every block of a stack is one line). A model with more than :data:`MAX_GROUPS` such
roles (nothing repeats) is grouped by class instead (``Linear``, ``Conv2d``).

*Blocks* are the repeated units of a stack: calls of modules whose path ends in a list index
(``layers.3``, ``h.0``) and that ran modules inside them. Their output std is the residual stream
of a transformer stack, which no single layer's output shows (a LayerNorm's output std is 1
whatever its input); :func:`block_points` places each block at its last parameter-bearing layer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["LayerPoint", "BlockPoint", "layer_points", "block_points", "MAX_GROUPS"]

#: more roles than this (nothing repeats through depth): group the layers by class instead
MAX_GROUPS = 10
_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


@dataclass
class LayerPoint:
    """One parameter-bearing layer of a report, at its place in execution order."""

    path: str
    class_name: str
    order: int
    params: List[str] = field(default_factory=list)
    grad_norm: Optional[float] = None
    weight_norm: Optional[float] = None
    output_std: Optional[float] = None
    group: str = ""

    @property
    def label(self) -> str:
        return self.path or "(root)"


def layer_points(report: Any) -> List[LayerPoint]:
    """The parameter-bearing layers of ``report`` in execution order (see the module docstring)."""
    first_call: Dict[str, Any] = {}
    for call in report.calls:
        first_call.setdefault(call.path, call)
    points: Dict[str, LayerPoint] = {}
    grads: Dict[str, List[float]] = {}
    weights: Dict[str, List[float]] = {}
    for param in report.params:
        owner = _called_owner(param.module, first_call)
        call = first_call.get(owner)
        point = points.get(owner)
        if point is None:
            point = points[owner] = LayerPoint(
                path=owner,
                class_name=call.class_name if call is not None else "?",
                order=call.index if call is not None else len(report.calls),
                output_std=_output_std(call),
            )
        point.params.append(param.name)
        if param.grad_norm is not None:
            grads.setdefault(owner, []).append(param.grad_norm)
        if param.norm is not None:
            weights.setdefault(owner, []).append(param.norm)
    for owner, point in points.items():
        point.grad_norm = _root_sum_square(grads.get(owner))
        point.weight_norm = _root_sum_square(weights.get(owner))
    ordered = sorted(points.values(), key=lambda p: p.order)  # stable: parameter order breaks ties
    roles = {f"{_INDEX.sub('*', p.path) or '(root)'} ({p.class_name})" for p in ordered}
    for point in ordered:
        point.group = point.class_name if len(roles) > MAX_GROUPS else \
            f"{_INDEX.sub('*', point.path) or '(root)'} ({point.class_name})"
    return ordered


@dataclass
class BlockPoint:
    """The output std of one block of a stack, at the x position of its last layer."""

    path: str
    x: int
    output_std: Optional[float]


def block_points(report: Any, points: List[LayerPoint]) -> List[BlockPoint]:
    """The blocks of ``report`` (see the module docstring), each at its last layer's position."""
    parents = {c.parent for c in report.calls if c.parent is not None}
    blocks = []
    for call in report.calls:
        if call.call != 1 or call.index not in parents or not call.path or not call.path.rpartition(".")[2].isdigit():
            continue
        inside = [x for x, p in enumerate(points) if p.path.startswith(call.path + ".")]
        if inside:
            blocks.append(BlockPoint(path=call.path, x=inside[-1], output_std=_output_std(call)))
    return blocks


def _called_owner(module_path: str, first_call: Dict[str, Any]) -> str:
    """The innermost module on ``module_path`` (itself included) that ran as a module."""
    path = module_path
    while path and path not in first_call:
        path = path.rpartition(".")[0]
    if path in first_call:
        return path
    return module_path  # nothing on the way ran (a failed forward): keep the parameter's own module


def _output_std(call: Any) -> Optional[float]:
    if call is None:
        return None
    for out in call.outputs:
        if out.is_tensor and out.stats is not None:
            return out.stats.std
    return None


def _root_sum_square(values: Optional[List[float]]) -> Optional[float]:
    if not values:
        return None
    return math.sqrt(math.fsum(v * v for v in values))
