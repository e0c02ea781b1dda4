"""Result objects of ``layerlab profile``: plain dataclasses, no formatting (see cli/render_profile).

Times are seconds, medians over the timed repeats; memory is bytes; FLOPs are
:class:`torch.utils.flop_counter.FlopCounterMode`'s (a multiply-add counts 2), with the formulas it
lacks for fused CPU attention added (:mod:`layerlab.profiling.flops`); compute ops that no formula
counts are listed in ``flops_not_counted``, never silently counted as 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from layerlab.report_render import Displayable  # imports no Rich: it renders on demand

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1


@dataclass
class ProfileRow:
    """One module call (inspect's rows: a module called twice has two).

    Attributes:
        path: the module's qualified name (``""`` for the root); ``call``: which call of it (1, 2, …).
        class_name, depth, parent: the module's class, nesting depth (root 0), the calling row's index.
        forward_s, backward_s: self time — this call's own work, children excluded (they have rows).
            Self times of all rows add up to the whole step (minus what autograd spends between nodes).
        forward_incl_s, backward_incl_s: inclusive time, children included.
        share: (forward_s + backward_s) / the sum over all rows.
        flops_forward, flops_backward: self FLOPs (children excluded).
        activation_bytes: bytes autograd saved for backward during this call (self; each storage once;
            parameters and buffers excluded).
        flops_not_counted: compute ops this call ran (self, forward and backward) that no FLOP formula
            counts, ``{"aten.op": times}``: when not empty, the FLOPs are a lower bound.
        output_bytes: bytes of the tensors this call returned.
        param_bytes: bytes of the parameters this module registers itself, on its first call only;
            a tied weight once; those of a submodule that never ran (``MultiheadAttention.out_proj``,
            used through ``F.linear``) on its nearest called ancestor: the column adds up to
            ``sum(p.numel() * p.element_size() for p in model.parameters())``.
    """

    index: int
    path: str
    call: int
    class_name: str
    depth: int
    parent: Optional[int]
    forward_s: float = 0.0
    backward_s: float = 0.0
    forward_incl_s: float = 0.0
    backward_incl_s: float = 0.0
    share: float = 0.0
    flops_forward: int = 0
    flops_backward: int = 0
    activation_bytes: int = 0
    output_bytes: int = 0
    param_bytes: int = 0
    flops_not_counted: Dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        name = self.path or "(root)"
        return f"{name} #{self.call}" if self.call > 1 else name


@dataclass
class StepTiming:
    """The whole step, without hooks and with them.

    Attributes:
        step_s, forward_s, backward_s: plain step (no hooks): medians.
        profiled_step_s: the same step with the profiler's hooks (graph walk included): median.
        overhead: profiled_step_s / step_s − 1 (the profiler's own cost).
        rows_sum_s: Σ over rows of self forward + self backward.
        rows_error: rows_sum_s / step_s − 1 (how well the rows account for the real step).
        unattributed_s: profiled backward time no node accounts for (the engine between nodes).
        peak_bytes: peak device memory of one step (CUDA only; ``None`` on CPU).
    """

    step_s: float
    forward_s: float
    backward_s: float
    profiled_step_s: float
    overhead: float
    rows_sum_s: float
    rows_error: float
    unattributed_s: float = 0.0
    peak_bytes: Optional[int] = None
    samples_step_s: List[float] = field(default_factory=list)


@dataclass
class Metric:
    """One line of a side-by-side comparison: ``ratio`` = ``a / b``; ``better`` says which way is good."""

    name: str
    a: Optional[float]
    b: Optional[float]
    unit: str
    better: str = "lower"

    @property
    def ratio(self) -> Optional[float]:
        if self.a is None or self.b is None or self.b == 0:
            return None
        return self.a / self.b

    def to_dict(self) -> dict:
        return {"name": self.name, "a": self.a, "b": self.b, "unit": self.unit, "better": self.better,
                "ratio": self.ratio}


@dataclass
class Comparison:
    """Two ways to run the same step, side by side (``--compile``: eager vs compiled;
    ``--vs-reference``: the layer vs its torch.nn counterpart).

    Attributes:
        a, b: what the columns are (``layerlab.layers.transformer.TransformerEncoderLayer``, ``torch.nn.…``).
        metrics: the rows; ``ratio`` = a / b.
        notes: how it was measured, and anything that did not work (``error``).
    """

    kind: str
    a: str
    b: str
    metrics: List[Metric] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    error: Optional[str] = None

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class ProfileReport(Displayable):
    """Everything ``layerlab profile`` measured.

    Attributes:
        target, model: what was profiled.
        device, timer, threads, mode: where and how (``timer`` names the clock).
        warmup, repeats: untimed warm-up steps, timed steps (medians reported).
        inputs: input names → ``dtype[shape]``.
        backward: whether the step includes backward (``False`` when nothing requires grad).
        rows: one per module call, in call order.
        step: the whole step and the profiler's overhead.
        compile, reference: the ``--compile`` and ``--vs-reference`` comparisons.
        flops_not_counted: ``{"aten.op": times}`` over the whole step: compute ops that ran without
            a FLOP formula, so the FLOP totals are lower bounds (empty: every compute op counted).
    """

    target: str
    model: str
    device: str
    timer: str
    threads: int
    mode: str
    warmup: int
    repeats: int
    inputs: Dict[str, Any]
    backward: bool
    rows: List[ProfileRow]
    step: StepTiming
    compile: Optional[Comparison] = None
    reference: Optional[Comparison] = None
    notes: List[str] = field(default_factory=list)
    seconds: float = 0.0
    flops_not_counted: Dict[str, int] = field(default_factory=dict)

    def row(self, path: str, call: int = 1) -> ProfileRow:
        for r in self.rows:
            if r.path == path and r.call == call:
                return r
        raise KeyError(f"no row {path!r} call {call}")

    @property
    def totals(self) -> Dict[str, float]:
        return {
            "forward_s": sum(r.forward_s for r in self.rows),
            "backward_s": sum(r.backward_s for r in self.rows),
            "flops_forward": sum(r.flops_forward for r in self.rows),
            "flops_backward": sum(r.flops_backward for r in self.rows),
            "activation_bytes": sum(r.activation_bytes for r in self.rows),
            "param_bytes": sum(r.param_bytes for r in self.rows),
        }

    def to_dict(self) -> dict:
        from layerlab.serialize import to_jsonable

        return {
            "schema": SCHEMA_VERSION,
            "kind": "profile-report",
            "target": self.target,
            "model": self.model,
            "device": self.device,
            "timer": self.timer,
            "threads": self.threads,
            "mode": self.mode,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "inputs": self.inputs,
            "backward": self.backward,
            "step": to_jsonable(self.step),
            "totals": self.totals,
            "flops_not_counted": dict(self.flops_not_counted),
            "rows": [dict(to_jsonable(r), label=r.label) for r in self.rows],
            "compile": to_jsonable(self.compile),
            "reference": to_jsonable(self.reference),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }
