"""Conv1d / Conv2d / Conv3d (module semantics): ``nn.ConvNd(in_channels, out_channels, kernel_size, …)(x)``.

Per spatial dim (shape_rules.md §1.1)::

    L_out = (L + 2p − E) // s + 1        E = d·(k − 1) + 1   (the dilated kernel's span)

* the padded input must hold one whole window in every dim (``L + 2p ≥ E``), else
  ``Calculated padded input size per channel: (…). Kernel size: (…). Kernel size can't be greater
  than actual input size``;
* the floor silently drops the pixels past the last full window (note ``cropped``, §14.4) and a
  stride larger than the window skips the pixels between windows (note ``skipped``);
* ``padding='valid'`` is 0; ``padding='same'`` keeps every size, needs stride 1 and splits an odd
  total ``d·(k−1)`` with the extra pixel at the END (note ``same-asymmetric``, §1.5);
* ``padding_mode`` other than ``'zeros'`` runs ``F.pad`` first (its limits, §1.6), then a conv
  with padding 0 — same shape;
* output channels = ``out_channels``, except an input with 0 channels gives 0 (§1.2).

The checks run in torch's order (§1.7) — see :mod:`layerlab.shapes.conv_core`, which this module
drives; this one adds the explanation: the per-dim steps, the notes and the suggestions.
"""

from __future__ import annotations

import difflib
from typing import List, Optional, Sequence, Tuple

from layerlab.errors import UsageError
from layerlab.shapes import conv_core as core
from layerlab.shapes.arith import ceil_div, effective_kernel
from layerlab.shapes.fpad import pad_nonconstant
from layerlab.shapes.result import DimStep, Explanation, ShapeNote
from layerlab.shapes.unread import unread_notes

DIM_NAMES = {1: ["L"], 2: ["H", "W"], 3: ["D", "H", "W"]}

def spatial_names(nd: int) -> List[str]:
    return DIM_NAMES[nd]


def input_channels(shape: Tuple[int, ...], nd: int) -> int:
    """``in_channels=None``: the C of the input (``shape[-nd-1]``); 1 if the input has no C dim."""
    return shape[-nd - 1] if len(shape) >= nd + 1 else 1


def per_dim(values, nd: int) -> Optional[List[int]]:
    """The module's tuple as ``nd`` ints, or None when its length is wrong (torch then raises)."""
    t = tuple(values)
    if len(t) == 1:
        t = t * nd
    if len(t) != nd or not all(isinstance(v, int) for v in t):
        return None
    return list(t)


# ---------------------------------------------------------------------------------------------
# suggestions and plain words for torch's errors
# ---------------------------------------------------------------------------------------------

def divisors(n: int) -> List[int]:
    return [g for g in range(1, abs(n) + 1) if n % g == 0] if n else []


