r"""The ``rank`` probe: effective rank of each layer's output features (representation collapse).

Per call of every leaf module with a floating output, the output is read as a matrix X with one
row per sample (batch × positions) and one column per feature (the channel axis, see
:mod:`layerlab.probe.probes.channels`). Its **effective rank** (Roy & Vetterli, 2007) is

.. math::

    \operatorname{erank}(X) = \exp\Big(-\sum_i p_i \log p_i\Big), \qquad p_i = \sigma_i / \sum_j \sigma_j

over the singular values :math:`\sigma_i` of X **centred** (each feature's mean over the rows
subtracted: a constant offset shared by every sample carries no information about the sample).
It runs from 1 (every sample on one line through the mean) to ``min(rows − 1, features)`` (shown
as ``max``). All rows equal gives 0.

Cost is capped: at most :data:`MAX_ROWS` rows, taken evenly spaced, and fewer when the features are
many (rows × features × min(rows, features) ≤ :data:`FLOP_BUDGET`); singular values in float64
up to 256 features, float32 beyond.

**Collapse** (a warning) only when unambiguous: the output's erank ≤ :data:`COLLAPSED` while at
least :data:`MIN_ROOM` dimensions were available, and the module's own input (the same rows) has
erank ≥ :data:`MIN_INPUT` (or, for token ids, as many distinct ids): diverse inputs mapped to a line.
An output equal for every sample (erank 0), zero-initialised layers among them, is a note.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional

import torch

from layerlab.errors import Problem
from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow, ProbeRun, quiet
from layerlab.probe.probes.channels import axis_for, rows_by_channel
from layerlab.probe.probes.sparsity import LayoutTracker, first_float, leaf_modules

MAX_ROWS = 1024
FLOP_BUDGET = 2e8
COLLAPSED = 1.5
MIN_ROOM = 8
MIN_INPUT = 4.0
SPECTRUM = 32
#: modules whose output has (almost) its input's rank: their rows would repeat the previous one's
_SAME_RANK = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "Identity")  # normalised singular values kept in the row's series


def _sampled(m: torch.Tensor, rows: int) -> torch.Tensor:
    if m.shape[0] <= rows:
        return m
    idx = torch.linspace(0, m.shape[0] - 1, rows, device=m.device).round().long()
    return m[idx]


def row_budget(features: int) -> int:
    """Rows to keep for this many features: at most MAX_ROWS and within FLOP_BUDGET."""
    rows = MAX_ROWS
    while rows > 16 and rows * features * min(rows, features) > FLOP_BUDGET:
        rows //= 2
    return rows


def effective_rank(m: torch.Tensor) -> tuple:
    """``(erank, normalised singular values)`` of the centred (rows, features) matrix ``m``."""
    dtype = torch.float64 if m.shape[1] <= 256 else torch.float32
    x = m.to(dtype)
    x = x - x.mean(0, keepdim=True)
    s = torch.linalg.svdvals(x)
    total = s.sum()
    scale = m.to(dtype).abs().max()
    # numerically zero next to the values themselves: every row equal
    if total <= 1e-4 * max(float(scale), 1e-30) * math.sqrt(x.numel()) or not torch.isfinite(total):
        return 0.0, s
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum())), s / total


def _input_rank(inputs: tuple, rows: int, n_rows: int) -> Optional[float]:
    """The erank of the module's first tensor input read the same way (token ids: distinct ids)."""
    x = next((v for v in inputs if isinstance(v, torch.Tensor) and v.numel()), None)
    if x is None:
        return None
    if not x.is_floating_point():
        flat = x.reshape(-1)
        return float(_sampled(flat[:, None], rows).unique().numel()) if flat.numel() == n_rows else None
    if x.dim() < 2:
        return None
    m = x.reshape(-1, x.shape[-1]) if x.dim() == 2 or x.shape[-1] * n_rows == x.numel() else None
    if m is None and x.dim() >= 3 and x.shape[1] * n_rows == x.numel():
        m = rows_by_channel(x, 1)
    if m is None or m.shape[0] != n_rows:
        return None
    return effective_rank(_sampled(m, rows))[0]


