"""The dtype the value-exact checks run in, and their tolerances: float64, or float32 where a kernel refuses float64.

gradcheck, reference parity, batch independence / consistency and causality compare values that
must be *exactly* equal (or zero) in exact arithmetic, so they run a float64 copy: there rounding
is ~1e-16 and any difference above ~1e-9 is the maths. Some kernels have no float64 version
(``torch._grouped_mm``, which Hugging Face's Mixtral and OLMoE expert layers call): the float64
copy raises, and without a fallback every one of those checks would be lost.

:func:`exact_dtype` probes once per case: the float64 copy runs one forward. When it raises inside
torch or an installed library (the kernel refused, not the layer's own code) *and* the float32
copy runs, the checks fall back to float32 and say so, naming the module and the op that refused.
Their thresholds are then widened by the rounding *measured* on this model in float32:

* run-to-run: the same forward twice (a kernel that is not deterministic);
* perturbation size: every weight and floating input moved by about one float32 ulp
  (``x·(1 + ε·u)``, ``u`` uniform in [−1, 1], ε float32's resolution), which is how far float32
  rounding inside the forward can move the output.

``rounding`` is the larger of the two, relative to the output's largest value (at least ε). A
dependence that must be exactly zero (another sample, a later position) is a finding only above
``ROUNDING_SAFETY × rounding`` relative to the values it is compared with. Real leaks are orders
of magnitude above that (measured on tiny Mixtral and OLMoE: rounding 2.1e-7 relative, so the
threshold is 2.1e-5; a mask that lets position t see t + 1 moves the output by 0.19–0.23 relative).

This is the single place for the exactness thresholds of these checks, in float64 too.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

#: float64: a dependence that must be zero is a finding above this fraction of the value it is
#: compared with (float64 rounding is ~1e-16 relative; 1e-9 leaves room for long sums)
FLOAT64_RELATIVE = 1e-9
#: float64: below this absolute size a gradient or a change is zero whatever it is compared with
FLOAT64_ABSOLUTE = 1e-12
#: float32 fallback: thresholds are this many times the measured rounding (rounding grows with the
#: number of ops, which the one-ulp perturbation samples only once per op)
ROUNDING_SAFETY = 100.0


@dataclass
class ExactDtype:
    """The dtype the exact checks run in, and why.

    Attributes:
        dtype: ``torch.float64``, or ``torch.float32`` when float64 is refused.
        refused_by: the module path and class that refused float64 (empty: none did).
        op: the function that raised (``grouped_mm at functional.py:7139``).
        error: the first line of the refusal.
        rounding: the measured float32 rounding, relative to the output's largest value (0: float64).
        measured: the numbers ``rounding`` comes from, per output.
    """

    dtype: torch.dtype = torch.float64
    refused_by: str = ""
    op: str = ""
    error: str = ""
    rounding: float = 0.0
    measured: Dict[str, Dict[str, float]] = field(default_factory=dict)

    @property
    def fallback(self) -> bool:
        return self.dtype != torch.float64

    @property
    def relative(self) -> float:
        """A must-be-zero quantity is a finding above this fraction of what it is compared with."""
        return ROUNDING_SAFETY * self.rounding if self.fallback else FLOAT64_RELATIVE

    @property
    def absolute(self) -> float:
        return 0.0 if self.fallback else FLOAT64_ABSOLUTE

    def exceeds(self, value: float, scale: float) -> bool:
        """Is ``value`` (a gradient, a change that must be 0) more than rounding next to ``scale``?"""
        return value > self.absolute + self.relative * scale

    def parity_tol(self, scale: float = 1.0) -> Optional[Tuple[float, float]]:
        """``(rtol, atol)`` for comparing two float32 runs that float64 would compare exactly, next to
        values as large as ``scale`` (``None`` in float64: ``assert_close``'s float64 tolerances hold)."""
        if not self.fallback:
            return None
        return self.relative, self.relative * (scale or 1.0)

    def note(self) -> str:
        """What the report says (empty in float64)."""
        if not self.fallback:
            return ""
        return (f"ran in float32: this model's {self.refused_by} refuses float64 ({self.op}); "
                f"tolerances widened to {self.relative:.2g} relative ({ROUNDING_SAFETY:g}× the measured float32 "
                f"rounding {self.rounding:.2g}: run-to-run and one-ulp perturbation of weights and inputs)")

    def to_dict(self) -> Dict[str, Any]:
        if not self.fallback:
            return {"dtype": "float64"}
        return {"dtype": "float32", "refused_by": self.refused_by, "op": self.op, "error": self.error,
                "rounding": self.rounding, "relative_tolerance": self.relative, "measured": self.measured}


def exact_dtype(case: Any) -> ExactDtype:
    """The dtype (and tolerances) of the exact checks for ``case``; probed once, then kept on the case."""
    found = getattr(case, "_exact_dtype", None)
    if found is None:
        found = _probe(case)
        case._exact_dtype = found
    return found


def _probe(case: Any) -> ExactDtype:
    from layerlab.checks.case import call, cast_args, module_copy

    try:
        module = module_copy(case.module, torch.float64, train=False)
    except Exception:
        return ExactDtype()  # the checks report their own copying problems
    if not any(p.is_floating_point() for p in module.parameters()) and not _float_inputs(case.args):
        return ExactDtype()
    stack: List[str] = []
    handles = _track(module, stack)
    failed_in = ""
    try:
        with torch.no_grad():
            call(module, cast_args(case.args, torch.float64))
        return ExactDtype()
    except Exception as exc:
        failed_in = stack[-1] if stack else ""
        refusal = _library_refusal(exc)
        if refusal is None:
            return ExactDtype()  # the layer's own code raised: the checks report it as the layer's failure
    finally:
        for h in handles:
            h.remove()
    op, error = refusal
    try:
        measured, rounding = _rounding(case)
    except Exception:
        return ExactDtype()  # float32 does not run either: not a float64 refusal
    where = failed_in or type(case.module).__name__
    return ExactDtype(torch.float32, where, op, error, rounding, measured)


def _float_inputs(args: Any) -> bool:
    from layerlab.checks.case import input_tensors

    return any(t.is_floating_point() for _, t in input_tensors(args))


def _track(module: nn.Module, stack: List[str]) -> list:
    """Hooks that keep ``stack`` the modules running now (innermost last): who was running when it raised."""
    handles = []
    for name, m in module.named_modules():
        label = f"`{name}` ({type(m).__name__})" if name else type(m).__name__

        def pre(mod, inp, _label=label):
            stack.append(_label)

        def post(mod, inp, out):
            if stack:
                stack.pop()

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    return handles


def _library_refusal(exc: BaseException) -> Optional[Tuple[str, str]]:
    """``(op, first line)`` when the innermost frame that raised is torch's or an installed
    library's (a kernel refused the dtype), ``None`` when it is the layer's own code."""
    from layerlab.checks.run import _frame_owner

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or _frame_owner(frames[-1].filename) != "torch":
        return None
    last = frames[-1]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{last.name} at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}", f"{type(exc).__name__}: {text}"


