"""nn.Unfold (im2col) and nn.Fold (col2im) — 2-D only (shape_rules.md §7).

Unfold cuts every ``k_h × k_w`` block a conv would see into one column::

    blocks_h = (H + 2p_h − E_h) // s_h + 1      (the conv formula; blocks_w likewise)
    (N, C, H, W) → (N, C·k_h·k_w, blocks_h·blocks_w)          unbatched: drop N

Fold puts the columns back (overlaps are summed): ``(N, C·k_h·k_w, L) → (N, C, *output_size)``,
where ``L`` must equal the block count that ``output_size`` gives with the same formula.

Checks in torch's order. Unfold: the four argument lengths → kernel > 0 → dilation > 0 →
padding ≥ 0 → stride > 0 → rank 3/4 with non-empty C, H, W → blocks ≥ 1. Fold: the five
argument lengths → kernel → **stride** → dilation → padding → rank 2/3 non-empty → C divisible by
``k_h·k_w`` → ``L`` matches → blocks ≥ 1 → output_size ≥ 1. Fold's messages say "dimension 1/2" even for an
unbatched input (it is unsqueezed after the rank check).
"""

from __future__ import annotations

from typing import List, Tuple

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes import conv_core as core
from layerlab.shapes.arith import ceil_div, effective_kernel
from layerlab.shapes.result import DimStep, Explanation, ShapeNote
from layerlab.shapes.unread import unread_notes


def _fail(exc: str, torch_message: str, message: str, rule: str = "§7.1", **kw) -> TorchWouldRaise:
    return TorchWouldRaise(message, torch_exception=exc, torch_message=torch_message, rule=rule, **kw)


def _pair(value, name: str) -> Tuple[int, ...]:
    t = core.ntuple(value, 2, name)
    if any(isinstance(v, str) for v in t):
        raise UsageError(f"{name} must be an int or a tuple of ints", where=name, got=value)
    return t


def _lengths(args: List[Tuple[str, tuple]], rule: str) -> None:
    for name, t in args:
        if len(t) != 2:
            raise _fail("RuntimeError", f"It is expected {name} equals to 2, but got size {len(t)}",
                        f"{name} needs 2 values (height, width), got {len(t)}", rule=rule, where=name,
                        got=list(t), suggestions=[f"{name} as an int or a pair"])


def _positive(name: str, label: str, t: tuple, rule: str, strict: bool = True) -> None:
    bad = any(v <= 0 for v in t) if strict else any(v < 0 for v in t)
    if bad:
        what = "should be greater than zero" if strict else "should be non-negative"
        raise _fail("RuntimeError",
                    f"{name} {what}, but got {label}_height: {t[0]} {label}_width: {t[1]}",
                    f"{name} must be {'at least 1' if strict else '≥ 0'}", rule=rule,
                    where=name.replace(" ", "_"), got=list(t),
                    suggestions=[f"{name.replace(' size', '_size')}={1 if strict else 0}"])


def _dim_error(r: int, i: int) -> str:
    if r == 0:
        return f"Dimension specified as {i} but tensor has no dimensions"
    return f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {i})"


def _blocks(ex: Explanation, sizes, k, d, p, s, names=("H", "W")) -> List[int]:
    out = []
    for name, L, ki, di, pi, si in zip(names, sizes, k, d, p, s):
        E = effective_kernel(ki, di)
        b = (L + 2 * pi - E) // si + 1
        ex.steps.append(DimStep(name, L, f"blocks_{name} = ({name} + 2p − E) // s + 1",
                                f"({L} + 2·{pi} − {E}) // {si} + 1", b,
                                {"k": ki, "s": si, "p": pi, "d": di, "E": E}))
        out.append(b)
    return out


