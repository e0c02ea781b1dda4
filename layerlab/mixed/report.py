"""Result objects of ``layerlab precision-check``: plain dataclasses, no formatting (cli/render_precision).

Errors are relative to float32, norm-wise on the kept sample of each tensor:
``‖x_half − x_fp32‖₂ / ‖x_fp32‖₂`` (``inf`` where the half run is not finite and float32 is).
A tensor of at most 4096 elements is compared whole; a larger one at 4096 seeded positions, the
same in every run (:mod:`layerlab.mixed.capture`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from layerlab.report_render import Displayable  # imports no Rich: it renders on demand

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1


@dataclass
class ModuleRow:
    """One module call in one half-precision run, against the float32 run.

    Attributes:
        path, call, class_name, depth: which call (``call`` 2 for a module's second call).
        dtype: the dtype of its first floating output in this run (what it computed in).
        error: output error vs float32 (the worst output); ``input_error``: the worst input's.
        gain: ``error / input_error``: how much this call's own computation added (``None`` when
            its inputs were exact, as the model's own inputs are under autocast).
        grad_error: error of the gradient that reached its output.
        param, param_error: its own parameter (registered on it directly) with the worst gradient error.
        amax: ``max |output|`` in the float32 run (float16 overflows above 65504).
        finite: every output finite in this run.
        ops: the ops the module's own code ran (not torch.nn's internals), grouped by the dtype
            they returned in this run: ``["bfloat16: add mean pow"]``.
        flags: ``precision`` (lost precision here: its own code did), ``non-finite``, ``overflow``
            (non-finite where float32 exceeds the dtype's range), ``inherited`` (a child lost it),
            ``upstream`` (its output is off only because its input already was: the finding names
            the op before it, or says it was lost before it ran).
    """

    path: str
    call: int
    class_name: str
    depth: int
    dtype: Optional[str] = None
    error: Optional[float] = None
    input_error: Optional[float] = None
    gain: Optional[float] = None
    grad_error: Optional[float] = None
    param: Optional[str] = None
    param_error: Optional[float] = None
    amax: Optional[float] = None
    finite: bool = True
    ops: List[str] = field(default_factory=list)
    flags: List[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        from layerlab.probe.report import call_label

        return call_label(self.path, self.call)


@dataclass
class ParamRow:
    """One trainable parameter's gradient in one run: ``error`` vs float32; ``zeroed``: the share
    of the float32 gradient's norm carried by elements that are exactly 0 here (underflow: only
    elements below 2⁻¹⁴ in float32 count, so a ReLU flipped by rounding is not underflow); ``None``
    in a bfloat16 run, which has float32's exponent range (not measured: nothing underflows there).
    ``negligible``: the float32 gradient is rounding noise around an exact zero (its RMS below
    1e-5 of the median parameter's): not compared (``error`` is ``None``)."""

    name: str
    error: Optional[float]
    zeroed: Optional[float] = 0.0
    negligible: bool = False


@dataclass
class Finding:
    """Something seen. ``severity``: ``error`` fails the check, ``warning`` does not, ``info``.

    ``kind``: ``overflow``, ``non-finite``, ``precision``, ``underflow``, ``gradient``, ``raised``, ``unsupported``
    (measured in a run) or ``fp16-overflow``, ``fp16-underflow`` (forecast from float32 values); a
    ``gradient`` finding is ``info`` where a float32 replay on the half run's kink sides explained it
    (:mod:`~layerlab.mixed.kinks`). ``where`` names the module call (or parameter); ``cause`` says why, when it can be told;
    ``fix`` what to change; ``source`` the user's ``file:line`` of the op it blames."""

    severity: str
    kind: str
    where: str
    message: str
    cause: Optional[str] = None
    fix: Optional[str] = None
    source: Optional[str] = None
    run: Optional[str] = None


@dataclass
class PrecisionRun:
    """One half-precision run compared with float32.

    Attributes:
        label: ``autocast bfloat16``, ``cast float16``, ``autocast float16 + GradScaler``.
        kind: ``autocast`` (torch.autocast: parameters stay float32, ops in its lists run in
            ``dtype``) or ``cast`` (the whole model and its inputs in ``dtype``).
        grad_scale: the loss scale of a GradScaler run (its default first scale, 2¹⁶), else ``None``.
        tolerance: the bars (:class:`~layerlab.mixed.dtypes.Tolerance`).
        output_error: the model output's error; ``grad_error``: the worst parameter gradient's.
        rows, params: per module call, per parameter.
        findings: what failed (``error``) or deserves a look (``warning``) in this run.
        raised: the exception the model raised in this run (it then has no rows).
    """

    label: str
    kind: str
    dtype: str
    tolerance: Any
    grad_scale: Optional[float] = None
    output_error: Optional[float] = None
    grad_error: Optional[float] = None
    rows: List[ModuleRow] = field(default_factory=list)
    params: List[ParamRow] = field(default_factory=list)
    findings: List[Finding] = field(default_factory=list)
    raised: Optional[str] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def first(self) -> Optional[Finding]:
        """The first module that loses precision (or overflows) in this run, if one does."""
        return next((f for f in self.findings if f.severity == "error"), None)

    def row(self, path: str, call: int = 1) -> ModuleRow:
        for r in self.rows:
            if r.path == path and r.call == call:
                return r
        raise KeyError(f"no row {path!r} call {call}")


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class PrecisionReport(Displayable):
    """Everything ``layerlab precision-check`` measured.

    Attributes:
        target, model, device, mode, inputs: what ran, where.
        loss: the loss differentiated (the same seeded projection in every run).
        runs: one per half-precision setting, compared with the float32 run.
        forecast: what float16 would do, read from the float32 values (``fp16-overflow``,
            ``fp16-underflow``): warnings, never a failure by themselves (the fp16 run is the test).
        skipped: settings that could not run here, with why (``autocast float16: needs CUDA``).
        samples: elements kept per tensor (see :mod:`~layerlab.mixed.capture`).
        notes: how it was measured, calls not kept, anything odd.
        seconds: wall time of the whole check; ``float32_seconds``: of the float32 run inside it.
    """

    target: str
    model: str
    device: str
    mode: str
    inputs: Dict[str, Any]
    loss: str
    runs: List[PrecisionRun] = field(default_factory=list)
    forecast: List[Finding] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    samples: int = 0
    notes: List[str] = field(default_factory=list)
    seconds: float = 0.0
    float32_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)

    @property
    def findings(self) -> List[Finding]:
        return [f for r in self.runs for f in r.findings] + list(self.forecast)

    def run(self, label: str) -> PrecisionRun:
        for r in self.runs:
            if r.label == label:
                return r
        raise KeyError(f"no run {label!r} (ran: {', '.join(r.label for r in self.runs)})")

    def to_dict(self) -> dict:
        from layerlab.serialize import to_jsonable

        return {
            "schema": SCHEMA_VERSION,
            "kind": "precision-report",
            "ok": self.ok,
            "target": self.target,
            "model": self.model,
            "device": self.device,
            "mode": self.mode,
            "inputs": self.inputs,
            "loss": self.loss,
            "samples": self.samples,
            "runs": [dict(to_jsonable(r), ok=r.ok, first=to_jsonable(r.first),
                          rows=[dict(to_jsonable(row), label=row.label) for row in r.rows]) for r in self.runs],
            "forecast": to_jsonable(self.forecast),
            "skipped": list(self.skipped),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
            "float32_seconds": round(self.float32_seconds, 4),
        }
