"""Result objects of the shape arithmetic: plain dataclasses, no formatting (see cli/render)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from layerlab.errors import TorchWouldRaise
from layerlab.shapes.torch_version import TorchRules

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1


@dataclass
class DimStep:
    """The arithmetic of one output dimension.

    Attributes:
        dim: the dimension's name: ``L`` (1-D), ``H``/``W`` (2-D), ``D``/``H``/``W`` (3-D), or
            ``C``/``N`` where the op computes a non-spatial size (unfold's ``C·k_h·k_w``).
        input: the input size along this dim.
        formula: the rule in symbols, e.g. ``(L + 2p − E) // s + 1``.
        substituted: the same with the numbers filled in, e.g. ``(32 + 2·1 − 3) // 2 + 1``.
        output: the resulting size (may be ≤ 0 when torch then raises).
        values: the per-dim parameters used (``{"k": 3, "s": 2, "p": 1, "d": 1, "E": 3}``).
    """

    dim: str
    input: Optional[int]
    formula: str
    substituted: str
    output: int
    values: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ShapeNote:
    """Something torch does silently that the user should know (or a plain-words fact).

    ``code`` is stable for scripts: ``cropped``, ``skipped``, ``same-asymmetric``,
    ``ceil-extra-window``, ``ceil-dropped``, ``float-trap``, ``bins-overlap``, ``bins-repeat``,
    ``patch-cropped``, ``output-size-range``, ``backend-message``, ``info``.
    ``severity`` is ``warning`` (likely a surprise) or ``info``.
    """

    code: str
    message: str
    dim: Optional[str] = None
    severity: str = "warning"
    data: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Explanation:
    """Everything explain-shape knows about one op applied to one input.

    ``output_shape`` is ``None`` when torch would raise; ``error`` then holds the structured
    :class:`~layerlab.errors.TorchWouldRaise` and ``steps`` the arithmetic that ran before it.
    ``torch_rules`` is the torch version whose behaviour was predicted (the installed one unless
    the caller chose another); ``None`` only for explanations built by hand.
    """

    op: str
    call: str
    params: Dict[str, Any]
    input_shape: Tuple[int, ...]
    output_shape: Optional[Tuple[int, ...]] = None
    steps: List[DimStep] = field(default_factory=list)
    notes: List[ShapeNote] = field(default_factory=list)
    error: Optional[TorchWouldRaise] = None
    torch_rules: Optional[TorchRules] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def warnings(self) -> List[ShapeNote]:
        return [n for n in self.notes if n.severity == "warning"]

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "explanation",
            "op": self.op,
            "call": self.call,
            "params": self.params,
            "input_shape": list(self.input_shape),
            "output_shape": None if self.output_shape is None else list(self.output_shape),
            "ok": self.ok,
            "steps": self.steps,
            "notes": self.notes,
            "error": None if self.error is None else self.error.to_dict(),
            "torch": None if self.torch_rules is None else self.torch_rules.to_dict(),
        }
