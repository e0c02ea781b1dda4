"""Inverse questions: which settings take an input size to a target size?

* conv / pools — "which padding (and stride, kernel) takes 32 to 16?", "what keeps 32 → 32?":
  the closed form of shape_rules.md §14.3 proposes paddings per (k, s); every candidate is then
  run through the forward arithmetic (:func:`layerlab.shapes.explain`), so an answer is listed
  only if torch would really produce the target (pool padding limits and all).
* ConvTranspose — the ``output_padding`` / ``output_size`` that reaches a size (§14.3), and the
  ``output_padding`` that undoes a given conv ``L → M`` (U-Net skips, §14.3).

Every dimension is solved on its own (the rules are per-dim); a candidate is checked on an input
whose every spatial dim has that dimension's size, so rules that look at all dims (AvgPool3d's
input ≥ kernel) are respected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

from layerlab.errors import UsageError
from layerlab.shapes import explain
from layerlab.shapes.arith import ceil_div, conv_out, conv_transpose_out, effective_kernel
from layerlab.shapes.unread import unread_count
from layerlab.shapes.ops import resolve

#: The grids searched when ``kernel_size`` / ``stride`` are not fixed by the user.
KERNEL_GRID = (1, 2, 3, 4, 5, 7)
STRIDE_GRID = (1, 2, 3, 4)


@dataclass
class Candidate:
    """One setting that reaches the target in one dim: the params and a plain-words comment."""

    params: Dict[str, Any]
    comment: str = ""


@dataclass
class DimAnswer:
    """The answers for one spatial dim: ``input`` → ``target``."""

    dim: str
    input: int
    target: int
    candidates: List[Candidate] = field(default_factory=list)
    derivation: List[str] = field(default_factory=list)


@dataclass
class InverseResult:
    """What ``explain-shape --target`` / ``--undo`` computes; ``ok`` is False when nothing fits."""

    question: str
    op: str
    input_shape: Tuple[int, ...]
    fixed: Dict[str, Any]
    dims: List[DimAnswer]

    @property
    def ok(self) -> bool:
        return all(d.candidates for d in self.dims)

    def to_dict(self) -> dict:
        from layerlab.shapes.result import SCHEMA_VERSION

        return {"schema": SCHEMA_VERSION, "kind": "inverse", "question": self.question, "op": self.op,
                "input_shape": list(self.input_shape), "fixed": self.fixed, "ok": self.ok, "dims": self.dims}


def _dim_names(nd: int) -> Tuple[str, ...]:
    return {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}[nd]


def _per_dim(value: Any, nd: int, i: int) -> Any:
    if isinstance(value, (tuple, list)):
        return value[i] if len(value) == nd else value[0]
    return value


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else ()


def _output(op: str, full_shape: Sequence[int], params: Dict[str, Any], nd: int, size: int) -> str:
    """What ``op(**params)`` makes of ``size`` in every spatial dim: a size, or torch's error."""
    shape = tuple(full_shape[: len(full_shape) - nd]) + (size,) * nd
    ex = explain(op, shape, **params)
    if ex.output_shape is None:
        return f"torch raises {ex.error.torch_exception}" if ex.error is not None else "error"
    return str(ex.output_shape[-1])


def _check(op: str, full_shape: Sequence[int], params: Dict[str, Any], nd: int, size: int, target: int) -> bool:
    """Does ``op(**params)`` map a tensor whose spatial dims all equal ``size`` to ``target``?"""
    shape = tuple(full_shape[: len(full_shape) - nd]) + (size,) * nd
    ex = explain(op, shape, **params)
    return ex.output_shape is not None and all(v == target for v in ex.output_shape[-nd:])


def _padding_range(L: int, target: int, k: int, s: int, d: int) -> Tuple[int, int]:
    """Symmetric paddings p with ``(L + 2p − E) // s + 1 == target`` (§14.3)."""
    E = effective_kernel(k, d)
    p_min = max(0, ceil_div(s * (target - 1) + E - L, 2))
    p_max = (s * target - 1 + E - L) // 2
    return p_min, p_max


