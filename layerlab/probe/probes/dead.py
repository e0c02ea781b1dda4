"""The ``dead`` probe: ReLU units that are zero for the whole batch, and saturated sigmoid/tanh units.

It watches the activation calls themselves (a ``TorchFunctionMode``, so ``nn.ReLU``, ``F.relu``,
``torch.relu``, ``x.relu_()`` and ``nn.ReLU6``'s hardtanh(0, 6) in the model's code are all seen,
as are ``torch.sigmoid``/``torch.tanh`` and ``nn.Sigmoid``/``nn.Tanh``) and reads the
pre-activation before the call runs (an in-place ReLU overwrites it). A unit is one channel of the
activation's input (axis from the layout, see :mod:`layerlab.probe.probes.channels`); its samples
are every other element of the batch (batch × positions).

* dead: the pre-activation is ≤ 0 for every sample, so the output and its gradient are exactly 0;
* saturated: every sample beyond the point where the derivative is < 0.2 % of its maximum:
  ``|tanh(x)| ≥ 0.999`` (``|x| ≥ 3.80``), ``sigmoid(x) ≤ 0.001`` or ``≥ 0.999`` (``|x| ≥ 6.91``).
  The tanh and sigmoid inside an activation's own code (GELU's tanh approximation, SiLU written
  as ``x * sigmoid(x)``) are not units and are skipped.

When is that a problem rather than chance? A healthy ReLU unit is zero on about half its samples,
so on a small batch it can be zero on all of them; and at random initialisation a few units of a
deep ReLU stack sit just below zero on a given batch. A **warning** needs at least
:data:`MIN_SAMPLES` samples per unit and either a die-off (≥ :data:`DIE_OFF` of the layer's units
dead) or a unit that is *far* from ever firing: its largest pre-activation below −2 × the
standard deviation of the whole layer's pre-activations, or constant over the batch. Other dead or
saturated units are listed in the table and summed up in a note.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from layerlab.errors import Problem
from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow, ProbeRun, quiet
from layerlab.probe.probes.channels import axis_for, rows_by_channel
from layerlab.probe.probes.frames import CallCounter, innermost_module

MIN_SAMPLES = 64
DIE_OFF = 0.25
FAR = 2.0
#: |pre-activation| beyond which the unit is saturated: atanh(0.999), logit(0.999)
SATURATION = {"tanh": 3.8002, "sigmoid": 6.9068}

_RELU = {torch.relu, torch.relu_, F.relu, F.relu_, torch.Tensor.relu, torch.Tensor.relu_, F.relu6}
_HARDTANH = {F.hardtanh, F.hardtanh_}
_SIGMOID = {torch.sigmoid, torch.sigmoid_, F.sigmoid, torch.Tensor.sigmoid, torch.Tensor.sigmoid_}
_TANH = {torch.tanh, torch.tanh_, F.tanh, torch.Tensor.tanh, torch.Tensor.tanh_}
#: ops whose 3-D output has its channels on dim 1 / last (provenance for an activation's input)
_FIRST = {F.conv1d, F.conv_transpose1d, F.batch_norm, F.instance_norm, F.group_norm, F.max_pool1d, F.avg_pool1d,
          F.adaptive_avg_pool1d, F.adaptive_max_pool1d}
_LAST = {F.linear, F.layer_norm, F.embedding, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
         F.bilinear}
_INNER_ACTIVATIONS = ("gelu", "silu", "swish", "mish", "sigmoidlinear", "quickgelu")


def _kind(func, args, kwargs) -> str:
    if func in _RELU:
        return "relu"
    if func in _HARDTANH:
        low = kwargs.get("min_val", args[1] if len(args) > 1 else -1.0)
        return "relu" if low == 0 else ""
    if func in _SIGMOID:
        return "sigmoid"
    if func in _TANH:
        return "tanh"
    return ""


class _Watch(TorchFunctionMode):
    def __init__(self, probe: "DeadProbe", run: ProbeRun) -> None:
        super().__init__()
        self.probe, self.run = probe, run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            kind = _kind(func, args, kwargs)
        except TypeError:  # an unhashable callable
            kind = ""
        if kind and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() and args[0].numel():
            self.probe.seen(self.run, kind, args[0])
        out = func(*args, **kwargs)
        if (func in _FIRST or func in _LAST) and isinstance(out, torch.Tensor) and out.dim() == 3:
            self.probe.sides[out] = "first" if func in _FIRST else "last"
        return out


class DeadProbe(Probe):
    name = "dead"
    title = "Dead ReLU units and saturated sigmoid/tanh units"

    def __init__(self) -> None:
        self.rows: List[ProbeRow] = []
        self.counter = CallCounter()
        self.sides = WeakIdKeyDictionary()
        self.warn: List[Dict[str, Any]] = []
        self.weak: List[str] = []

    def attach(self, run: ProbeRun) -> None:
        run.context(lambda: _Watch(self, run))

    def seen(self, run: ProbeRun, kind: str, x: torch.Tensor) -> None:
        module, path = innermost_module(run.path_of)
        class_name = type(module).__name__ if module is not None else ""
        if kind != "relu" and any(k in class_name.lower() for k in _INNER_ACTIVATIONS):
            return
        with quiet():
            row = self._measure(kind, x.detach(), self.sides.get(x), path, class_name)
        if row is not None:
            self.rows.append(row)

    def _measure(self, kind: str, x: torch.Tensor, side, path: str, class_name: str):
        axis, label = axis_for(x.dim(), side)
        if axis is None:
            return None
        units = rows_by_channel(x, axis).float()  # (samples, C)
        samples, C = units.shape
        top, low = units.amax(0), units.amin(0)
        if kind == "relu":
            bad = top <= 0
            spread = units.double().std() if units.numel() > 1 else units.new_zeros(())  # float64: no underflow
            far = bad & ((top < -FAR * spread) | (top == low))
        else:
            t = SATURATION[kind]
            bad = (low >= t) | (top <= -t)
            far = bad
        idx = bad.nonzero().flatten().tolist()
        call = self.counter.next(path)
        label_text = f"{path or '(root)'}" + (f" call {call}" if call > 1 else "")
        if not any(a in class_name.lower() for a in ("relu", "sigmoid", "tanh")):  # F.relu, torch.sigmoid in a forward
            label_text = f"{label_text}'s forward (a functional {kind} call)"
        what = "dead" if kind == "relu" else "saturated"
        if idx:
            enough = samples >= MIN_SAMPLES
            if enough and (len(idx) >= DIE_OFF * C or bool(far.any())):
                self.warn.append({"where": path, "label": label_text, "kind": kind, "units": idx, "of": C,
                                  "samples": samples, "what": what})
            else:
                self.weak.append(f"{label_text}: {len(idx)}/{C}")
        flags = [f"{what}: " + ", ".join(map(str, idx[:8])) + (f" … ({len(idx)})" if len(idx) > 8 else "")] if idx else []
        if "guess" in label:
            flags.append("C guessed")
        if idx and samples < MIN_SAMPLES:
            flags.append(f"only {samples} samples per unit")
        return ProbeRow(path=path, class_name=class_name, call=call,
                        values={"units": C, "samples": samples, "axis": axis, "dead": len(idx) if kind == "relu" else 0,
                                "saturated": len(idx) if kind != "relu" else 0, "fraction": len(idx) / C},
                        series={}, flags=[kind] + flags)

    def result(self, report: Any) -> ProbeResult:
        findings = []
        for w in self.warn:
            units = w["units"]
            shown = ", ".join(map(str, units[:12])) + (f" … ({len(units)} in all)" if len(units) > 12 else "")
            if w["what"] == "dead":
                message = (f"{len(units)} of {w['of']} ReLU units of {w['label']} are zero for all {w['samples']} "
                           f"samples of the batch (units {shown}): no gradient reaches their weights")
                hint = ("a large negative bias or a too-large learning rate step; re-initialise them, lower the "
                        "learning rate, or use LeakyReLU/GELU")
            else:
                message = (f"{len(units)} of {w['of']} {w['kind']} units of {w['label']} are saturated on all "
                           f"{w['samples']} samples (units {shown}): their gradient is < 0.2% of its maximum")
                hint = "normalise the input of this activation (LayerNorm/BatchNorm) or scale its initialisation down"
            findings.append(Problem(code=f"{w['what']}-units", message=message, where=w["where"] or "(root)", hint=hint,
                                    data={"units": units, "of": w["of"], "samples": w["samples"]}))
        if self.weak:
            findings.append(Problem(
                code="inactive-units", severity="info",
                message="units zero (or saturated) on this whole batch but not conclusively dead: "
                        + ", ".join(self.weak[:4]) + (f" … ({len(self.weak)} in all)" if len(self.weak) > 4 else ""),
                hint=f"fewer than {MIN_SAMPLES} samples per unit, or close to switching on; run a larger batch to tell",
                data={"calls": self.weak}))
        return ProbeResult(
            name=self.name, title=self.title,
            columns={"units": "units", "samples": "samples", "axis": "C dim", "dead": "dead",
                     "saturated": "saturated", "fraction": "fraction"},
            rows=self.rows, findings=findings,
            summary={"min_samples": MIN_SAMPLES, "die_off_fraction": DIE_OFF, "far_in_std": FAR,
                     "saturation_abs_preactivation": SATURATION},
            note=None if self.rows else "no ReLU, sigmoid or tanh call seen",
        )