class RankProbe(Probe):
    name = "rank"
    title = "Rank: effective rank of each layer's output features"

    def __init__(self) -> None:
        self.rows: List[ProbeRow] = []
        self.layout = LayoutTracker()
        self.collapsed: List[dict] = []
        self.constant: List[str] = []

    def attach(self, run: ProbeRun) -> None:
        leaves = [(p, m) for p, m in leaf_modules(run) if type(m).__name__ not in _SAME_RANK]
        for path, module in leaves:
            run.forward_hook(module, self._hook(run, path))
        self.layout.attach(run, leaves)

    def _hook(self, run: ProbeRun, path: str):
        def hook(mod, inputs, output):
            call = run.call_number(mod)
            out = first_float(output)
            if out is None:
                return
            with quiet():
                side = self.layout.side(mod, inputs, out)
                row = self._measure(out.detach(), inputs, side, path, type(mod).__name__, call)
            if row is not None:
                self.rows.append(row)
        return hook

    def _measure(self, out, inputs, side, path, class_name, call) -> Optional[ProbeRow]:
        axis, label = axis_for(out.dim(), side)
        if axis is None:
            return None
        m = rows_by_channel(out, axis)
        n_rows, features = m.shape
        if n_rows < 2 or features < 2:
            return None
        rows = row_budget(features)
        sampled = _sampled(m, rows)
        erank, spectrum = effective_rank(sampled)
        room = min(sampled.shape[0] - 1, features)
        flags = [f"{sampled.shape[0]} of {n_rows} rows"] if sampled.shape[0] < n_rows else []
        if "guess" in label:
            flags.append("C guessed")
        where = path or "(root)"
        if erank <= COLLAPSED and room >= MIN_ROOM:
            before = _input_rank(inputs, rows, n_rows)
            if before is not None and before >= MIN_INPUT:
                if erank == 0.0:
                    self.constant.append(where)
                else:
                    self.collapsed.append({"where": path, "erank": erank, "input": before, "room": room})
                    flags.append(f"collapsed (input erank {before:.1f})")
        return ProbeRow(path=path, class_name=class_name, call=call,
                        values={"features": features, "rows": sampled.shape[0], "erank": erank, "max": room,
                                "ratio": erank / room if room else None},
                        series={"σ/Σσ": [float(v) for v in spectrum[:SPECTRUM].tolist()]}, flags=flags)

    def result(self, report: Any) -> ProbeResult:
        findings = [Problem(
            code="rank-collapse", where=c["where"] or None,
            message=(f"{c['where'] or '(root)'} maps its inputs (effective rank {c['input']:.1f}) onto "
                     f"effective rank {c['erank']:.2f} of {c['room']} possible: its outputs lie on about one line"),
            hint="a rank-1 (or tied) weight, a saturated or dead layer before it, or a normalisation over the wrong dim",
            data={"erank": c["erank"], "input_erank": c["input"], "max": c["room"]}) for c in self.collapsed]
        if self.constant:
            findings.append(Problem(
                code="output-constant", severity="info", where=self.constant[0],
                message="output equal for every sample although the inputs differ: " + ", ".join(self.constant[:4])
                        + (f" … ({len(self.constant)} in all)" if len(self.constant) > 4 else ""),
                hint="a zero-initialised weight (intended in some residual branches) or a layer that ignores its input",
                data={"modules": self.constant}))
        return ProbeResult(
            name=self.name, title=self.title,
            columns={"features": "features", "rows": "rows", "erank": "erank", "max": "max", "ratio": "erank/max"},
            rows=self.rows, findings=findings,
            summary={"centred": True, "max_rows": MAX_ROWS, "collapsed_at_or_below": COLLAPSED,
                     "min_room": MIN_ROOM, "min_input_erank": MIN_INPUT},
            note=None if self.rows else "no leaf module output with at least 2 samples and 2 features",
        )