def _rounding(case: Any) -> Tuple[Dict[str, Dict[str, float]], float]:
    """How far float32 rounding moves each output of the float32 copy (see the module docstring)."""
    from layerlab.checks.case import call, cast_args, float_leaves, generator, map_args, module_copy

    module = module_copy(case.module, torch.float32, train=False)
    args = cast_args(case.args, torch.float32)
    resolution = torch.finfo(torch.float32).eps
    gen = generator(case.seed, 11)

    def nudge(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        u = torch.rand(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) * 2 - 1
        return t * (1 + resolution * u)

    with torch.no_grad():
        first = float_leaves(call(module, args))
        again = dict(float_leaves(call(module, args)))
        nudged = module_copy(module)
        for p in list(nudged.parameters()) + list(nudged.buffers()):
            if p.is_floating_point():
                p.copy_(nudge(p))
        moved = dict(float_leaves(call(nudged, map_args(args, nudge))))
    measured: Dict[str, Dict[str, float]] = {}
    rounding = resolution
    for path, y in first:
        scale = float(y.abs().max()) if y.numel() else 0.0
        if not scale or not torch.isfinite(y).all():
            continue
        run_to_run = float((again[path] - y).abs().max()) if path in again else 0.0
        ulp = float((moved[path] - y).abs().max()) if path in moved else 0.0
        measured[path] = {"scale": scale, "run_to_run": run_to_run, "one_ulp_perturbation": ulp}
        rounding = max(rounding, run_to_run / scale, ulp / scale)
    return measured, rounding
