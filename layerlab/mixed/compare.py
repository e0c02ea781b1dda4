"""A half-precision run against the float32 run: per module call and per parameter, numbers only.

Which of these numbers is a problem is :mod:`layerlab.mixed.diagnose`'s business.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import torch

from layerlab.mixed.capture import CallSeen, Key, Seen
from layerlab.mixed.dtypes import FP16_TINY
from layerlab.mixed.report import ModuleRow, ParamRow
from layerlab.mixed.runs import OpSeen, RunResult

#: op→dtype entries listed per row (the rest are counted)
MAX_OPS_SHOWN = 6


def rel_error(half: Seen, ref: Seen) -> Optional[float]:
    """``‖half − ref‖₂ / ‖ref‖₂`` on the kept samples (float64); ``inf`` when the half tensor is not
    finite and the float32 one is; over the finite positions of both when float32 itself is not."""
    if half.numel != ref.numel or half.sample.shape != ref.sample.shape:
        return None
    if not half.finite and ref.finite:
        return math.inf
    x, y = half.sample.double(), ref.sample.double()
    if not ref.finite:
        keep = torch.isfinite(x) & torch.isfinite(y)
        x, y = x[keep], y[keep]
    return _ratio(torch.linalg.vector_norm(x - y), torch.linalg.vector_norm(y))


def tensor_error(half: torch.Tensor, ref: torch.Tensor) -> float:
    """The same norm-wise relative error on two whole tensors (parameter gradients)."""
    x, y = half.double(), ref.double()
    if not bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all()):
        return math.inf
    return _ratio(torch.linalg.vector_norm(x - y), torch.linalg.vector_norm(y))


def _ratio(diff: torch.Tensor, norm: torch.Tensor) -> float:
    d, n = float(diff), float(norm)
    if n == 0.0:
        return 0.0 if d == 0.0 else math.inf
    return d / n


def _worst(pairs: Sequence[tuple]) -> Optional[float]:
    errors = [e for e in (rel_error(a, b) for a, b in pairs) if e is not None]
    if not errors:
        return None
    return math.nan if any(math.isnan(e) for e in errors) else max(errors)


def params(ref: RunResult, run: RunResult) -> List[ParamRow]:
    """Per trainable parameter: gradient error, and the share of its norm underflowed to exactly 0
    in this run (elements non-zero and below 2⁻¹⁴ in float32, the range where float16 flushes or
    loses bits, so a ReLU whose input changed sign by rounding does not count)."""
    rows = []
    negligible = negligible_grads(ref.grads)
    for name, g_ref in ref.grads.items():
        g = run.grads.get(name)
        if g_ref is None or g is None:
            continue
        if name in negligible:
            rows.append(ParamRow(name=name, error=None, negligible=True))
            continue
        lost = (g == 0) & (g_ref.abs() < FP16_TINY)
        total = float(torch.linalg.vector_norm(g_ref.float()))
        zeroed = float(torch.linalg.vector_norm(torch.where(lost, g_ref.float(), 0.0))) / total if total else 0.0
        rows.append(ParamRow(name=name, error=tensor_error(g, g_ref), zeroed=zeroed))
    return rows


#: A parameter gradient whose RMS is below this fraction of the median parameter's is noise around
#: an exact zero (attention's key bias: softmax ignores a shift shared by a row's scores; float32
#: leaves ~1e-9 of rounding there), and a relative error of noise against noise means nothing.
NEGLIGIBLE = 1e-5


def negligible_grads(grads: Dict[str, Optional[torch.Tensor]]) -> set:
    """Names of the gradients that are zero up to float32 rounding, next to the model's others."""
    rms = {n: float(torch.linalg.vector_norm(g.float())) / math.sqrt(g.numel())
           for n, g in grads.items() if g is not None and g.numel()}
    finite = sorted(v for v in rms.values() if math.isfinite(v))
    if not finite:
        return set()
    typical = finite[len(finite) // 2]
    return {n for n, v in rms.items() if v <= NEGLIGIBLE * typical}


def own_params(rows: List[ParamRow]) -> Dict[str, List[ParamRow]]:
    """Module path → the parameters registered on it directly (``encoder.0.weight`` → ``encoder.0``)."""
    out: Dict[str, List[ParamRow]] = {}
    for row in rows:
        path = row.name.rpartition(".")[0]
        out.setdefault(path, []).append(row)
    return out


def ops_by_call(ops: List[OpSeen]) -> Dict[Key, List[OpSeen]]:
    out: Dict[Key, List[OpSeen]] = {}
    for op in ops:
        if op.key is not None:
            out.setdefault(op.key, []).append(op)
    return out


def _op_labels(ops: List[OpSeen]) -> List[str]:
    """``["bfloat16: add mean pow", "float32: softmax"]``: the call's own ops by output dtype."""
    by_dtype: Dict[str, List[str]] = {}
    for op in ops:
        if op.record.out_dtypes:
            names = by_dtype.setdefault(op.record.out_dtypes[0], [])
            if op.record.op not in names:
                names.append(op.record.op)
    out = []
    for dtype, names in by_dtype.items():
        more = f" +{len(names) - MAX_OPS_SHOWN}" if len(names) > MAX_OPS_SHOWN else ""
        out.append(f"{dtype}: {' '.join(names[:MAX_OPS_SHOWN])}{more}")
    return out


def rows(ref: RunResult, run: RunResult, param_rows: List[ParamRow]) -> List[ModuleRow]:
    """One row per module call of the float32 run that the half run made too, in call order."""
    owned = own_params(param_rows)
    ops = ops_by_call(run.ops)
    out = []
    for key, r in sorted(ref.calls.items(), key=lambda kv: kv[1].order):
        c: Optional[CallSeen] = run.calls.get(key)
        if c is None:
            continue
        row = ModuleRow(path=key[0], call=key[1], class_name=r.class_name, depth=r.depth,
                        dtype=c.outputs[0].dtype if c.outputs else None)
        row.error = _worst(list(zip(c.outputs, r.outputs)))
        row.input_error = _worst(list(zip(c.inputs, r.inputs)))
        row.grad_error = _worst([(c.grads[i], r.grads[i]) for i in r.grads if i in c.grads])
        if row.error is not None and row.input_error:
            row.gain = row.error / row.input_error if math.isfinite(row.input_error) else None
        row.amax = max((o.amax for o in r.outputs), default=None)
        row.finite = all(o.finite for o in c.outputs)
        if key[1] == 1:  # a module's parameters are counted on its first call
            mine = [p for p in owned.get(key[0], []) if p.error is not None]
            if mine:
                worst = max(mine, key=lambda p: p.error if not math.isnan(p.error) else math.inf)
                row.param, row.param_error = worst.name, worst.error
        row.ops = _op_labels(ops.get(key, []))
        out.append(row)
    return out
