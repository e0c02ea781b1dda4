"""MaxPool / AvgPool / LPPool 1d/2d/3d: the output size, and where torch raises (shape_rules.md §3–§5).

Module semantics: ``nn.MaxPool2d(**params)(x)`` with ``x`` of the given shape.

Shape (per spatial dim, each with its own ``k, s, p, d``; ``E = d·(k−1) + 1``; ``s`` defaults to ``k``)::

    floor mode:  out = (L + 2p − E) // s + 1
    ceil mode:   out = (L + 2p − E + s − 1) // s + 1
                 then, if (out − 1)·s ≥ L + p: out −= 1      (the last window may not START in the
                                                             right padding or past it — "drop rule")

AvgPool has no dilation (d = 1); LPPool has no padding (p = 0, and d = 1). Batched ``(N, C, *S)``
and unbatched ``(C, *S)`` inputs keep their form; ``return_indices``, ``count_include_pad`` and
``divisor_override`` never change the shape.

Where the checks live (every message is torch 2.13's, quoted by the helpers below):

* MaxPool2d/3d and AvgPool2d/3d share ATen's shape check. Order: argument lengths → rank →
  per dim (D, H, W): ``stride != 0``, ``pad ≥ 0``, ``pad ≤ trunc(E/2)`` → kernel, stride,
  dilation > 0 → non-empty dims → (AvgPool3d: input ≥ kernel) → ``pad ≤ k // 2`` with the raw
  kernel (MaxPool only; for AvgPool it equals the first check) → output ≥ 1.
  AvgPool2d checks ``divisor_override != 0`` before the rank and fails on rank < 3 with an
  IndexError; AvgPool3d checks the divisor after the rank.
* MaxPool1d (``return_indices=False``) has its own code path and its own messages (§3.4).
  With ``return_indices=True`` it, like AvgPool1d, runs the 2-D check on ``(N, C, 1, L)``.
* LPPool is ``avg_pool(x**p)`` (or ``max_pool`` for ``norm_type=±inf``) plus a few Python quirks (§5).
  ``norm_type=0``: 2.13 fails last (``1/0``), 2.14 first (see torch_version.CHANGES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.arith import effective_kernel, pool_out
from layerlab.shapes.fpad import shape_str
from layerlab.shapes.pool_steps import DIM_NAMES, dim_notes, dim_step, too_small_fixes
from layerlab.shapes.result import Explanation, ShapeNote
from layerlab.shapes.torch_version import torch_rules
from layerlab.shapes.values import int32_args as _int32

_WORDS = {1: "one int", 2: "two ints", 3: "three ints"}


def _raise(message: str, torch_message: str, rule: str, exc: str = "RuntimeError", **kw: Any) -> None:
    raise TorchWouldRaise(message, torch_exception=exc, torch_message=torch_message, rule=rule, **kw)


def _trunc_half(x: int) -> int:
    """``x / 2`` rounded toward zero, as C++ integer division (matters for negative kernels)."""
    return -((-x) // 2) if x < 0 else x // 2


def _as_arg(name: str, value: Any) -> Any:
    """An int, or a tuple of ints (lists become tuples: torch treats them alike)."""
    if isinstance(value, list):
        value = tuple(value)
    items = value if isinstance(value, tuple) else (value,)
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise UsageError(f"{name} must be an int or a tuple of ints", where=name, got=value)
    return value


def _expand(value: Any, nd: int) -> Tuple[int, ...]:
    """An int or a 1-tuple broadcast to ``nd`` entries (lengths were checked before)."""
    if isinstance(value, tuple):
        return value * nd if len(value) == 1 else value
    return (value,) * nd


def index_error(rank: int, dim: int) -> str:
    """torch's IndexError text for ``tensor.size(dim)`` on a tensor of ``rank`` dims."""
    if rank == 0:
        return f"Dimension specified as {dim} but tensor has no dimensions"
    return f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})"


# --------------------------------------------------------------------------------------------
# ATen's 2-D / 3-D pooling check (MaxPool2d/3d, AvgPool2d/3d, and the 1-D ops that run as 2-D)


@dataclass
class _Aten:
    """One call of ATen's 2-D/3-D max/avg pooling on ``shape`` (already unsqueezed for 1-D ops).

    ``real`` lists the dims that exist for the user (all of them, or only W when a 1-D op runs
    on ``(N, C, 1, L)``); steps and notes are made for those, named ``names``.
    """

    variant: str  # "max" | "avg"
    nd: int  # 2 | 3
    k: Tuple[int, ...]
    s: Tuple[int, ...]
    p: Tuple[int, ...]
    d: Tuple[int, ...]
    ceil: bool
    real: Tuple[int, ...]
    names: Tuple[str, ...]
    rule: str


