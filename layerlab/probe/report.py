"""Result objects of ``layerlab.inspect``: plain dataclasses, no formatting (see cli/render_inspect).

The report keeps metadata and small statistics of every tensor that went into or came out of a
module call, never the tensors themselves. Field names are the JSON keys (``--json``).

Vocabulary used throughout:

    call      one execution of one module's ``forward`` (a module called twice has two calls)
    path      the module's qualified name (``encoder.layers.3.linear1``; ``""`` for the root)
    slot      one tracked tensor (deduplicated: the output of ``conv`` that feeds ``bn`` is one slot)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from layerlab.errors import Problem
# the failure side lives in its own module; its names stay importable from here
from layerlab.probe.failure_report import (Diagnosis, Failure, FixStep, OpRecord, Operand, Origin, Verification,
                                           VerifiedStep)
from layerlab.report_render import Displayable  # imports no Rich: it renders on demand

__all__ = ["SCHEMA_VERSION", "Stats", "GradStats", "TensorInfo", "call_label", "CallRecord", "ParamRecord",
           "FormulaCheck", "BackwardInfo", "InspectReport",
           # from failure_report
           "FixStep", "VerifiedStep", "Verification", "Diagnosis", "Operand", "OpRecord", "Origin", "Failure"]

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1


@dataclass
class Stats:
    """Cheap statistics of one tensor's values (over its finite elements when some are not).

    ``zeros`` is the fraction of elements exactly equal to 0; ``nan`` and ``inf`` are counts.
    """

    mean: float
    std: float
    min: float
    max: float
    zeros: float
    nan: int
    inf: int
    numel: int

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0


@dataclass
class GradStats:
    """The gradient of the loss with respect to one tensor: its L2 norm, and whether it holds
    NaN (the norm is then NaN) or Inf (the norm is then Inf)."""

    norm: float
    nan: bool = False
    inf: bool = False

    @property
    def finite(self) -> bool:
        return not (self.nan or self.inf)


@dataclass
class TensorInfo:
    """One input or output of a call. Non-tensor values (``None``, flags, sizes) keep ``value``.

    Attributes:
        name: where it sits: a forward argument (``input``, ``attn_mask``), an element of a
            returned structure (``[0]``, ``[1][0]``, ``.indices``, ``[logits]``), or both
            (``hx[0]``).
        source: for inputs, the index of the call whose output this tensor is (``None`` when it
            was made outside any module call: a model input or a functional op in a forward).
        grad: the gradient of the loss w.r.t. this tensor (summed over all its uses), once
            backward ran; ``None`` when it got none.
        nested: a nested tensor (``torch.nested``; ``nn.TransformerEncoder``'s fast path makes
            one): ``shape`` holds ``None`` for each ragged dimension, and ``stats`` cover the
            elements of its components (no padding).
    """

    name: str
    shape: Optional[List[int]] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    requires_grad: bool = False
    grad_fn: Optional[str] = None
    stats: Optional[Stats] = None
    grad: Optional[GradStats] = None
    value: Any = None
    source: Optional[int] = None
    slot: Optional[int] = None
    nested: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None


def call_label(path: Optional[str], call: Optional[int]) -> str:
    """How every report names a module call: its path (``(root)`` for the model itself), with
    ``(call n)`` from its second call on. (No torch here: ``layerlab diff`` uses it on JSON.)"""
    name = path or "(root)"
    return name if call in (None, 1) else f"{name} (call {call})"


@dataclass
class CallRecord:
    """One module call, in execution order (``index`` = order in which calls started).

    ``status`` is ``ok``, ``raised`` (the call that started and never finished, innermost) or
    ``unfinished`` (an enclosing call the exception went through). ``end`` is the order in which
    calls finished (children finish before their parents).
    """

    index: int
    path: str
    class_name: str
    depth: int
    call: int
    parent: Optional[int]
    training: bool
    params: int
    trainable: int
    inputs: List[TensorInfo] = field(default_factory=list)
    outputs: List[TensorInfo] = field(default_factory=list)
    status: str = "ok"
    end: Optional[int] = None

    @property
    def tensor_inputs(self) -> List[TensorInfo]:
        """The inputs that are tensors, in argument order (flags, sizes and ``None`` left out)."""
        return [i for i in self.inputs if i.is_tensor]

    @property
    def tensor_outputs(self) -> List[TensorInfo]:
        """The outputs that are tensors, in the order the returned structure holds them."""
        return [o for o in self.outputs if o.is_tensor]

    @property
    def label(self) -> str:
        """``encoder.layers.0`` or ``encoder.layers.0 (call 2)`` for a repeated call."""
        return call_label(self.path, self.call)


@dataclass
class ParamRecord:
    """One parameter (tied parameters appear once) and its gradient after backward.

    ``grad_norm`` is ``None`` when the parameter received no gradient at all. ``flags``:
    ``no-grad`` (trainable but unused or on a detached path), ``zero-grad`` (gradient exactly 0),
    ``vanishing``, ``exploding``, ``nan``, ``inf``. ``expected`` says why a ``zero-grad`` or
    ``vanishing`` flag is expected by construction (then no warning is raised for it).
    """

    name: str
    module: str
    shape: List[int]
    dtype: str
    device: str
    numel: int
    trainable: bool
    norm: Optional[float] = None
    grad_norm: Optional[float] = None
    ratio: Optional[float] = None
    grad_nan: bool = False
    grad_inf: bool = False
    flags: List[str] = field(default_factory=list)
    expected: Optional[str] = None


@dataclass
class FormulaCheck:
    """The output size predicted by explain-shape's arithmetic versus what the call returned.

    ``passed`` is ``None`` when the check could not run (``note`` says why). ``steps`` are the
    per-dimension formulas with the numbers substituted (``H: (32 + 2·1 − 3) // 2 + 1 = 16``).
    """

    call: int
    path: str
    op: str
    formula_call: str
    input_shape: List[int]
    predicted: Optional[List[int]]
    actual: Optional[List[int]]
    steps: List[str] = field(default_factory=list)
    passed: Optional[bool] = None
    note: Optional[str] = None


@dataclass
class BackwardInfo:
    """How backward ran: ``loss`` names the scalar that was differentiated."""

    ran: bool
    loss: str
    loss_value: Optional[float] = None
    output_grad_norm: Optional[float] = None
    skipped: Optional[str] = None


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class InspectReport(Displayable):
    """Everything ``layerlab.inspect`` saw: calls, parameters, formula checks, problems, failure.

    ``ok`` is true when nothing raised, every formula check that ran passed and no problem has
    severity ``error`` (NaN/Inf values or gradients). ``notes`` (severity ``info``) are findings
    that are expected and need no action, each saying why: gradients that are zero or tiny by
    construction (see :mod:`layerlab.probe.gradient_causes`), or a zero-initialised head.
    """

    model: str
    mode: str
    inputs: List[TensorInfo]
    outputs: List[TensorInfo]
    calls: List[CallRecord]
    params: List[ParamRecord]
    checks: List[FormulaCheck]
    problems: List[Problem]
    backward: BackwardInfo
    failure: Optional[Failure] = None
    ops: Optional[List[OpRecord]] = None
    total_params: int = 0
    trainable_params: int = 0
    timing: Dict[str, float] = field(default_factory=dict)
    notes: List[Problem] = field(default_factory=list)
    memory: Optional[Any] = None  # a probe.meta.MetaMemory, for a run with meta=True
    probes: List[Any] = field(default_factory=list)  # probe.probes.base.ProbeResult, one per probe asked for
    schema: int = SCHEMA_VERSION

    @property
    def checks_failed(self) -> List[FormulaCheck]:
        return [c for c in self.checks if c.passed is False]

    @property
    def errors(self) -> List[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> List[Problem]:
        return [p for p in self.problems if p.severity != "error"]

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.checks_failed and not self.errors

    def call(self, path: str, n: int = 1) -> CallRecord:
        """The ``n``-th call of the module at ``path`` (``KeyError`` if it never ran)."""
        for rec in self.calls:
            if rec.path == path and rec.call == n:
                return rec
        raise KeyError(f"no call {n} of module {path!r}")

    def probe(self, name: str):
        """The result of the probe called ``name`` (``KeyError`` if it did not run)."""
        for result in self.probes:
            if result.name == name:
                return result
        raise KeyError(f"probe {name!r} did not run")

    def param(self, name: str) -> ParamRecord:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"no parameter {name!r}")

    def to_dict(self) -> dict:
        from dataclasses import fields

        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "schema"}
        return {"schema": self.schema, "ok": self.ok, **d}