def _fit_suggestions(sizes, k, d, p) -> List[str]:
    """The smallest padding, and the largest kernel, that give at least one block per dim."""
    need = tuple(max(pi, ceil_div(effective_kernel(ki, di) - L, 2)) for L, ki, di, pi in zip(sizes, k, d, p))
    kmax = tuple((L + 2 * pi - 1) // di + 1 for L, di, pi in zip(sizes, d, p))
    return [f"padding={need}", f"kernel_size ≤ {kmax}"]


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """nn.Unfold or nn.Fold, by ``spec.name``."""
    (_unfold if spec.name == "unfold" else _fold)(ex, shape, params)


def _unfold(ex: Explanation, shape: Tuple[int, ...], params: dict) -> None:
    k, d = _pair(params["kernel_size"], "kernel_size"), _pair(params["dilation"], "dilation")
    p, s = _pair(params["padding"], "padding"), _pair(params["stride"], "stride")
    _lengths([("kernel_size", k), ("dilation", d), ("padding", p), ("stride", s)], "§7.1")
    _positive("kernel size", "kernel", k, "§7.1")
    _positive("dilation", "dilation", d, "§7.1")
    _positive("padding", "pad", p, "§7.1", strict=False)
    _positive("stride", "stride", s, "§7.1")
    r = len(shape)
    # torch reads size(1) and size(2) before it looks at the rank: a 0/1/2-D input can fail there
    for i in (1, 2):
        if i >= r:
            raise _fail("IndexError", _dim_error(r, i), f"nn.Unfold needs a 3-D (C, H, W) or 4-D (N, C, H, W) "
                        f"input, not {r}-D", where="input", got=list(shape))
        if shape[i] == 0:
            break
    ok = (r == 3 and all(shape)) or (r == 4 and all(shape[1:]))
    if not ok:
        raise _fail("RuntimeError",
                    "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions "
                    f"for input, but got: {core.shape_str(shape)}",
                    "nn.Unfold needs a 3-D (C, H, W) or 4-D (N, C, H, W) input whose C, H and W are non-empty",
                    where="input", got=list(shape))
    H, W = shape[-2:]
    C = shape[-3]
    bh, bw = _blocks(ex, (H, W), k, d, p, s)
    if bh < 1 or bw < 1:
        raise _fail("RuntimeError",
                    f"Given input with spatial size ({H}, {W}), kernel_size=({k[0]}, {k[1]}), dilation=({d[0]}, "
                    f"{d[1]}), padding=({p[0]}, {p[1]}), calculated shape of the array of sliding blocks as ({bh}, "
                    f"{bw}), but its components must be at least one.",
                    "the (dilated) kernel does not fit in the padded input",
                    where=",".join(n for n, b in (("H", bh), ("W", bw)) if b < 1), got=[bh, bw],
                    suggestions=_fit_suggestions((H, W), k, d, p))
    ex.steps.append(DimStep("C", C, "C·k_h·k_w", f"{C}·{k[0]}·{k[1]}", C * k[0] * k[1], {"k": list(k)}))
    ex.steps.append(DimStep("L", None, "blocks_H · blocks_W", f"{bh} · {bw}", bh * bw, {}))
    ex.output_shape = shape[:-3] + (C * k[0] * k[1], bh * bw)
    for i, (name, L) in enumerate((("H", H), ("W", W))):
        ex.notes.extend(unread_notes(name, L, k[i], s[i], p[i], d[i], (bh, bw)[i]))


def _fold(ex: Explanation, shape: Tuple[int, ...], params: dict) -> None:
    o = _pair(params["output_size"], "output_size")
    k, d = _pair(params["kernel_size"], "kernel_size"), _pair(params["dilation"], "dilation")
    p, s = _pair(params["padding"], "padding"), _pair(params["stride"], "stride")
    _lengths([("output_size", o), ("kernel_size", k), ("dilation", d), ("padding", p), ("stride", s)], "§7.2")
    _positive("kernel size", "kernel", k, "§7.2")
    _positive("stride", "stride", s, "§7.2")
    _positive("dilation", "dilation", d, "§7.2")
    _positive("padding", "pad", p, "§7.2", strict=False)
    r = len(shape)
    if not ((r == 2 and all(shape)) or (r == 3 and all(shape[1:]))):
        raise _fail("RuntimeError",
                    "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero "
                    f"dimensions for input, but got: {core.shape_str(shape)}",
                    "nn.Fold takes (N, C·k_h·k_w, L) or (C·k_h·k_w, L) with non-empty C·k_h·k_w and L",
                    rule="§7.2", where="input", got=list(shape))
    cols, L = shape[-2], shape[-1]
    kk = k[0] * k[1]
    if cols % kk:
        raise _fail("RuntimeError",
                    f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got "
                    f"input.size(1)={cols} and kernel_size=({k[0]}, {k[1]}).",
                    f"the input has {cols} values per block, not a multiple of k_h·k_w = {kk}", rule="§7.2",
                    where="C", got=cols, suggestions=[f"an input with C·{kk} rows"])
    bh, bw = _blocks(ex, o, k, d, p, s)
    ex.steps.append(DimStep("L", L, "blocks_H · blocks_W (must equal the input's L)", f"{bh} · {bw}", bh * bw, {}))
    if L != bh * bw:
        raise _fail("RuntimeError",
                    f"Given output_size=({o[0]}, {o[1]}), kernel_size=({k[0]}, {k[1]}), dilation=({d[0]}, {d[1]}), "
                    f"padding=({p[0]}, {p[1]}), stride=({s[0]}, {s[1]}), expected size of input's dimension 2 to "
                    f"match the calculated number of sliding blocks {bh} * {bw} = {bh * bw}, but got "
                    f"input.size(2)={L}.",
                    f"output_size {list(o)} has {bh}·{bw} = {bh * bw} blocks, but the input has L = {L}",
                    rule="§7.2", where="L", expected=bh * bw, got=L,
                    suggestions=[f"an input with L = {bh * bw}"] if bh * bw > 0 else [])
    if bh < 1 or bw < 1:
        raise _fail("RuntimeError",
                    f"Given output_size=({o[0]}, {o[1]}), kernel_size=({k[0]}, {k[1]}), dilation=({d[0]}, {d[1]}), "
                    f"padding=({p[0]}, {p[1]}), stride=({s[0]}, {s[1]}), calculated shape of the array of sliding "
                    f"blocks as ({bh}, {bw}), which is too small (non-positive)",
                    "output_size is too small for one block", rule="§7.2", where="output_size", got=list(o))
    if o[0] <= 0 or o[1] <= 0:
        raise _fail("RuntimeError",
                    f"Expected output spatial size to be positive, but got: output_size=({o[0]}, {o[1]}).",
                    "output_size must be at least 1 in both dims", rule="§7.2", where="output_size", got=list(o))
    C = cols // kk
    ex.steps.append(DimStep("C", cols, "C_in / (k_h·k_w)", f"{cols} / ({k[0]}·{k[1]})", C, {"k": list(k)}))
    ex.output_shape = shape[:-2] + (C,) + tuple(o)
    if any(si < effective_kernel(ki, di) for si, ki, di in zip(s, k, d)):
        ex.notes.append(ShapeNote("info", "blocks overlap (stride < kernel span): Fold SUMS the overlapping "
                                          "values, so Fold(Unfold(x)) ≠ x", severity="info"))