def _check_per_dim(ex: Explanation, a: _Aten, shape: Tuple[int, ...]) -> List[int]:
    """``pooling_output_shape`` per dim (D, H, W): stride ≠ 0, pad ≥ 0, pad ≤ trunc(E/2); the sizes."""
    outs = []
    spatial = shape[-a.nd:]
    for i in range(a.nd):
        k, s, p, d = a.k[i], a.s[i], a.p[i], a.d[i]
        name = a.names[a.real.index(i)] if i in a.real else None
        where = name or "H"
        if s == 0:
            _raise("stride is 0 (with stride=None it defaults to kernel_size, so kernel_size=0 lands here)",
                   "stride should not be zero", "§3.3", where=where, expected="stride ≥ 1", got=0,
                   suggestions=["stride ≥ 1", "kernel_size ≥ 1 (stride defaults to it)"])
        if p < 0:
            _raise(f"padding {p} is negative", f"pad must be non-negative, but got pad: {p}", "§3.3",
                   where=where, expected="padding ≥ 0", got=p, suggestions=["padding=0"])
        E = effective_kernel(k, d)
        if p > _trunc_half(E):
            _raise(f"padding {p} is more than half the effective kernel {E} (= dilation·(kernel_size − 1) + 1)",
                   f"pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} "
                   f"and dilation={d}", "§3.2", where=where, expected=f"padding ≤ {max(E // 2, 0)}", got=p,
                   suggestions=[f"padding ≤ {min(max(k // 2, 0), max(E // 2, 0))} (= kernel_size // 2)"])
        if name is None:
            outs.append(pool_out(spatial[i], k, s, p, d, a.ceil)[0] if s > 0 else 1)
        else:
            outs.append(dim_step(ex, name, spatial[i], k, s, p, d, a.ceil))
    return outs


def _letters(nd: int) -> Tuple[str, ...]:
    return ("T", "H", "W") if nd == 3 else ("H", "W")


def _positive(a: _Aten) -> None:
    """kernel, stride, dilation > 0 — one message per argument, all dims in it (T/H/W order)."""
    L = _letters(a.nd)
    for vals, what, prefix in ((a.k, "kernel size", "k"), (a.s, "stride", "d"), (a.d, "dilation", "dilation")):
        if a.variant == "avg" and what == "dilation":
            continue
        if all(v > 0 for v in vals):
            continue
        got = " ".join(f"{prefix}{l}: {v}" for l, v in zip(L, vals))
        arg = {"kernel size": "kernel_size", "stride": "stride", "dilation": "dilation"}[what]
        _raise(f"{arg} must be ≥ 1 in every dim", f"{what} should be greater than zero, but got {got}", "§3.3",
               where=arg, expected=f"{arg} ≥ 1", got=vals, suggestions=[f"{arg} ≥ 1"])


def _non_empty(a: _Aten, shape: Tuple[int, ...], opname: str) -> None:
    nd, rank = a.nd, len(shape)
    if nd == 2:
        # 3-D input: every dim non-zero; 4-D: all but the batch.
        ok = (rank == 3 and all(shape)) or (rank == 4 and all(shape[1:]))
        if not ok:
            _raise("the input has an empty channel or spatial dim (only the batch dim may be 0)"
                   if rank in (3, 4) else f"{opname} needs a 3-D (C, H, W) or 4-D (N, C, H, W) input",
                   "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:"
                   + shape_str(shape), "§3.3", where="input", got=list(shape),
                   suggestions=["every dim except the batch dim ≥ 1"])
        return
    fn = "max_pool3d_with_indices_out_cpu_template" if a.variant == "max" else "avg_pool3d"
    for i, size in enumerate(shape):
        if rank == 5 and i == 0:
            continue
        if size <= 0:
            # torch prints the dim's length (always 0 here) where the dim's index is meant.
            _raise("the input has an empty channel or spatial dim (only the batch dim may be 0)",
                   f"{fn}(): Expected input's non-batch dimensions to have positive length, but input has a "
                   f"shape of {shape_str(shape)} and non-batch dimension {size} has length zero!", "§3.3",
                   where="input", got=list(shape), suggestions=["every dim except the batch dim ≥ 1"])


