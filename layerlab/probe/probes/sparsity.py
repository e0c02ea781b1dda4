"""The ``sparsity`` probe: how much of each module's output is zero, in all and per channel.

Per call of every leaf module (a module with no submodules: the layers that compute; a container's
output is its last child's) with a floating tensor output, the first such output:

* ``zeros``: the fraction of elements exactly ``0`` (what ReLU, dropout and masking make);
* ``near 0``: the fraction with ``|x| ≤ 1e-3 · RMS(x)``, exact zeros included: values that are
  negligible next to the output's own typical size (GELU's and SiLU's tails, underflow). Relative
  to the output rather than absolute, so that a layer working at scale 1e-4 is not "all zero";
* per channel (the axis is chosen from the layout, see :mod:`layerlab.probe.probes.channels`, and
  shown as ``C dim``): the smallest and largest fraction of exact zeros of one channel, and how
  many channels are zero everywhere. The per-channel fractions are the row's ``zeros/ch`` series
  (more than 512 channels: binned into 512 means, the row says so).

Findings: a note for a module whose output is exactly zero everywhere (a zero-initialised layer,
a dead stack); nothing else is judged here (``dead`` says which units never fire).
"""

from __future__ import annotations

from typing import Any, List

import torch
from torch.utils.weak import WeakIdKeyDictionary

from layerlab.errors import Problem
from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow, ProbeRun, quiet
from layerlab.probe.probes.channels import axis_for, capped, is_elementwise, maker_side
from layerlab.probe.safe_norm import deferred_norm

#: near zero: |x| ≤ NEAR · RMS(x)
NEAR = 1e-3
#: elements per slice of the batch dim measured at a time
_SLICE = 1 << 17


def first_float(value: Any):
    """The first floating tensor in a module's output (a tensor, or a tuple/list/dict holding one)."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() and value.numel() else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for v in items:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
            return v
    return None


class LayoutTracker:
    """The layout side of the tensors modules made, so that an activation's output inherits the
    side of the tensor it was computed from (a 3-D ReLU output after a Conv1d is (N, C, L)).
    Containers that fix a layout (``nn.MultiheadAttention``, a transformer layer) get a hook of
    their own: their output feeds the next leaf."""

    def __init__(self) -> None:
        self.sides = WeakIdKeyDictionary()

    def attach(self, run: ProbeRun, leaves) -> None:
        hooked = {id(m) for _, m in leaves}
        for _, module in run.named_modules:
            if id(module) not in hooked and maker_side(type(module).__name__) is not None:
                run.forward_hook(module, self._remember)

    def _remember(self, module, inputs, output) -> None:
        out = first_float(output)
        if out is not None and out.dim() == 3:
            self.sides[out] = maker_side(type(module).__name__)

    def side(self, module: Any, inputs: tuple, out: torch.Tensor):
        name = type(module).__name__
        side = maker_side(name)
        if side is None and is_elementwise(name) and inputs and isinstance(inputs[0], torch.Tensor):
            side = self.sides.get(inputs[0])
        if side is not None and out.dim() == 3:
            self.sides[out] = side
        return side


def leaf_modules(run: ProbeRun):
    return [(path, m) for path, m in run.named_modules if next(iter(m.children()), None) is None]


class SparsityProbe(Probe):
    name = "sparsity"
    title = "Sparsity: zeros in each module's output"

    def __init__(self) -> None:
        self.rows: List[ProbeRow] = []
        self.layout = LayoutTracker()

    def attach(self, run: ProbeRun) -> None:
        leaves = leaf_modules(run)
        for path, module in leaves:
            run.forward_hook(module, self._hook(run, path, module))
        self.layout.attach(run, leaves)

    def _hook(self, run: ProbeRun, path: str, module: Any):
        def hook(mod, inputs, output):
            call = run.call_number(mod)
            out = first_float(output)
            if out is None:
                return
            with quiet():
                side = self.layout.side(mod, inputs, out)
                self.rows.append(measure(out, path, type(mod).__name__, call, side))
        return hook

    def result(self, report: Any) -> ProbeResult:
        zero = [r.path or "(root)" for r in self.rows if r.values.get("zeros") == 1.0]
        findings = []
        if zero:
            findings.append(Problem(
                code="output-all-zero", severity="info", where=zero[0],
                message=f"output exactly zero everywhere: {', '.join(zero[:4])}" + (f" … ({len(zero)} in all)" if len(zero) > 4 else ""),
                hint="a zero-initialised layer (intended in some residual branches), or everything before it is dead",
                data={"modules": zero}))
        return ProbeResult(
            name=self.name, title=self.title,
            columns={"zeros": "zeros", "near_zero": "near 0", "channels": "C", "axis": "C dim",
                     "channel_min": "min/ch", "channel_max": "max/ch", "zero_channels": "all-0 ch"},
            rows=self.rows, findings=findings,
            summary={"near_zero": f"|x| <= {NEAR} * RMS(x)", "modules": "leaf modules, first floating output"},
            note=None if self.rows else "no leaf module produced a floating tensor",
        )


def measure(out: torch.Tensor, path: str, class_name: str, call: int, side) -> ProbeRow:
    """One row: exact and near zeros of ``out``, in all and per channel."""
    x = out.detach()
    n = x.numel()
    rms = deferred_norm(x) / n ** 0.5  # scaled by max |x|: a float32 square under/overflows at 1e∓19
    threshold = NEAR * rms
    axis, label = axis_for(x.dim(), side)
    flags: List[str] = []
    series = {}
    if axis is None:
        zeros, near = torch.count_nonzero(x == 0), torch.count_nonzero(x.abs() <= threshold)
        return ProbeRow(path=path, class_name=class_name, call=call, flags=flags,
                        values={"zeros": float(zeros) / n, "near_zero": float(near) / n})
    # in slices of the batch dim: the temporaries stay in cache (about 2× faster on large outputs)
    reduce = [d for d in range(x.dim()) if d != axis]
    step = max(1, _SLICE // max(1, n // x.shape[0]))
    per_count = torch.zeros(x.shape[axis], dtype=torch.long, device=x.device)
    near = 0
    for i in range(0, x.shape[0], step):
        part = x[i:i + step]
        per_count += (part == 0).sum(dim=reduce)
        near += int(torch.count_nonzero(part.abs() <= threshold))
    rows = n // per_count.numel()
    per = per_count.double() / rows
    values = {"zeros": float(per_count.sum()) / n, "near_zero": near / n, "channels": per.numel(), "axis": axis,
              "channel_min": float(per.min()), "channel_max": float(per.max()),
              "zero_channels": int((per_count == rows).sum())}
    series["zeros/ch"], binned = capped(per)
    if binned:
        flags.append(binned)
    if "guess" in label:
        flags.append("C guessed")
    return ProbeRow(path=path, class_name=class_name, call=call, values=values, series=series, flags=flags)
