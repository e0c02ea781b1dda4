"""The init check's findings, read from the weights' norms and the report's statistics: no hooks.

``layerlab.inspect`` runs this on every report (the short form of ``--probe init``): it costs a
pass over the report's parameter records and calls, plus a ``std`` of the few weights whose RMS is
about 1. Three findings:

    zero-init           a weight matrix (≥ 2-D) that is all zero. The gradient w.r.t. its module's
                        input is ``∂L/∂y · W = 0``, so what reaches the loss only through it gets no
                        gradient on the first step (a skip connection around it still carries one);
                        its own gradient ``∂L/∂y · xᵀ`` is usually non-zero, so the first step
                        moves it and gradient flows from then on (a note: intended for zero-init
                        residual branches and heads). Two consecutive zero layers (the zero layer's
                        input is the all-zero output of another zero layer) never learn: the second
                        gets no weight gradient (its input is 0), the first none through the second
                        (a warning). A zero weight that is frozen or gets exactly zero gradient stays
                        zero (a warning). Where :mod:`layerlab.probe.gradient_root` already reports
                        the same module ("zero-grad-root"), that finding is extended, not repeated.
    init-normal         N(0, 1) init in a deep stack: at least :data:`NORMAL_MIN_LAYERS` weight
                        matrices with std ≈ 1 (:data:`NORMAL_STD`) and fan-in ≥ :data:`NORMAL_MIN_FAN_IN`,
                        each multiplying the forward std by about ``√fan_in`` (Kaiming wants
                        ``gain/√fan_in``). Embeddings are left out (torch's own default is N(0, 1)).
    forward-std-trend   the std of the weighted layers' outputs (first call of each, in the order they
                        finished) grows or shrinks layer over layer: over ≥ :data:`TREND_MIN_LAYERS`
                        layers, by ≥ :data:`TREND_FACTOR` in all, with ≥ :data:`TREND_AGREE` of the
                        layer-to-layer steps each a change of ≥ :data:`TREND_STEP` in that direction
                        (one jump, e.g. after a norm, is not a trend). ``data["std_by_depth"]`` holds
                        the series.

GPT-2/BERT-style ``N(0, 0.02)`` and torch's default init of any layer raise nothing here.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from layerlab.errors import Problem
from layerlab.probe.probes.init_expected import _ACTIVATIONS, _PASS, is_weight, known_layout

__all__ = ["init_findings", "add_init_findings", "depth_series", "normal_weights", "zero_weights"]

NORMAL_STD = (0.8, 1.25)
NORMAL_MIN_FAN_IN = 16
NORMAL_MIN_LAYERS = 3
TREND_FACTOR = 100.0
TREND_MIN_LAYERS = 4
TREND_AGREE = 0.75
TREND_STEP = 1.2

_ZERO_INTENDED = ("Zero init is intended for residual branches and heads (ReZero, AdaLN-Zero, "
                  "zero_init_residual, a fresh classifier head); anywhere else, initialise it")
_PAIR = ("{feeder}, which feeds it an all-zero output, is all zero too: two consecutive zero layers never "
         "learn (the second gets no weight gradient because its input is 0, the first none because the "
         "second's weight is 0; only biases move)")


def add_init_findings(report, root: nn.Module) -> None:
    """The short form: the findings into ``report.problems`` (warnings) and ``report.notes`` (info)."""
    for finding in init_findings(report, root):
        (report.notes if finding.severity == "info" else report.problems).append(finding)


def init_findings(report, root: nn.Module) -> List[Problem]:
    findings = _zero_findings(report, root)
    normal = normal_weights(report, root)
    if len(normal) >= NORMAL_MIN_LAYERS:
        findings.append(_normal_finding(normal))
    trend = _trend_finding(depth_series(report), normal)
    if trend is not None:
        findings.append(trend)
    return findings


# -- zero weights ----------------------------------------------------------------------------------

def zero_weights(report) -> Dict[str, str]:
    """Owner path → parameter name, for every all-zero weight with ≥ 2 dims."""
    out: Dict[str, str] = {}
    for p in report.params:
        if p.numel and len(p.shape) >= 2 and p.norm == 0 and is_weight(p.name):
            out.setdefault(p.module, p.name)
    return out


def _zero_findings(report, root: nn.Module) -> List[Problem]:
    zero = zero_weights(report)
    if not zero:
        return []
    existing = {f.where: f for f in [*report.problems, *report.notes] if f.code == "zero-grad-root"}
    first_call: dict = {}
    for call in report.calls:
        first_call.setdefault(call.path, call)
    calls_of = {path: _call_of(path, first_call) for path in zero}
    feeders = {path: _zero_feeder(report.calls, call, zero) for path, call in calls_of.items() if call is not None}
    fed = {f for f in feeders.values() if f is not None}  # told about with the layer they feed
    findings = []
    for path, name in zero.items():
        if calls_of[path] is None or path in fed:  # unused in this run: it starves nothing here
            continue
        feeder = feeders[path]
        pair = _PAIR.format(feeder=zero[feeder]) if feeder is not None else None
        done = existing.get(path or "(root)")
        if done is not None:  # gradient_root said it already: extend its finding
            done.data["init"] = {"zero": [name] + ([zero[feeder]] if feeder is not None else [])}
            if pair is not None and "two consecutive zero layers" not in done.message:
                done.message += f"; {pair}"
            continue
        findings.append(_zero_finding(report, root, path, name, zero.get(feeder), pair))
    return findings


def _zero_finding(report, root, path, name, feeder_weight, pair) -> Problem:
    own = next((p for p in report.params if p.name == name), None)
    module = _submodule(root, path)
    data = {"zero": [name]}
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        message = f"{name} is all zero: every index maps to the zero vector until it moves"
    else:
        message = (f"{name} is all zero (zero-initialised): the gradient w.r.t. {path or 'the model'}'s input is "
                   "exactly 0 (∂L/∂x = ∂L/∂y · W), so on the first step no gradient flows back through it: what "
                   "reaches the loss only through it gets none (a skip connection around it still carries gradient)")
    severity, hint = "info", None
    if own is not None and not own.trainable:
        message += f"; {name} is frozen, so it stays zero and nothing upstream ever trains through it"
        severity, hint = "warning", f"initialise {name} (or unfreeze it)"
    elif own is not None and own.grad_norm is not None and own.grad_norm == 0:
        message += f"; {name}'s own gradient is exactly 0, so it stays zero"
        severity, hint = "warning", f"initialise {name}"
    elif own is not None and own.grad_norm is not None:
        message += (f"; its own gradient is non-zero (‖grad‖ = {own.grad_norm:.3g}), so the first step moves it "
                    "and gradient flows from then on")
    if pair is not None:
        message += f"; {pair}"
        data["zero"].append(feeder_weight)
        severity, hint = "warning", "initialise at least one of the two (torch's default init, or Kaiming)"
    if severity == "info":
        message += f". {_ZERO_INTENDED}"
    return Problem("zero-init", message, where=path or "(root)", hint=hint, severity=severity, data=data)


def _zero_feeder(calls, call, zero: Dict[str, str]) -> Optional[str]:
    """The zero-weight module whose all-zero output reaches ``call``'s input through activations,
    norms, dropout or reshapes only; ``None`` when there is none."""
    current = call
    for _ in range(16):
        ins = current.tensor_inputs[:1]
        if not ins or ins[0].stats is None or ins[0].stats.zeros != 1.0 or ins[0].source is None:
            return None
        source = calls[ins[0].source]
        if source.path in zero and source.path != call.path:
            return source.path
        if source.class_name not in _ACTIVATIONS and not any(part in source.class_name for part in _PASS):
            return None
        current = source
    return None


def _call_of(path: str, first_call: dict):
    """The first call of the module at ``path``, or of its nearest ancestor that ran."""
    while True:
        if path in first_call:
            return first_call[path]
        if not path:
            return None
        path = path.rpartition(".")[0]


# -- N(0, 1) weights -------------------------------------------------------------------------------

def normal_weights(report, root: nn.Module) -> List[Tuple[str, float, int]]:
    """``(name, std, fan_in)`` of every weight matrix that looks N(0, 1)-initialised with a large fan-in."""
    out = []
    for p in report.params:
        if len(p.shape) < 2 or not p.numel or p.norm is None or not is_weight(p.name):
            continue
        rms = p.norm / math.sqrt(p.numel)
        if not 0.7 <= rms <= 1.4:  # cheap filter on the recorded norm; the std only for these
            continue
        module = _submodule(root, p.module)
        if module is None or "Embedding" in type(module).__name__:
            continue
        weight = getattr(module, p.name.rpartition(".")[2], None)
        if not isinstance(weight, torch.Tensor):
            continue
        std, mean = (float(v) for v in torch.std_mean(weight.detach().double(), correction=0))
        fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(weight)
        fan = fan_in if known_layout(module) else min(fan_in, fan_out)
        if NORMAL_STD[0] <= std <= NORMAL_STD[1] and abs(mean) < 0.1 * std and fan >= NORMAL_MIN_FAN_IN:
            out.append((p.name, std, fan))
    return out


def _normal_finding(normal: List[Tuple[str, float, int]]) -> Problem:
    names = [n for n, _, _ in normal]
    listed = ", ".join(names[:4]) + (f" … ({len(names)} in all)" if len(names) > 4 else "")
    fans = sorted(f for _, _, f in normal)
    fan = fans[len(fans) // 2]
    message = (f"{len(normal)} weight matrices look N(0, 1)-initialised (std ≈ 1 with fan-in ≥ {NORMAL_MIN_FAN_IN}): "
               f"{listed}. Each multiplies the forward std by about √fan_in (≈ {math.sqrt(fan):.3g} at fan-in {fan}), "
               f"so through the stack the signal and the gradients grow geometrically; Kaiming init wants std "
               f"gain/√fan_in (≈ {1 / math.sqrt(fan):.3g} × gain)")
    return Problem("init-normal", message, where=names[0].rpartition(".")[0] or "(root)",
                   hint="nn.init.kaiming_normal_(w, nonlinearity='relu') (or torch's default init) for each",
                   data={"weights": names, "std": [s for _, s, _ in normal], "fan_in": [f for _, _, f in normal]})


# -- the forward std by depth ----------------------------------------------------------------------

def depth_series(report) -> Tuple[List[str], List[float]]:
    """``(labels, stds)``: the output std of each weighted layer's first call, in the order they finished."""
    owners = {p.module for p in report.params if len(p.shape) >= 2 and p.numel and is_weight(p.name)}
    chain = [c for c in report.calls if c.call == 1 and c.status == "ok" and c.path in owners
             and c.end is not None and "Embedding" not in c.class_name]
    chain.sort(key=lambda c: c.end)
    labels, stds = [], []
    for call in chain:
        outs = call.tensor_outputs[:1]
        stats = outs[0].stats if outs else None
        if stats is None or not stats.finite or not stats.std > 0:
            continue
        labels.append(f"{call.path or '(root)'} ({call.class_name})")
        stds.append(float(stats.std))
    return labels, stds