def _run_aten(ex: Explanation, a: _Aten, shape: Tuple[int, ...], opname: str) -> Tuple[int, ...]:
    """Per-dim checks and sizes, then the shape check of ATen's pool2d/pool3d kernels."""
    outs = _check_per_dim(ex, a, shape)
    _positive(a)
    _non_empty(a, shape, opname)
    spatial = shape[-a.nd:]
    if a.variant == "avg" and a.nd == 3 and any(L < k for L, k in zip(spatial, a.k)):
        T, H, W = spatial
        kT, kH, kW = a.k
        _raise("AvgPool3d needs input ≥ kernel_size in every dim, before padding and whatever ceil_mode says",
               f"input image (T: {T} H: {H} W: {W}) smaller than kernel size (kT: {kT} kH: {kH} kW: {kW})",
               "§4", where="input", expected=f"≥ {tuple(a.k)}", got=tuple(spatial),
               suggestions=[f"input ≥ {tuple(a.k)} in (D, H, W)", f"kernel_size ≤ {tuple(spatial)}"])
    if a.variant == "max" and any(p > k // 2 for p, k in zip(a.p, a.k)):
        # The raw-kernel check: dilation does not count here (§3.2 check 2).
        if a.nd == 2:
            msg = (f"pad should be smaller than or equal to half of kernel size, but got padW = {a.p[1]}, "
                   f"padH = {a.p[0]}, kW = {a.k[1]}, kH = {a.k[0]}")
        else:
            msg = (f"pad should be smaller than or equal to half of kernel size, but got kT: {a.k[0]} "
                   f"kW: {a.k[2]} kH: {a.k[1]} padT: {a.p[0]} padW: {a.p[2]} padH: {a.p[1]}")
        limit = tuple(k // 2 for k in a.k)
        _raise("padding is more than half the kernel_size; dilation does not raise this limit "
               "(so a dilated max-pool cannot keep the size at stride 1)", msg, "§3.2",
               where="padding", expected=f"padding ≤ kernel_size // 2 = {_show(limit, a)}", got=_show(a.p, a),
               suggestions=[f"padding ≤ {_show(limit, a)} (= kernel_size // 2)"])
    if any(o < 1 for o in outs):
        C = shape[-a.nd - 1]
        given = "x".join(str(v) for v in (C,) + tuple(spatial))
        calc = "x".join(str(v) for v in (C,) + tuple(outs))
        bad = [a.names[a.real.index(i)] for i, o in enumerate(outs) if o < 1 and i in a.real]
        _raise(f"the output would be empty in {', '.join(bad) or 'a dim'}: the (padded) input is smaller "
               "than the kernel", f"Given input size: ({given}). Calculated output size: ({calc}). "
               "Output size is too small", a.rule, where=", ".join(bad) or None,
               expected="output ≥ 1 in every dim", got=tuple(outs[i] for i in a.real),
               suggestions=too_small_fixes([(spatial[i], a.k[i], a.s[i], a.p[i], a.d[i], outs[i]) for i in a.real],
                                           a.ceil, can_pad=a.variant == "max" or a.nd == 2))
    for i in a.real:
        dim_notes(ex, a.names[a.real.index(i)], spatial[i], a.k[i], a.s[i], a.p[i], a.d[i], outs[i], a.ceil)
    return tuple(outs)


def _show(vals: Tuple[int, ...], a: _Aten) -> Any:
    vals = tuple(vals[i] for i in a.real)
    return vals[0] if len(vals) == 1 else vals


# --------------------------------------------------------------------------------------------
# the ops


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """Max/Avg/LP pool 1d/2d/3d: steps, notes, ``ex.output_shape``; raise where torch raises."""
    variant = spec.name.split("_")[0]  # max | avg | lp
    nd = spec.nd
    k = _as_arg("kernel_size", params["kernel_size"])
    s = params.get("stride")
    s = () if s is None else _as_arg("stride", s)  # None reaches ATen as an empty list: s = k
    p = _as_arg("padding", params.get("padding", 0))
    d = _as_arg("dilation", params.get("dilation", 1))
    ceil = bool(params.get("ceil_mode", False))
    if variant == "lp":
        out = _lp_pool(ex, nd, shape, k, s, ceil, params)
    elif variant == "max":
        if nd == 1 and not params.get("return_indices", False):
            out = _max_pool1d(ex, shape, k, s, p, d, ceil)
        else:
            out = _max_pool(ex, nd, shape, k, s, p, d, ceil)
    else:
        out = _avg_pool(ex, nd, shape, k, s, p, ceil, params.get("divisor_override"))
    ex.output_shape = out


def _max_pool(ex, nd, shape, k, s, p, d, ceil) -> Tuple[int, ...]:
    if nd == 1:  # only with return_indices=True: max_pool1d_with_indices runs the 2-D kernel on (N, C, 1, L)
        _rank_2_3(shape, "max_pool1d")
        for name, v in (("kernel_size", k), ("stride", s), ("padding", p), ("dilation", d)):
            _one_int(name, v, "max_pool1d", allow_empty=name == "stride")
        _int32(k, s, p, d)
        ex.notes.append(ShapeNote("info", "MaxPool1d with return_indices=True runs as MaxPool2d on (N, C, 1, L); "
                                  "its errors speak of H and W.", severity="info"))
        a = _Aten("max", 2, (1,) + _expand(k, 1), (1,) + _expand(_stride(s, k), 1), (0,) + _expand(p, 1),
                  (1,) + _expand(d, 1), ceil, (1,), ("L",), "§3.4")
        return shape[:-1] + _run_aten(ex, a, _unsqueeze(shape), "max_pool1d")[1:]
    fn = f"max_pool{nd}d"
    w = _WORDS[nd]
    for name, v, msg in (
        ("kernel_size", k, f"{fn}: kernel_size must either be a single int, or a tuple of {w}"),
        ("stride", s, f"{fn}: stride must either be omitted, a single int, or a tuple of {w}"),
        ("padding", p, f"{fn}: padding must either be a single int, or a tuple of {w}"),
        ("dilation", d, f"{fn}: dilation must be either a single int, or a tuple of {w}"),
    ):
        _check_len(name, v, nd, msg, allow_empty=name == "stride")
    _int32(k, s, p, d)
    if len(shape) not in (nd + 1, nd + 2):
        _raise(f"{fn} needs a {nd + 1}-D (C, *S) or {nd + 2}-D (N, C, *S) input, got {len(shape)}-D",
               f"non-empty {nd + 1}D or {nd + 2}D (batch mode) tensor expected for input", "§3.3",
               where="input", expected=f"{nd + 1} or {nd + 2} dims", got=len(shape),
               suggestions=[f"input of rank {nd + 1} or {nd + 2}"])
    a = _Aten("max", nd, _expand(k, nd), _expand(_stride(s, k), nd), _expand(p, nd), _expand(d, nd), ceil,
              tuple(range(nd)), DIM_NAMES[nd], "§3.3")
    return shape[:-nd] + _run_aten(ex, a, shape, fn)


def _avg_pool(ex, nd, shape, k, s, p, ceil, divisor) -> Tuple[int, ...]:
    if nd == 1:  # avg_pool1d runs avg_pool2d on (N, C, 1, L)
        _rank_2_3(shape, "avg_pool1d")
        for name, v in (("kernel_size", k), ("stride", s), ("padding", p)):
            _one_int(name, v, "avg_pool1d", allow_empty=name == "stride")
        _int32(k, s, p)
        ex.notes.append(ShapeNote("info", "AvgPool1d runs as AvgPool2d on (N, C, 1, L); its errors speak of H and W.",
                                  severity="info"))
        a = _Aten("avg", 2, (1,) + _expand(k, 1), (1,) + _expand(_stride(s, k), 1), (0,) + _expand(p, 1), (1, 1),
                  ceil, (1,), ("L",), "§4")
        return shape[:-1] + _run_aten(ex, a, _unsqueeze(shape), "avg_pool1d")[1:]
    fn = f"avg_pool{nd}d"
    w = _WORDS[nd]
    either = "either " if nd == 2 else ""
    for name, v, msg in (
        ("kernel_size", k, f"{fn}: kernel_size must {either}be a single int, or a tuple of {w}"),
        ("stride", s, f"{fn}: stride must {either}be omitted, a single int, or a tuple of {w}"),
        ("padding", p, f"{fn}: padding must {either}be a single int, or a tuple of {w}"),
    ):
        _check_len(name, v, nd, msg, allow_empty=name == "stride")
    _int32(k, s, p)
    if nd == 3 and len(shape) not in (4, 5):
        _raise(f"{fn} needs a 4-D (C, D, H, W) or 5-D (N, C, D, H, W) input, got {len(shape)}-D",
               "non-empty 4D or 5D (batch mode) tensor expected for input", "§4", where="input",
               expected="4 or 5 dims", got=len(shape), suggestions=["input of rank 4 or 5"])
    if divisor is not None and divisor == 0:
        _raise("divisor_override=0 would divide by zero", "divisor must be not zero", "§4",
               where="divisor_override", expected="non-zero or None", got=0,
               suggestions=["divisor_override=None (divide by the window size)"])
    if nd == 2 and len(shape) < 3:
        # avg_pool2d reads input.size(-3) before any other check.
        _raise(f"avg_pool2d needs a 3-D (C, H, W) or 4-D (N, C, H, W) input, got {len(shape)}-D",
               index_error(len(shape), -3), "§4", exc="IndexError", where="input",
               expected="3 or 4 dims", got=len(shape), suggestions=["input of rank 3 or 4"])
    a = _Aten("avg", nd, _expand(k, nd), _expand(_stride(s, k), nd), _expand(p, nd), (1,) * nd, ceil,
              tuple(range(nd)), DIM_NAMES[nd], "§4")
    return shape[:-nd] + _run_aten(ex, a, shape, fn)


def _max_pool1d(ex, shape, k, s, p, d, ceil) -> Tuple[int, ...]:
    """MaxPool1d without indices: its own checks and messages (§3.4)."""
    rank = len(shape)
    if not ((rank == 2 and all(shape)) or (rank == 3 and all(shape[1:]))):
        _raise("MaxPool1d needs a 2-D (C, L) or 3-D (N, C, L) input with non-empty C and L"
               if rank in (2, 3) else f"MaxPool1d needs a 2-D (C, L) or 3-D (N, C, L) input, got {rank}-D",
               "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for input, "
               f"but got:{shape_str(shape)}", "§3.4", where="input", got=list(shape),
               suggestions=["input (N, C, L) or (C, L) with C, L ≥ 1"])
    for name, v, tail in (
        ("kernel_size", k, "must be an int, list of ints or tuple of ints"),
        ("stride", s, "must be None, an int, list of ints, or tuple of ints"),
        ("padding", p, "must be an int, list of ints, or tuple of ints"),
        ("dilation", d, "must be an int, list of ints or tuple of ints"),
    ):
        if isinstance(v, tuple) and len(v) != 1 and not (name == "stride" and len(v) == 0):
            _raise(f"{name} of MaxPool1d must be an int or a 1-tuple, got {len(v)} values",
                   f"max_pool1d() {name} {tail} of size 1 but got size {len(v)}", "§3.4", where=name,
                   expected="an int or a 1-tuple", got=v, suggestions=[f"{name}={v[0]}" if v else f"{name}=…"])
    k1, p1, d1 = _expand(k, 1)[0], _expand(p, 1)[0], _expand(d, 1)[0]
    s1 = _expand(_stride(s, k), 1)[0]
    for cond, msg, plain, fix in (
        (k1 > 0, f"kernel_size must be greater than zero, but got {k1}", "kernel_size must be ≥ 1",
         "kernel_size ≥ 1"),
        (s1 > 0, f"stride must be greater than zero, but got {s1}", "stride must be ≥ 1", "stride ≥ 1"),
        (p1 >= 0, f"padding must be non-negative, but got {p1}", "padding must be ≥ 0", "padding=0"),
        (p1 <= k1 // 2, f"padding should be at most half of kernel size, but got padding={p1} and kernel_size={k1}",
         "padding is more than half the kernel_size (dilation does not raise this limit)",
         f"padding ≤ {k1 // 2} (= kernel_size // 2)"),
        (d1 > 0, f"dilation must be greater than zero, but got {d1}", "dilation must be ≥ 1", "dilation ≥ 1"),
    ):
        if not cond:
            _raise(plain, "max_pool1d() " + msg, "§3.4", where=msg.split()[0], suggestions=[fix])
    out = dim_step(ex, "L", shape[-1], k1, s1, p1, d1, ceil)
    if out < 1:
        _raise("the output would be empty: the (padded) input is shorter than the kernel",
               f"max_pool1d() Invalid computed output size: {out}", "§3.4", where="L",
               expected="output ≥ 1", got=out,
               suggestions=too_small_fixes([(shape[-1], k1, s1, p1, d1, out)], ceil, can_pad=True))
    dim_notes(ex, "L", shape[-1], k1, s1, p1, d1, out, ceil)
    return shape[:-1] + (out,)


def _lp_pool(ex, nd, shape, k, s, ceil, params) -> Tuple[int, ...]:
    """LPPool = avg_pool(x**p)·(window size), then ** (1/p); max_pool(|x|) for p = ±inf (§5)."""
    norm = float(params.get("norm_type", 2.0))
    rules = ex.torch_rules or torch_rules()
    if norm == 0 and rules.has("lp-pool-zero-norm-valueerror"):  # _LPPoolNd.__init__, before any other check
        _raise("norm_type=0 is not a norm: LPPool computes (Σ x^p)^(1/p)",
               f"norm_type must be a non-zero value, but got {params['norm_type']}", "§5", exc="ValueError",
               where="norm_type", got=0, suggestions=["norm_type=1 or 2"],
               hint=f"torch {rules.version} rejects it when the module is built (< 2.14: ZeroDivisionError later)")
    if nd > 1 and isinstance(k, tuple) and len(k) != nd:
        # F.lp_pool2d/3d unpack kernel_size into nd names first.
        msg = (f"not enough values to unpack (expected {nd}, got {len(k)})" if len(k) < nd
               else f"too many values to unpack (expected {nd})")
        _raise(f"LPPool{nd}d needs kernel_size as an int or a tuple of {nd} ints (a 1-tuple is not broadcast)",
               msg, "§5", exc="ValueError", where="kernel_size", got=k,
               suggestions=[f"kernel_size={k[0]}" if k else "kernel_size=…"])
    if math.isinf(norm):
        ex.notes.append(ShapeNote("info", f"norm_type={norm} makes LPPool a max-pool of |x| (padding 0, dilation 1).",
                                  severity="info"))
        if nd == 1:
            out = _max_pool1d(ex, shape, k, s, 0, 1, ceil)
        else:
            out = _max_pool(ex, nd, shape, k, s, 0, 1, ceil)
    else:
        out = _avg_pool(ex, nd, shape, k, s, 0, ceil, None)
    if nd == 1 and isinstance(k, tuple) and not math.isinf(norm):
        # F.lp_pool1d multiplies the result by kernel_size itself.
        type_name = type(params["kernel_size"]).__name__
        _raise("LPPool1d multiplies by kernel_size, which must be a plain int here",
               f"mul(): argument 'other' (position 1) must be Tensor, not {type_name}", "§5",
               exc="TypeError", where="kernel_size", got=k,
               suggestions=[f"kernel_size={k[0]}" if k else "kernel_size=…"])
    if norm == 0:  # torch < 2.14 only: 2.14 raised above
        _raise("norm_type=0 makes LPPool compute x ** (1/0)", "float division by zero", "§5",
               exc="ZeroDivisionError", where="norm_type", got=0, suggestions=["norm_type=1 or 2"])
    return out


# --------------------------------------------------------------------------------------------
# small shared checks


def _stride(s: Any, k: Any) -> Any:
    """``stride=None`` (an empty list for ATen) means ``stride = kernel_size``."""
    return k if s == () else s


def _unsqueeze(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return shape[:-1] + (1, shape[-1])


def _rank_2_3(shape: Tuple[int, ...], fn: str) -> None:
    if len(shape) not in (2, 3):
        _raise(f"{fn} needs a 2-D (C, L) or 3-D (N, C, L) input, got {len(shape)}-D",
               f"Expected 2 to 3 dimensions, but got {len(shape)}-dimensional tensor for argument #1 'self' "
               f"(while checking arguments for {fn})", "§3.4" if fn.startswith("max") else "§4",
               where="input", expected="2 or 3 dims", got=len(shape), suggestions=["input (N, C, L) or (C, L)"])


def _one_int(name: str, v: Any, fn: str, allow_empty: bool) -> None:
    if isinstance(v, tuple) and len(v) != 1 and not (allow_empty and len(v) == 0):
        _raise(f"{name} of a 1-D pool must be an int or a 1-tuple, got {len(v)} values",
               f"{fn}() argument '{name}' should contain one int (got {len(v)})", "§4", where=name,
               expected="an int or a 1-tuple", got=v, suggestions=[f"{name}={v[0]}" if v else f"{name}=…"])


def _check_len(name: str, v: Any, nd: int, msg: str, allow_empty: bool) -> None:
    if isinstance(v, tuple) and len(v) not in (1, nd) and not (allow_empty and len(v) == 0):
        _raise(f"{name} must be an int or a tuple of {nd} (got {len(v)} values)", msg, "§3.3", where=name,
               expected=f"an int or {nd} values", got=v, suggestions=[f"{name} as an int or a {nd}-tuple"])