def solve_target(op: str, input_shape: Sequence[int], target: Sequence[int], **fixed: Any) -> InverseResult:
    """Settings of ``op`` that take ``input_shape``'s spatial dims to ``target`` (one per dim).

    ``fixed`` holds what the user pinned (``kernel_size``, ``stride``, ``dilation``, …); the
    rest is searched: paddings from the closed form, kernels in :data:`KERNEL_GRID`, strides in
    :data:`STRIDE_GRID`.
    """
    shape = tuple(int(x) for x in input_shape)
    spec = resolve(op, n_spatial=max(len(shape) - 2, 1))
    nd = spec.nd or len(shape) - 2
    if len(target) == 1 and nd > 1:
        target = tuple(target) * nd
    if len(target) != nd:
        raise UsageError(
            f"--target has {len(target)} sizes but {spec.name} has {nd} spatial dims",
            where="--target", expected=f"{nd} sizes", got=len(target),
        )
    if spec.family == "conv_transpose":
        if isinstance(fixed.get("padding"), str) or any(isinstance(v, str) for v in _as_tuple(fixed.get("padding"))):
            raise UsageError(
                f"{spec.name} has no padding={fixed['padding']!r}: torch splits the string into characters and "
                "raises TypeError at forward (shape_rules.md §2.6)", where="--padding", got=fixed["padding"],
                hint="give an int --padding, or leave --padding out to search paddings 0–2")
        return _solve_conv_transpose(spec.name, shape, tuple(target), nd, fixed)
    if spec.family not in ("conv", "pool"):
        raise UsageError(
            f"--target is answered for conv, conv_transpose and max/avg/lp pools, not {spec.name}",
            where="--target",
            hint="adaptive pools and upsample take the target size directly: --output-size / --size",
        )
    answers = []
    for i, name in enumerate(_dim_names(nd)):
        L, t = shape[len(shape) - nd + i], target[i]
        answers.append(_solve_dim(spec.name, spec.family, shape, nd, name, L, t, fixed, i))
    question = f"which settings take {'x'.join(map(str, shape[-nd:]))} to {'x'.join(map(str, target))}?"
    return InverseResult(question, spec.name, shape, dict(fixed), answers)