def _trend_finding(series: Tuple[List[str], List[float]], normal) -> Optional[Problem]:
    labels, stds = series
    n = len(stds)
    if n < TREND_MIN_LAYERS:
        return None
    total = stds[-1] / stds[0]
    if TREND_FACTOR > total > 1 / TREND_FACTOR:
        return None
    grows = total > 1
    steps = [b / a for a, b in zip(stds, stds[1:])]
    agree = sum(1 for r in steps if (r >= TREND_STEP if grows else r <= 1 / TREND_STEP))
    if agree < TREND_AGREE * len(steps):
        return None
    per_layer = total ** (1 / (n - 1))
    word = "grows" if grows else "shrinks"
    message = (f"the forward signal's std {word} layer over layer: {stds[0]:.3g} at {labels[0]} → {stds[-1]:.3g} "
               f"at {labels[-1]}, over {n} weighted layers (×{per_layer:.3g} per layer on average)")
    if grows:
        hint = ("initialise each layer for its fan-in (Kaiming: nn.init.kaiming_normal_(w, nonlinearity='relu') "
                "for ReLU stacks), or normalise between layers")
    else:
        hint = ("torch's default Linear/Conv init (kaiming_uniform_ with a=√5, std 1/√(3·fan_in)) shrinks a deep "
                "ReLU stack's signal: use nn.init.kaiming_normal_(w, nonlinearity='relu'), or normalise between layers")
    return Problem("forward-std-trend", message, where=labels[-1].rpartition(" (")[0], hint=hint,
                   data={"std_by_depth": stds, "layers": labels, "factor_per_layer": per_layer,
                         "n_normal_init": len(normal)})


def _submodule(root: nn.Module, path: str) -> Optional[nn.Module]:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None
