"""The ``steps`` probe's rows and findings, from what its hooks measured (see :mod:`layerlab.probe.probes.steps`).

One row per call of a sequence layer (its steps are its time axis), one row per cell module (its
steps are its calls, in order). Series: ``h_norm`` (‖h_t‖), ``grad_norm`` (‖∂L/∂x_t‖),
``sigmoid_sat`` and ``tanh_sat`` (fractions saturated per step, layerlab's layers only).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from layerlab.errors import Problem
from layerlab.probe.probes.base import ProbeRow
from layerlab.probe.probes.gate_saturation import fractions, per_step

__all__ = ["rows_and_findings"]


def rows_and_findings(calls: list) -> Tuple[List[ProbeRow], List[Problem]]:
    from layerlab.probe.probes.steps import SATURATED, VANISH_RATIO

    rows: List[ProbeRow] = []
    cells: Dict[str, list] = {}
    for rec in calls:
        if rec.kind == "cell":
            cells.setdefault(rec.path, []).append(rec)
        else:
            rows.append(_sequence_row(rec))
    for path, recs in cells.items():
        rows.append(_cell_row(path, recs))
    findings = []
    for row in rows:
        findings += _findings(row, VANISH_RATIO, SATURATED)
    return rows, findings


def _sequence_row(rec) -> ProbeRow:
    module = rec.module
    steps = len(rec.h_norm)
    directions = 2 if getattr(module, "bidirectional", False) else 1
    row = ProbeRow(path=rec.path or "(root)", class_name=_class(module), call=rec.number,
                   series={"h_norm": list(rec.h_norm)})
    sat: Dict[str, List[Optional[float]]] = {}
    if rec.ops:
        grouped = per_step(rec.ops, steps, getattr(module, "num_layers", 1), directions)
        if grouped is None:
            row.flags.append("gates not attributed to steps")
        else:
            for step in grouped:
                for kind, value in fractions(step).items():
                    sat.setdefault(kind, []).append(value)
    _fill(row, rec.grad_norm, sat, rec.skipped, bidirectional=directions == 2)
    return row


def _cell_row(path: str, recs: list) -> ProbeRow:
    row = ProbeRow(path=path or "(root)", class_name=_class(recs[0].module),
                   series={"h_norm": [r.h_norm[0] for r in recs]})
    grads = [r.grad_norm[0] if r.grad_norm else None for r in recs]
    sat: Dict[str, List[Optional[float]]] = {}
    if all(r.ops is not None for r in recs):
        for r in recs:
            for kind, value in fractions(r.ops).items():
                sat.setdefault(kind, []).append(value)
    skipped = next((r.skipped for r in recs if r.skipped), None)
    _fill(row, grads if None not in grads else None, sat, skipped, bidirectional=False)
    return row


def _fill(row: ProbeRow, grads, sat, skipped, bidirectional: bool) -> None:
    h = row.series["h_norm"]
    row.values = {"steps": float(len(h)), "h_last": h[-1] if h else None, "grad_ratio": None,
                  "sigmoid_sat": None, "tanh_sat": None}
    if grads is not None:
        row.series["grad_norm"] = list(grads)
        row.values["grad_ratio"] = _ratio(grads, bidirectional)
    elif skipped:
        row.flags.append(f"no gradient: {skipped}")
    for kind, values in sat.items():
        present = [v for v in values if v is not None]
        if present and len(present) == len(values):
            row.series[f"{kind}_sat"] = values
            row.values[f"{kind}_sat"] = sum(values) / len(values)
    if bidirectional:
        row.flags.append(_BIDIRECTIONAL)


#: a bidirectional layer's grad x₀/x_T is the weakest step's over the strongest's: either end may be the far one
_BIDIRECTIONAL = "bidirectional: grad ratio = weakest/strongest step"


def _ratio(grads: List[float], bidirectional: bool) -> Optional[float]:
    """‖∂L/∂x_first‖ / ‖∂L/∂x_last‖ (a bidirectional layer: the smallest over the largest)."""
    if len(grads) < 2:
        return None
    if bidirectional:
        top = max(grads)
        return min(grads) / top if top > 0 else None
    return grads[0] / grads[-1] if grads[-1] > 0 else None


def _findings(row: ProbeRow, vanish: float, saturated: float) -> List[Problem]:
    out = []
    where = row.path if row.call in (None, 1) else f"{row.path} (call {row.call})"
    grads = row.series.get("grad_norm")
    ratio = row.values.get("grad_ratio")
    if grads and ratio is not None and ratio < vanish:
        row.flags.append("vanishing over time")
        last = len(grads) - 1
        if _BIDIRECTIONAL in row.flags:
            low, high = grads.index(min(grads)), grads.index(max(grads))
            what = f"at step {low} is {ratio:.2g} of the largest (step {high})"
        else:
            below = next(t for t in range(last, -1, -1) if grads[t] < vanish * grads[last])
            what = (f"at step 0 is {ratio:.2g} of the gradient at the last step ({last}); it is below "
                    f"{vanish:g} of it from step {below} back")
        out.append(Problem(
            "steps-vanishing",
            f"the gradient reaching the input of {where} ({row.class_name}) {what}: with this loss and at "
            "this initialisation, what the early steps carry barely reaches the loss",
            where=row.path, data={"grad_norm": grads, "ratio": ratio, "threshold": vanish},
            hint="a loss on the last step only must carry its gradient back through every step; shorter or "
                 "truncated sequences, a forget-gate bias of 1, a GRU/LSTM instead of a plain RNN, or attention/"
                 "skip connections over time shorten that path",
        ))
    for kind in ("sigmoid", "tanh"):
        value = row.values.get(f"{kind}_sat")
        if value is not None and value > saturated:
            row.flags.append(f"{kind} saturated")
            out.append(Problem(
                "steps-saturated",
                f"{value:.0%} of the {kind} gate values of {where} ({row.class_name}) are saturated on average "
                f"over its {len(row.series['h_norm'])} steps ({'< 0.01 or > 0.99' if kind == 'sigmoid' else '|·| > 0.99'}"
                "): their derivative is below 0.02, so little gradient passes through them",
                where=row.path, data={f"{kind}_sat": row.series.get(f"{kind}_sat")},
                hint="look at the scale of the layer's input and weights (large inputs or weights drive the gates "
                     "into their flat ends)",
            ))
    return out


def _class(module) -> str:
    name = type(module).__name__
    return f"layerlab {name}" if type(module).__module__.startswith("layerlab.layers") else name
