"""A half-precision run against the float32 run: per module call and per parameter, numbers only.

Which of these numbers is a problem is :mod:`layerlab.mixed.diagnose`'s business.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import torch

from layerlab.mixed.capture import Key, Seen
from layerlab.mixed.dtypes import FP16_TINY, UNDERFLOW_FRACTION
from layerlab.mixed.report import ModuleRow, ParamRow
from layerlab.mixed.runs import OpSeen, RunResult
from layerlab.probe.safe_norm import host_norm, host_norms

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


def _ratio(diff: float, norm: float) -> float:
    d, n = float(diff), float(norm)
    if n == 0.0:
        return 0.0 if d == 0.0 else math.inf
    return d / n


def rel_errors(pairs: Sequence[tuple]) -> Dict[tuple, Optional[float]]:
    """:func:`rel_error` of every ``(half, ref)`` pair, keyed by ``(id(half), id(ref))``.

    The same numbers as pair by pair, in fewer torch calls: a module's input is mostly the previous
    one's output (the same :class:`Seen`, measured once), and samples of one length are stacked and
    measured together (a small model's comparison is otherwise dominated by per-call overhead)."""
    out: Dict[tuple, Optional[float]] = {}
    groups: Dict[int, list] = {}
    for half, ref in pairs:
        key = (id(half), id(ref))
        if key in out:
            continue
        if half.numel != ref.numel or half.sample.shape != ref.sample.shape or not ref.finite \
                or not half.finite or half.sample.dim() != 1:
            out[key] = rel_error(half, ref)  # the rare cases, one by one
            continue
        out[key] = None  # filled in below
        groups.setdefault(half.sample.numel(), []).append((key, half, ref))
    for items in groups.values():
        x = torch.stack([h.sample for _, h, _ in items]).double()
        y = torch.stack([r.sample for _, _, r in items]).double()
        diffs = torch.linalg.vector_norm(x - y, dim=1).tolist()
        norms = torch.linalg.vector_norm(y, dim=1).tolist()
        for (key, _, _), d, n in zip(items, diffs, norms):
            out[key] = _ratio(d, n)
    return out


def _worst(pairs: Sequence[tuple], errors: Optional[Dict[tuple, Optional[float]]] = None) -> Optional[float]:
    if errors is None:
        errors = rel_errors(pairs)
    found = [e for e in (errors[(id(a), id(b))] for a, b in pairs) if e is not None]
    if not found:
        return None
    return math.nan if any(math.isnan(e) for e in found) else max(found)


def params(ref: RunResult, run: RunResult) -> List[ParamRow]:
    """Per trainable parameter: gradient error, and in a float16 run the share of its norm
    underflowed to exactly 0 (elements non-zero and below 2⁻¹⁴ in float32, the range where float16
    flushes or loses bits, so a ReLU whose input changed sign by rounding does not count).
    bfloat16 has float32's exponent range: nothing underflows there, and the share is not measured."""
    underflow = run.setting.dtype == "float16"
    negligible = negligible_grads(ref)
    sums = grad_sums(ref)
    rows: List[ParamRow] = []
    for name, g_ref in ref.grads.items():
        g = run.grads.get(name)
        if g_ref is None or g is None:
            continue
        row = ParamRow(name=name, error=None, negligible=name in negligible, zeroed=0.0 if underflow else None)
        rows.append(row)
        if not row.negligible:
            row.error, row.zeroed = _grad_error(g, g_ref, sums[name][1] if name in sums else 0.0, underflow)
    return rows


def _norms(tensors: List[torch.Tensor]) -> List[float]:
    """L2 norms of many tensors, in one fused call and one conversion (taken again, scaled, where a
    float32 square under- or overflowed: :mod:`layerlab.probe.safe_norm`)."""
    return host_norms(tensors)


#: Below this norm (or when anything is not finite) a float32 sum of squares may underflow or
#: overflow, and a gradient is measured again in float64.
_SMALL = 1e-15


def _grad_error(g: torch.Tensor, g_ref: torch.Tensor, total: float, underflow: bool = True) -> tuple:
    """``(‖g − g_ref‖ / ‖g_ref‖, ‖g_ref where g underflowed to 0‖ / ‖g_ref‖)``; ``total`` is ‖g_ref‖.
    The second is ``None`` unless ``underflow`` (a float16 run) asks for it: three passes saved.

    float32 norms, fetched in one conversion: a few small ops per parameter (float64 copies of
    every gradient cost more than a small model's forward). float32's rounding of a norm (~1e-7)
    is far below every bar (≥ 2⁻¹⁰). Where a float32 square could overflow or underflow, or
    anything is not finite, the exact float64 path decides."""
    x = g.detach().float()
    if not underflow:
        diff = float(torch.linalg.vector_norm(x - g_ref))
        if not (math.isfinite(diff) and math.isfinite(total) and total > _SMALL):
            return tensor_error(g, g_ref), None
        return _ratio(diff, total), None
    lost = (x == 0) & (g_ref.abs() < FP16_TINY)
    diff, lost_norm = torch.stack([torch.linalg.vector_norm(x - g_ref),
                                   torch.linalg.vector_norm(torch.where(lost, g_ref, 0.0))]).tolist()
    if not (math.isfinite(diff) and math.isfinite(total) and total > _SMALL):
        return tensor_error(g, g_ref), _zeroed(lost, g_ref)
    return _ratio(diff, total), lost_norm / total


def tensor_error(half: torch.Tensor, ref: torch.Tensor) -> float:
    """The norm-wise relative error on two whole tensors, in float64 (``inf`` where ``half`` is not
    finite and ``ref`` is)."""
    x, y = half.double(), ref.double()
    if not bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all()):
        return math.inf
    return _ratio(torch.linalg.vector_norm(x - y), torch.linalg.vector_norm(y))