class ConvAdvisor:
    """``advise(check, data)`` for :func:`conv_core.fail`: plain words and the nearest valid settings."""

    def __init__(self, nd: int, shape: Tuple[int, ...], in_channels: int, out_channels: int, params: dict,
                 cls: str = "Conv"):
        self.nd, self.shape, self.params, self.cls = nd, shape, params, f"nn.{cls}{nd}d"
        self.in_channels, self.out_channels = in_channels, out_channels
        self.names = spatial_names(nd)
        self.spatial = list(shape[-nd:]) if len(shape) >= nd + 1 else None

    def __call__(self, check: str, data: dict) -> dict:
        fn = getattr(self, "_" + check.replace("-", "_"), None)
        return fn(data) if fn else {}

    def _groups_positive(self, data):
        return dict(message=f"groups={data['groups']}: groups must be a positive integer", where="groups",
                    expected="groups ≥ 1", got=data["groups"], suggestions=["groups=1"])

    def _valid_groups(self) -> List[str]:
        import math
        g = math.gcd(self.in_channels, self.out_channels)
        return [f"groups={x}" for x in divisors(g)][-3:] if g else ["groups=1"]

    def _in_divisible(self, data):
        return dict(message=f"in_channels={data['channels']} is not a multiple of groups={data['groups']}",
                    where="groups", got=data["groups"], suggestions=self._valid_groups())

    def _out_divisible(self, data):
        g, c = data["groups"], data["channels"]
        near = sorted({max(g, (c // g) * g), ceil_div(c, g) * g})
        return dict(message=f"out_channels={c} is not a multiple of groups={g}", where="out_channels",
                    got=c, suggestions=[f"out_channels={x}" for x in near] + self._valid_groups())

    def _padding_string(self, data):
        return dict(message=f"padding={data['padding']!r} is not a padding mode", where="padding",
                    expected="an int, a tuple, 'same' or 'valid'", got=data["padding"],
                    suggestions=(["padding='same'"] if self._stride_one() else []) + ["padding='valid'"])

    def _stride_one(self) -> bool:
        """torch forbids padding='same' with a stride > 1: only then is it a suggestion."""
        s = self.params.get("stride", 1)
        return all(v == 1 for v in (s if isinstance(s, (tuple, list)) else (s,)))

    def _same_strided(self, data):
        sugg = ["stride=1"]
        k = per_dim(core.ntuple(self.params["kernel_size"], self.nd, "kernel_size"), self.nd)
        d = per_dim(core.ntuple(self.params["dilation"], self.nd, "dilation"), self.nd)
        s = per_dim(data["stride"], self.nd)
        if self.spatial and k and d and s and all(x > 0 for x in s + k + d):
            pads = []
            for L, ki, si, di in zip(self.spatial, k, s, d):
                total = max((ceil_div(L, si) - 1) * si + effective_kernel(ki, di) - L, 0)
                pads.append(ceil_div(total, 2))
            sugg.append(f"padding={pads[0] if len(set(pads)) == 1 else tuple(pads)} (TF-style SAME: ⌈L/s⌉)")
        return dict(message="padding='same' keeps the size, which a stride > 1 cannot do", where="padding",
                    got=data["stride"], suggestions=sugg,
                    hint=f"F.conv{self.nd}d raises RuntimeError with the same text (the module checks first, "
                         "at construction)")

    def _padding_mode(self, data):
        modes = ["zeros", "reflect", "replicate", "circular"]
        close = difflib.get_close_matches(str(data["mode"]), modes, n=2, cutoff=0.3)
        return dict(message=f"padding_mode={data['mode']!r} is not one of {', '.join(modes)}",
                    where="padding_mode", got=data["mode"], suggestions=[f"padding_mode={m!r}" for m in close])

    def _negative_dimension(self, data):
        return dict(message=f"the weight would have shape {list(data['weight'])}: channels and kernel_size "
                            "must not be negative", where="kernel_size", got=list(data["weight"]))

    def _rank(self, data):
        sp = ", ".join(self.names)
        sugg = [f"an input of shape (C, {sp}) or (N, C, {sp})"]
        if len(self.shape) == self.nd:
            sugg.insert(0, "x.unsqueeze(0) (add the channel dim)")
        return dict(message=f"{self.cls} takes a {self.nd + 1}-D (C, {sp}) or {self.nd + 2}-D (N, C, {sp}) "
                            f"input, not {len(self.shape)}-D", where="input", got=list(self.shape),
                    expected=data.get("expected"), suggestions=sugg)

    def _param_length(self, data):
        return dict(message=f"{data['name']} has {data['got']} values; this op has {data['dim']} spatial dims",
                    where=data["name"], got=data["got"],
                    suggestions=[f"{data['name']} as an int or a tuple of {self.nd} ints"])

    def _weight_dim(self, data):
        return dict(message=f"kernel_size must have {self.nd} entries for {self.cls}", where="kernel_size",
                    suggestions=[f"kernel_size as an int or a tuple of {self.nd} ints"])

    def _negative_padding(self, data):
        return dict(message="padding cannot be negative", where="padding", got=data["padding"],
                    suggestions=["padding=0"])

    def _nonpositive_stride(self, data):
        return dict(message="stride must be at least 1", where="stride", got=data["stride"], suggestions=["stride=1"])

    def _negative_dilation(self, data):
        return dict(message="dilation must be at least 1", where="dilation", got=data["dilation"],
                    suggestions=["dilation=1"])

    def _dilation_zero(self, data):
        return dict(message="dilation must be at least 1 (0 would collapse the kernel to one point)",
                    where="dilation", got=data.get("dilation"), suggestions=["dilation=1"])

    def _kernel_zero(self, data):
        return dict(message="kernel_size must be at least 1", where="kernel_size", suggestions=["kernel_size=1"])

    def _groups_weight(self, data):
        return dict(message=f"out_channels={data['w0']} must be a positive multiple of groups={data['groups']}",
                    where="out_channels", got=data["w0"], suggestions=[f"out_channels={data['groups']}"])

    def _channels(self, data):
        return dict(message=f"the layer was built for {data['expected']} input channels but the input has "
                            f"{data['got']}", where="C", expected=data["expected"], got=data["got"],
                    suggestions=[f"in_channels={data['got']}" if data["got"] % self.params.get("groups", 1) == 0
                                 else f"an input with {data['expected']} channels"],
                    hint="the channel dim is dim 1 of a batched input, dim 0 of an unbatched one")

    def _kernel_too_big(self, data):
        padded, eff = data["padded"], data["effective"]
        names = self.names if len(padded) == self.nd else [f"dim {i}" for i in range(len(padded))]
        bad = [i for i, (a, b) in enumerate(zip(padded, eff)) if a < b]
        k = per_dim(core.ntuple(self.params["kernel_size"], self.nd, "kernel_size"), self.nd)
        d = per_dim(core.ntuple(self.params["dilation"], self.nd, "dilation"), self.nd)
        sugg = []
        if k and d and len(padded) == self.nd:
            kmax = [(padded[i] - 1) // d[i] + 1 if d[i] > 0 else k[i] for i in range(self.nd)]
            if all(v >= 1 for v in kmax):
                sugg.append(f"kernel_size ≤ {min(kmax)}" if len(set(kmax)) == 1 or self.nd == 1
                            else f"kernel_size ≤ {tuple(kmax)}")
            pad = self.params.get("padding")
            if isinstance(pad, (int, tuple, list)) and self.params.get("padding_mode", "zeros") == "zeros":
                p = per_dim(core.ntuple(pad, self.nd, "padding"), self.nd)
                if p:
                    need = [max(p[i], ceil_div(eff[i] - (padded[i] - 2 * p[i]), 2)) for i in range(self.nd)]
                    sugg.append(f"padding={need[0] if len(set(need)) == 1 else tuple(need)}")
            s = per_dim(core.ntuple(self.params.get("stride", 1), self.nd, "stride"), self.nd)
            if s and all(x == 1 for x in s):
                sugg.append("padding='same'")
        which = ", ".join(f"{names[i]}: padded size {padded[i]} < kernel span {eff[i]}" for i in bad)
        return dict(message=f"the kernel does not fit in the padded input ({which})",
                    where=",".join(names[i] for i in bad), expected=f"padded size ≥ {eff}", got=padded,
                    suggestions=sugg)

    def _empty_input(self, data):
        return dict(message="a spatial dim of the input is 0; torch only accepts an empty batch or channel dim",
                    where="input", got=list(data["input"]))


# ---------------------------------------------------------------------------------------------
# the op
# ---------------------------------------------------------------------------------------------

def conv_steps(ex: Explanation, nd: int, spatial: Sequence[int], k, s, d, pads_lr, mode: str) -> List[int]:
    """One DimStep per spatial dim; ``pads_lr`` is ``[(left, right), …]``. Returns the outputs."""
    outs = []
    for name, L, ki, si, di, (pl, pr) in zip(spatial_names(nd), spatial, k, s, d, pads_lr):
        E = effective_kernel(ki, di)
        num = L + pl + pr - E
        out = num // si + 1 if si > 0 else num + 1
        values = {"k": ki, "s": si, "p": pl, "d": di, "E": E}
        if pl == pr:
            formula = f"({name} + 2p − E) // s + 1"
            sub = f"({L} + 2·{pl} − {E}) // {si} + 1"
        else:
            formula = f"({name} + p_left + p_right − E) // s + 1"
            sub = f"({L} + {pl} + {pr} − {E}) // {si} + 1"
            values.update(p_left=pl, p_right=pr)
            values.pop("p")
        if mode != "zeros" and (pl or pr):  # with no padding the mode does nothing: not a value of this step
            values["padding_mode"] = mode
        ex.steps.append(DimStep(name, L, formula, sub, out, values))
        outs.append(out)
    return outs


def resolve_channels(shape: Tuple[int, ...], nd: int, params: dict) -> Tuple[int, int]:
    """``in_channels=None`` takes C from the input; ``out_channels=None`` means ``= in_channels``."""
    in_ch = params["in_channels"]
    if in_ch is None:
        in_ch = input_channels(shape, nd)
    out_ch = params["out_channels"] if params["out_channels"] is not None else in_ch
    for name, v in (("in_channels", in_ch), ("out_channels", out_ch), ("groups", params["groups"])):
        if not isinstance(v, int) or isinstance(v, bool):
            raise UsageError(f"{name} must be an int", where=name, got=v)
    return in_ch, out_ch


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """``nn.Conv{nd}d(...)(x)``: construction checks, F.pad, then ATen's conv, with steps and notes."""
    if spec.functional:
        from layerlab.shapes.conv_functional import explain_conv

        return explain_conv(ex, spec, shape, params)
    nd = spec.nd
    cls = f"Conv{nd}d"
    in_ch, out_ch = resolve_channels(shape, nd, params)
    advise = ConvAdvisor(nd, shape, in_ch, out_ch, params)
    m = core.construct(nd, False, cls, in_ch, out_ch, params["kernel_size"], params["stride"], params["padding"],
                       params["dilation"], params["groups"], params["padding_mode"], advise=advise)
    _steps_and_notes_before(ex, m, shape)

    x = shape
    padding = m.padding
    if m.padding_mode != "zeros":
        x = pad_nonconstant(x, m.reversed_padding, m.padding_mode, names=spatial_names(nd), rules=ex.torch_rules)
        padding = (0,) * nd
        if any(m.reversed_padding):
            ex.notes.append(ShapeNote(
                "info", f"padding_mode={m.padding_mode!r}: F.pad adds the padding ({m.padding_mode}) first, then "
                        f"the conv runs with padding 0; input {list(shape)} → {list(x)}", severity="info"))
        else:  # F.pad still runs (and checks), but adds nothing: no padding step to show
            ex.notes.append(ShapeNote(
                "info", f"padding_mode={m.padding_mode!r} changes nothing here: the padding is 0", severity="info"))
    xb, batched = core.batchify(x, nd, f"conv{nd}d", advise)
    if isinstance(padding, str):
        if padding == "same":
            xb, pad_l = core.conv_same(xb, m.weight, m.stride, m.dilation, m.groups, advise)
            res = core.convolution(xb, m.weight, m.stride, pad_l, m.dilation, False, (0,), m.groups, advise)
        else:  # 'valid'
            res = core.convolution(xb, m.weight, m.stride, (0,), m.dilation, False, (0,), m.groups, advise)
    else:
        res = core.convolution(xb, m.weight, m.stride, padding, m.dilation, False, (0,) * nd, m.groups, advise)
    ex.output_shape = core.unbatch(res.shape, batched)
    _notes_after(ex, m, shape, res)


def _pads_lr(m: core.Module, nd: int) -> Optional[List[Tuple[int, int]]]:
    """(left, right) padding per dim as the kernel sees it."""
    if m.padding == "same" and m.padding_mode == "zeros":
        # ATen's 'same' (a 1-tuple dilation broadcasts here, unlike in the module's F.pad path)
        k, d = per_dim(m.kernel_size, nd), per_dim(m.dilation, nd)
        if k is None or d is None:
            return None
        return [(int(di * (ki - 1) / 2), di * (ki - 1) - int(di * (ki - 1) / 2)) for ki, di in zip(k, d)]
    if m.padding_mode != "zeros":
        # F.pad's order: the last dim's (left, right) first. A padding tuple longer than nd
        # (Conv1d(padding=(0, 0))) pads leading dims too; the first 2·nd values still pad the
        # spatial dims, which the conv then sees.
        r = m.reversed_padding
        if len(r) < 2 * nd or not all(isinstance(v, int) for v in r):
            return None
        return [(r[2 * (nd - 1 - i)], r[2 * (nd - 1 - i) + 1]) for i in range(nd)]
    if m.padding == "valid":
        return [(0, 0)] * nd
    p = per_dim(m.padding, nd)
    return None if p is None else [(v, v) for v in p]


def _steps_and_notes_before(ex: Explanation, m: core.Module, shape: Tuple[int, ...]) -> None:
    """The per-dim arithmetic, when the parameters and the input rank make it well defined."""
    nd = m.nd
    k, s, d = per_dim(m.kernel_size, nd), per_dim(m.stride, nd), per_dim(m.dilation, nd)
    pads = _pads_lr(m, nd)
    if None in (k, s, d, pads) or len(shape) not in (nd + 1, nd + 2):
        return
    conv_steps(ex, nd, shape[-nd:], k, s, d, pads, m.padding_mode)
    if m.padding == "same":
        for name, ki, di, (pl, pr) in zip(spatial_names(nd), k, d, pads):
            if pl != pr and di * (ki - 1) > 0:
                ex.notes.append(ShapeNote(
                    "same-asymmetric",
                    f"{name}: padding='same' needs d·(k−1) = {di * (ki - 1)} pixels of padding, an odd number: "
                    f"left {pl}, right {pr} (the extra pixel goes at the END); torch pads a copy of the input "
                    "to do it", dim=name, data={"left": pl, "right": pr, "total": pl + pr}))
    elif m.padding == "valid":
        ex.notes.append(ShapeNote("info", "padding='valid' is padding=0", severity="info"))


def _notes_after(ex: Explanation, m: core.Module, shape: Tuple[int, ...], res: core.ConvResult) -> None:
    nd = m.nd
    if res.input[1] == 0:
        ex.notes.append(ShapeNote(
            "info", f"the input has 0 channels, so the output has 0 channels too (not out_channels="
                    f"{m.out_channels})", dim="C", severity="warning"))
    if res.input[0] == 0:
        ex.notes.append(ShapeNote("info", "empty batch (N=0): the output is empty too", dim="N", severity="info"))
    if len(shape) == nd + 1:
        ex.notes.append(ShapeNote("info", "unbatched input (C, *spatial): the output has no N dim either",
                                  severity="info"))
    k, s, d, pads = per_dim(m.kernel_size, nd), per_dim(m.stride, nd), per_dim(m.dilation, nd), _pads_lr(m, nd)
    if None in (k, s, d, pads):
        return
    for i, (name, L) in enumerate(zip(spatial_names(nd), shape[-nd:])):
        n_out = ex.output_shape[-nd + i]
        ex.notes.extend(unread_notes(name, L, k[i], s[i], pads[i][0], d[i], n_out, m.padding_mode))