def _ceil_padding_ranges(L: int, t: int, k: int, s: int, d: int) -> List[Tuple[int, int]]:
    """Paddings p ≥ 0 with ceil-mode pool output ``t`` (§3.1), as at most two integer intervals.

    With ``A = L − E`` the ceil formula gives ``naive = ⌈(A + 2p)/s⌉ + 1``, minus 1 when the last
    window starts at or after ``L + p``. So the output is ``t`` when either ``naive = t`` and the
    last window starts inside (``(t−1)·s < L + p``), or ``naive = t + 1`` and it is dropped
    (``t·s ≥ L + p``). Each is a pair of linear bounds on p.
    """
    A = L - effective_kernel(k, d)
    kept = (max(((t - 2) * s - A) // 2 + 1, (t - 1) * s - L + 1, 0), ((t - 1) * s - A) // 2)
    dropped = (max(((t - 1) * s - A) // 2 + 1, 0), min((t * s - A) // 2, t * s - L))
    return [r for r in (kept, dropped) if r[0] <= r[1]]


#: At most this many paddings per (kernel, stride) are checked and listed; the rest are counted.
CANDIDATE_LIMIT = 16


def _fixed_padding(fixed: Dict[str, Any], nd: int, i: int, family: str) -> Any:
    """The padding the user pinned for dim ``i`` (``'valid'`` is 0 for a conv), or None."""
    if "padding" not in fixed:
        return None
    p = _per_dim(fixed["padding"], nd, i)
    return 0 if p == "valid" and family == "conv" else p


def _solve_dim(op, family, shape, nd, name, L, t, fixed, i) -> DimAnswer:
    answer = DimAnswer(name, L, t)
    d = _per_dim(fixed.get("dilation", 1), nd, i)
    kernels = [_per_dim(fixed["kernel_size"], nd, i)] if "kernel_size" in fixed else list(KERNEL_GRID)
    strides = [_per_dim(fixed["stride"], nd, i)] if fixed.get("stride") is not None else list(STRIDE_GRID)
    base = {k: v for k, v in fixed.items() if k not in ("kernel_size", "stride", "padding", "dilation")}
    if "dilation" in fixed:
        base["dilation"] = d
    has_padding = not op.startswith("lp_pool")  # LPPool has no padding argument
    pinned = _fixed_padding(fixed, nd, i, family)
    single = len(kernels) == 1 and len(strides) == 1
    if pinned is not None:
        answer.derivation.append(f"padding is fixed by --padding: p = {pinned!r}")
    for k in kernels:
        # A pool's stride defaults to its kernel: that stride is always tried too.
        for s in strides + ([k] if family == "pool" and "stride" not in fixed and k not in strides else []):
            if not all(isinstance(v, int) and v > 0 for v in (k, s, d)):
                continue  # explain() of any setting reports the bad value itself
            E = effective_kernel(k, d)
            if not has_padding:
                ranges = [(0, 0)]
            elif family == "pool" and fixed.get("ceil_mode"):
                ranges = _ceil_padding_ranges(L, t, k, s, d)
            else:
                ranges = [_padding_range(L, t, k, s, d)]
            # Padding ≥ E would add windows that read nothing but padding: never an answer; pools
            # cap it at k // 2 anyway.
            cap = min(E - 1, k // 2) if family == "pool" else E - 1
            ranges = [(max(a, 0), min(b, cap)) for a, b in ranges if max(a, 0) <= min(b, cap)]
            if single and pinned is None:
                answer.derivation.append(_derivation(L, t, k, s, d, E, family, fixed.get("ceil_mode"), ranges))
            if pinned is not None:
                paddings = [pinned] if not isinstance(pinned, str) else []
                if not isinstance(pinned, str):
                    got = _output(op, shape, dict(base, kernel_size=k, stride=s, padding=pinned), nd, L)
                    answer.derivation.append(f"k={k}, s={s}, p={pinned}: {L} → {got}")
            else:
                paddings = [p for a, b in ranges for p in range(a, min(b, a + CANDIDATE_LIMIT) + 1)]
            listed = 0
            for p in paddings[:CANDIDATE_LIMIT]:
                params = dict(base, kernel_size=k, stride=s, **({"padding": p} if has_padding else {}))
                if _check(op, shape, params, nd, L, t):
                    listed += 1
                    answer.candidates.append(Candidate({"kernel_size": k, "stride": s, "padding": p if has_padding else 0},
                                                       _comment(L, k, s, p if has_padding else 0, d, t)))
            total = sum(b - a + 1 for a, b in ranges)
            if pinned is None and total > CANDIDATE_LIMIT:
                answer.derivation.append(
                    f"k={k}, s={s}: {total} paddings satisfy the formula ({_show_ranges(ranges)}); the first "
                    f"{CANDIDATE_LIMIT} are checked and listed")
            want_same = pinned == "same" or (pinned is None and d * (k - 1) % 2 == 1)
            if family == "conv" and s == 1 and t == L and want_same:
                params = dict(base, kernel_size=k, stride=1, padding="same")
                if _check(op, shape, params, nd, L, t):
                    answer.candidates.append(
                        Candidate({"kernel_size": k, "stride": 1, "padding": "same"},
                                  "no symmetric padding keeps the size (d·(k−1) is odd): 'same' pads the extra pixel at the end"
                                  if d * (k - 1) % 2 else "'same' keeps the size at stride 1")
                    )
    # Settings that read every pixel first, then the smallest stride and kernel.
    answer.candidates.sort(
        key=lambda c: (c.comment != "reads every pixel", c.params["stride"], c.params["kernel_size"],
                       isinstance(c.params["padding"], str), str(c.params["padding"]).zfill(24))
    )
    return answer


def _show_ranges(ranges: List[Tuple[int, int]]) -> str:
    return " and ".join(f"p = {a}…{b}" if a != b else f"p = {a}" for a, b in ranges)


def _derivation(L, t, k, s, d, E, family, ceil, ranges) -> str:
    if ceil and family == "pool":
        head = (f"ceil mode, L={L}, t={t}, k={k}, s={s}, d={d}, E={E}: ⌈(L + 2p − E)/s⌉ + 1 = t with the last "
                f"window starting before L + p, or t + 1 with it dropped")
    else:
        head = (f"need s·(t−1) ≤ L + 2p − E ≤ s·(t−1) + s − 1 with L={L}, t={t}, k={k}, s={s}, d={d}, E={E}: "
                f"p from ⌈({s}·{t - 1} + {E} − {L})/2⌉ to ⌊({s}·{t} − 1 + {E} − {L})/2⌋")
    limits = f", p ≤ E − 1 = {E - 1}" + (f", p ≤ k//2 = {k // 2} for pools" if family == "pool" else "")
    return head + limits + (f" → {_show_ranges(ranges)}" if ranges else " → none")


def _comment(L: int, k: int, s: int, p: int, d: int, n: int) -> str:
    lost = unread_count(L, k, s, p, d, n)
    if lost is None:
        return "too large to count the pixels it reads"
    return "reads every pixel" if not lost else f"loses {lost} pixel(s)"


def _solve_conv_transpose(op, shape, target, nd, fixed) -> InverseResult:
    answers = []
    for i, name in enumerate(_dim_names(nd)):
        L, t = shape[len(shape) - nd + i], target[i]
        answer = DimAnswer(name, L, t)
        d = _per_dim(fixed.get("dilation", 1), nd, i)
        kernels = [_per_dim(fixed["kernel_size"], nd, i)] if "kernel_size" in fixed else [1, 2, 3, 4]
        strides = [_per_dim(fixed["stride"], nd, i)] if fixed.get("stride") is not None else list(STRIDE_GRID)
        paddings = [_per_dim(fixed["padding"], nd, i)] if "padding" in fixed else [0, 1, 2]
        for k in kernels:
            for s in strides:
                for p in paddings:
                    low = conv_transpose_out(L, k, s, p, d, 0)
                    op_needed = t - low
                    if len(kernels) == len(strides) == len(paddings) == 1:
                        answer.derivation.append(
                            f"(L − 1)·s − 2p + d·(k − 1) + 1 = ({L} − 1)·{s} − 2·{p} + {d}·({k} − 1) + 1 = {low}; "
                            f"output_padding = {t} − {low} = {op_needed}; allowed: 0 ≤ output_padding < max(s, d) = {max(s, d)}; "
                            f"output_size= reaches [{low}, {low + s - 1}]"
                        )
                    if 0 <= op_needed < max(s, d) and low >= 1:
                        params = {"kernel_size": k, "stride": s, "padding": p, "output_padding": op_needed}
                        if d != 1:
                            params["dilation"] = d
                        comment = "or output_size=… in forward()" if op_needed < s else "only via output_padding (output_size's range uses the stride only)"
                        answer.candidates.append(Candidate(params, comment))
        answers.append(answer)
    question = f"which ConvTranspose settings take {'x'.join(map(str, shape[-nd:]))} to {'x'.join(map(str, target))}?"
    return InverseResult(question, op, shape, dict(fixed), answers)


def solve_undo(op: str, input_shape: Sequence[int], undo: Sequence[int], **fixed: Any) -> InverseResult:
    """The ConvTranspose ``output_padding`` that undoes a conv with the same k, s, p, d.

    ``undo`` is the size the conv took as input (``L``); ``input_shape``'s spatial dims are what
    it gave (``M``). ``output_padding = (L + 2p − E) mod s`` (always < s).
    """
    shape = tuple(int(x) for x in input_shape)
    spec = resolve(op, n_spatial=max(len(shape) - 2, 1))
    if spec.family != "conv_transpose":
        raise UsageError("--undo is a ConvTranspose question", where="--undo", hint="use --op conv_transpose")
    nd = spec.nd
    if len(undo) == 1 and nd > 1:
        undo = tuple(undo) * nd
    answers = []
    for i, name in enumerate(_dim_names(nd)):
        M, L = shape[len(shape) - nd + i], undo[i]
        k = _per_dim(fixed.get("kernel_size", 1), nd, i)
        s = _per_dim(fixed.get("stride", 1) or 1, nd, i)
        p = _per_dim(fixed.get("padding", 0), nd, i)
        d = _per_dim(fixed.get("dilation", 1), nd, i)
        answers.append(_undo_dim(name, M, L, k, s, p, d))
    return InverseResult(f"which ConvTranspose undoes the conv {'x'.join(map(str, undo))} → {'x'.join(map(str, shape[-nd:]))}?",
                         spec.name, shape, dict(fixed), answers)


def _undo_dim(name: str, M: int, L: int, k: int, s: int, p: Any, d: int) -> DimAnswer:
    """One dim of :func:`solve_undo`: the conv ``L → M`` had padding ``p`` (an int, 'valid' or 'same')."""
    E = effective_kernel(k, d)
    answer = DimAnswer(name, M, L)
    if p == "same":
        return _undo_same(answer, M, L, k, s, d)
    note = ""
    if p == "valid":
        p, note = 0, " (the conv's padding='valid' is 0; the ConvTranspose needs the int: a string is a TypeError there)"
    conv_gives = conv_out(L, k, s, p, d)
    answer.derivation.append(f"the conv maps {L} → ({L} + 2·{p} − {E}) // {s} + 1 = {conv_gives}{note}")
    if conv_gives != M:
        answer.derivation.append(f"but this input has {M}: that conv did not produce it")
    else:
        opad = (L + 2 * p - E) % s
        answer.derivation.append(f"output_padding = ({L} + 2·{p} − {E}) mod {s} = {opad}")
        params = {"output_padding": opad} if not note else {"padding": 0, "output_padding": opad}
        answer.candidates.append(Candidate(params, f"or output_size={L} in forward()"))
    return answer


def _undo_same(answer: DimAnswer, M: int, L: int, k: int, s: int, d: int) -> DimAnswer:
    """A conv with ``padding='same'`` (stride 1) keeps the size; the ConvTranspose needs an int padding
    ``p`` and ``output_padding`` with ``M + d·(k−1) − 2p + op = L`` and ``op < max(s, d)``."""
    if s != 1:
        answer.derivation.append("a conv with padding='same' and stride > 1 does not exist: torch raises "
                                 "'padding='same' is not supported for strided convolutions'")
        return answer
    total = d * (k - 1)
    answer.derivation.append(f"padding='same' keeps the size: the conv maps {L} → {L}")
    if M != L:
        answer.derivation.append(f"but this input has {M}: that conv did not produce it")
        return answer
    opad = total % 2  # an odd total d·(k−1) needs one pixel of output_padding on top of p = ⌈total/2⌉
    p = (total + opad) // 2
    answer.derivation.append(f"ConvTranspose: {M} + d·(k−1) − 2p + output_padding = {M} + {total} − 2·{p} + {opad} "
                             f"= {M + total - 2 * p + opad}; output_padding must be < max(stride, dilation) = {max(s, d)}")
    if opad < max(s, d):
        answer.candidates.append(Candidate({"padding": p, "output_padding": opad},
                                           "ConvTranspose has no padding='same': use this int padding"))
    else:
        answer.derivation.append("no int padding works: d·(k−1) is odd and output_padding 1 needs stride or "
                                 "dilation ≥ 2; crop the output by one pixel instead")
    return answer
