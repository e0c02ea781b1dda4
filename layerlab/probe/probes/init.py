"""The ``init`` probe: every weight's std next to torch's default, Kaiming and Xavier, and the findings.

One row per weight (``weight``, ``in_proj_weight``, ``weight_ih_l0`` …; biases are left out), in
the report's parameter order:

    std        the weight's std now (population std, over all its elements)
    default    the std torch's default init gives this layer: measured on a freshly reset deep copy
               of the module that owns it (see :mod:`layerlab.probe.probes.init_expected`); ``None``
               for a module without ``reset_parameters``
    kaiming    gain / √fan_in, for the nonlinearity that follows the layer (shown after the class name,
               ``Linear → ReLU``), ``None`` below 2 dims or where the layout is not torch's
    xavier     gain · √(2 / (fan_in + fan_out))
    fan_in     torch's fan-in of the weight; ``gain`` the gain used for both

A last row, ``std by depth``, holds the output std of each weighted layer (first call of
each, in the order they finished) as a series: where the signal grows or shrinks through depth.
Findings are those of the short form that every ``inspect`` runs
(:mod:`layerlab.probe.probes.init_findings`): zero init that starves gradients, N(0, 1) init in deep
stacks, a forward std that grows or shrinks layer over layer. With this probe asked for, the short
form does not run again.

The probe adds no hooks: it reads the weights and the assembled report. Its cost is one deep copy
and one reset per module that owns a weight (under a forked, seeded RNG: the caller's random state
is left as it was).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow, ProbeRun
from layerlab.probe.probes.init_expected import (gain_of, is_weight, known_layout, next_activation,
                                                 reference_stds, torch_default_stds)
from layerlab.probe.probes.init_findings import depth_series, init_findings, normal_weights, zero_weights

__all__ = ["InitProbe"]

COLUMNS = {"std": "std", "default": "torch default", "kaiming": "Kaiming", "xavier": "Xavier",
           "fan_in": "fan-in", "gain": "gain"}


class InitProbe(Probe):
    """Weights' stds against torch's default, Kaiming and Xavier; zero and N(0, 1) init; std by depth."""

    name = "init"
    title = "Initialisation"

    def __init__(self) -> None:
        self._root: Optional[nn.Module] = None
        self._seed = 0

    def attach(self, run: ProbeRun) -> None:
        self._root = run.module
        self._seed = run.seed if run.seed is not None else 0

    def result(self, report: Any) -> ProbeResult:
        result = ProbeResult(name=self.name, title=self.title, columns=dict(COLUMNS))
        root = self._root
        if root is None:
            result.note = "the probe was not attached to a run"
            return result
        zero = set(zero_weights(report).values())
        normal = {name for name, _, _ in normal_weights(report, root)}
        defaults = {}
        for p in report.params:
            if not is_weight(p.name) or not p.numel:
                continue
            owner = _submodule(root, p.module)
            attr = p.name.rpartition(".")[2]
            weight = getattr(owner, attr, None) if owner is not None else None
            if not isinstance(weight, torch.Tensor):
                continue
            gain = kaiming = xavier = None  # a 1-D weight (a norm's scale) has no fans
            if weight.dim() >= 2:
                label, nonlinearity, param = next_activation(report.calls, p.module, root)
                gain = gain_of(nonlinearity, param)
                kaiming, xavier = reference_stds(weight, gain) if known_layout(owner) else (None, None)
            if id(owner) not in defaults:  # one copy and reset per module
                defaults[id(owner)] = torch_default_stds(owner, self._seed)
            default = defaults[id(owner)].get(attr)
            fan_in = torch.nn.init._calculate_fan_in_and_fan_out(weight)[0] if weight.dim() >= 2 else None
            flags = (["zero"] if p.name in zero else []) + (["N(0,1)"] if p.name in normal else [])
            cls = type(owner).__name__
            result.rows.append(ProbeRow(
                path=p.name, class_name=f"{cls} → {label}" if weight.dim() >= 2 else cls,
                values={"std": float(weight.detach().double().std(correction=0)) if weight.numel() > 1 else None,
                        "default": default, "kaiming": kaiming, "xavier": xavier,
                        "fan_in": float(fan_in) if fan_in is not None else None, "gain": gain},
                flags=flags,
            ))
        labels, stds = depth_series(report)
        if stds:
            result.rows.append(ProbeRow(path="std by depth", class_name=f"{len(stds)} weighted layers",
                                        series={"std_by_depth": stds}))
            result.summary["std_by_depth"] = {"layers": labels, "std": stds}
        result.findings = init_findings(report, root)
        result.note = ("torch default: the std after reset_parameters() on a deep copy of the owning module "
                       f"(seed {self._seed}); Kaiming = gain/√fan_in, Xavier = gain·√(2/(fan_in+fan_out)), gain for "
                       "the activation module that follows (F.relu in a forward is not seen: 'linear')")
        return result


def _submodule(root: nn.Module, path: str) -> Optional[nn.Module]:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None