def _zeroed(lost: torch.Tensor, g_ref: torch.Tensor) -> float:
    y = g_ref.double()
    total = float(torch.linalg.vector_norm(y))
    return float(torch.linalg.vector_norm(torch.where(lost, y, 0.0))) / total if total else 0.0


#: A parameter gradient whose RMS is below this fraction of the median parameter's is noise around
#: an exact zero (attention's key bias: softmax ignores a shift shared by a row's scores; float32
#: leaves ~1e-9 of rounding there), and a relative error of noise against noise means nothing.
NEGLIGIBLE = 1e-5
#: A gradient below this fraction is measured again in float64 and is noise only if it vanishes
#: there: an exact zero's float32 noise can sit just above NEGLIGIBLE (Segformer's last-stage
#: LayerNorm bias, whose shift the decode head's train-mode BatchNorm removes: 1.02e-5 × the median).
SUSPECT = 1e-3
#: float16 flushes a magnitude below half its smallest subnormal (2⁻²⁴) to 0
FLUSHED = 2.0 ** -25


def grad_sums(ref: RunResult) -> Dict[str, tuple]:
    """Per float32 parameter gradient: ``(numel, ‖g‖, ‖g[|g| < 2⁻²⁵]‖)``, computed once per run
    (float32 norms, as the forecast and the noise test have always used).

    The third is ``None`` where it cannot reach UNDERFLOW_FRACTION of ‖g‖: n elements below 2⁻²⁵
    have a norm below 2⁻²⁵·√n, so a gradient whose norm is over 2⁻²⁵·√n / UNDERFLOW_FRACTION
    needs no second look (almost every one: it saves three passes over each gradient)."""
    if ref.grad_sums is None:
        grads = {name: g.detach().float() for name, g in ref.grads.items() if g is not None and g.numel()}
        found = {}
        for (name, g), norm in zip(grads.items(), _norms(list(grads.values()))):
            flushed = None
            if not (norm > FLUSHED * math.sqrt(g.numel()) / UNDERFLOW_FRACTION):  # NaN: measured too
                flushed = host_norm(torch.where(g.abs() < FLUSHED, g, 0.0))
            found[name] = (g.numel(), norm, flushed)
        ref.grad_sums = found
    return ref.grad_sums


def negligible_grads(ref: RunResult) -> set:
    """Names of the gradients that are zero up to float32 rounding, next to the model's others: at most
    NEGLIGIBLE of the median, or at most SUSPECT and measured in float64 (``ref.float64_checked``),
    less those the float64 run showed are real, only tiny (``ref.real_tiny``, see :func:`confirm_noise`)."""
    return (tiny_grads(ref) | tiny_grads(ref, SUSPECT) & ref.float64_checked) - ref.real_tiny


def tiny_grads(ref: RunResult, bar: float = NEGLIGIBLE) -> set:
    """Names of the gradients whose RMS is at most ``bar`` of the median parameter's."""
    rms = {n: norm / math.sqrt(numel) for n, (numel, norm, _) in grad_sums(ref).items()}
    finite = sorted(v for v in rms.values() if math.isfinite(v))
    if not finite:
        return set()
    typical = finite[len(finite) // 2]
    return {n for n, v in rms.items() if v <= bar * typical}


def confirm_noise(ref: RunResult, float64_rms: Dict[str, float]) -> None:
    """Keep as noise only the tiny gradients whose float64 RMS is far below their float32 one.

    Rounding noise around an exact zero (attention's key bias) shrinks by ~1e9 in float64; a real
    gradient that is only small (a gradient scaled by 1e-6, the one float16 flushes to 0) keeps its
    size, and must be compared and checked for underflow like any other."""
    sums = grad_sums(ref)
    ref.float64_checked.update(float64_rms)
    for name, rms64 in float64_rms.items():
        numel, norm, _ = sums[name]
        if rms64 >= 0.1 * norm / math.sqrt(numel):
            ref.real_tiny.add(name)


def flushed_share(ref: RunResult, name: str) -> float:
    """``‖g[|g| < 2⁻²⁵]‖ / ‖g‖`` of a float32 gradient: how much of it float16 flushes to 0
    (0.0 where :func:`grad_sums` showed it is below UNDERFLOW_FRACTION without measuring it)."""
    found = grad_sums(ref).get(name)
    if found is None or found[2] is None or found[1] == 0.0 or not math.isfinite(found[1]):
        return 0.0
    return found[2] / found[1]


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
    calls = [(key, r, run.calls[key]) for key, r in sorted(ref.calls.items(), key=lambda kv: kv[1].order)
             if key in run.calls]
    pairs = {key: (list(zip(c.outputs, r.outputs)), list(zip(c.inputs, r.inputs)),
                   [(c.grads[i], r.grads[i]) for i in r.grads if i in c.grads]) for key, r, c in calls}
    errors = rel_errors([pair for groups in pairs.values() for group in groups for pair in group])
    for key, r, c in calls:
        row = ModuleRow(path=key[0], call=key[1], class_name=r.class_name, depth=r.depth,
                        dtype=c.outputs[0].dtype if c.outputs else None)
        outputs, inputs, grads = pairs[key]
        row.error = _worst(outputs, errors)
        row.input_error = _worst(inputs, errors)
        row.grad_error = _worst(grads, errors)
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
