"""ConvTranspose1d / 2d / 3d (module semantics), including ``forward(x, output_size=…)``.

Per spatial dim (shape_rules.md §2.1)::

    L_out = (L − 1)·s − 2p + d·(k − 1) + output_padding + 1

It inverts the conv formula; because the conv floors, ``s`` different sizes map back to the same
input, and ``output_padding`` (or ``output_size``) picks one of them (note ``output-size-range``):

* ``output_padding`` must be smaller than the stride **or** the dilation, per dim (§2.2); the
  1-D op runs as 2-D, so its message names a fake height;
* ``output_size`` (``nd`` entries, or with the N/C entries, which are ignored) must lie in
  ``[min, min + s − 1]`` with ``min`` the size for output_padding 0; it *replaces* the
  module's output_padding (§2.3). The Python code that checks it runs before the rank check;
* an output size below 1 raises ``Output size is too small`` — or, where ATen picks oneDNN, a
  oneDNN message (§2.4, note ``backend-message``);
* an empty batch (N=0) skips those two checks (§2.2);
* ``padding='same'`` is split into characters by ``_ntuple`` and fails at forward with a
  ``TypeError`` (§2.6); a ``padding_mode`` other than ``'zeros'`` fails at construction.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import conv_backend
from layerlab.shapes import conv_core as core
from layerlab.shapes.conv import ConvAdvisor, per_dim, resolve_channels, spatial_names
from layerlab.shapes.result import DimStep, Explanation, ShapeNote


class ConvTransposeAdvisor(ConvAdvisor):
    """Plain words and suggestions for ConvTranspose's own errors."""

    def _padding_mode(self, data):
        return dict(message=f"{self.cls} only pads with zeros (padding_mode={data['mode']!r})",
                    where="padding_mode", got=data["mode"], suggestions=["padding_mode='zeros'"])

    def _channels(self, data):
        out = super()._channels(data)
        out["suggestions"] = [f"in_channels={data['got']}"]
        return out

    def _groups_weight(self, data):
        return dict(message=f"in_channels={data['w0']} must be a positive multiple of groups={data['groups']}",
                    where="in_channels", got=data["w0"], suggestions=[f"in_channels={data['groups']}"])

    def _output_padding(self, data):
        op, s, d = data["output_padding"], data["stride"], data["dilation"]
        names = self.names if len(op) == self.nd else ["H (1-D runs as 2-D)", "L"]
        bad = [i for i in range(len(op)) if not (op[i] < s[i] or op[i] < d[i])]
        limit = [max(s[i], d[i]) - 1 for i in range(len(op))]
        return dict(
            message="output_padding must be smaller than the stride or the dilation: "
                    + ", ".join(f"{names[i]}: output_padding {op[i]} ≥ stride {s[i]} and ≥ dilation {d[i]}"
                                for i in bad),
            where=",".join(names[i] for i in bad), got=op,
            suggestions=[f"output_padding ≤ {min(limit[i] for i in bad)}"]
            + [f"stride={max(op[i] for i in bad) + 1}"])

    def _too_small(self, data):
        outs = data["outs"][-self.nd:]
        sugg = []
        k, s, p, d, op = (per_dim(core.ntuple(self.params[n], self.nd, n), self.nd)
                          for n in ("kernel_size", "stride", "padding", "dilation", "output_padding"))
        if None not in (k, s, p, d, op) and self.spatial:
            # out = (L−1)·s − 2p + d·(k−1) + op + 1 ≥ 1  ⇔  p ≤ ((L−1)·s + d·(k−1) + op) // 2
            pmax = [((L - 1) * si + di * (ki - 1) + oi) // 2 for L, ki, si, di, oi in zip(self.spatial, k, s, d, op)]
            if min(pmax) >= 0:
                sugg.append(f"padding ≤ {min(pmax)}")
        sugg.append("a larger kernel_size or stride")
        return dict(message=f"the output size would be {outs}: at least 1 is needed in every dim",
                    where=",".join(n for n, o in zip(self.names, outs) if o < 1), got=outs, suggestions=sugg)

    def _weight_empty(self, data):
        return dict(message="the weight is empty (out_channels=0 or a kernel_size of 0)", where="kernel_size",
                    suggestions=["kernel_size ≥ 1", "out_channels ≥ 1"])

    def _view(self, data):
        return dict(message=f"the output size would be {data['outs'][-self.nd:]}; with an empty batch torch "
                            "fails while shaping the empty result", suggestions=["a smaller padding"])


def _fail_py(exc: str, message: str, plain: str, rule: str = "§2.3", **kw) -> TorchWouldRaise:
    return TorchWouldRaise(plain, torch_exception=exc, torch_message=message, rule=rule, **kw)


def _size_repr(value) -> str:
    """How Python prints the requested size: a tuple ``(17, 17)`` / ``(17,)`` or a list ``[17, 17]``."""
    return repr(tuple(value)) if isinstance(value, tuple) else repr(list(value))


def output_padding_from_size(shape: Tuple[int, ...], output_size, m: core.Module, ex: Explanation) -> list:
    """``_ConvTransposeNd._output_padding`` (Python, before the C++ rank check): the output_padding."""
    nd = m.nd
    if isinstance(output_size, int):
        raise _fail_py("TypeError", "object of type 'int' has no len()",
                       "output_size must be a list or tuple of sizes", where="output_size", got=output_size,
                       suggestions=[f"output_size={[output_size] * nd}"])
    r = len(shape)
    nns = 2 if r == nd + 2 else 1
    requested = output_size
    if len(requested) == nns + nd:
        requested = requested[nns:]  # the N/C entries are dropped unchecked
    if len(requested) != nd:
        raise _fail_py("ValueError",
                       f"ConvTranspose{nd}D: for {r}D input, output_size must have {nd} or {nns + nd} elements "
                       f"(got {len(requested)})",
                       f"output_size needs {nd} spatial sizes (or {nns + nd} with the leading dims)",
                       where="output_size", got=list(output_size),
                       suggestions=[f"output_size with {nd} entries"])
    mins, maxs = [], []
    for i in range(nd):
        idx = i + nns
        if idx >= r:
            text = (f"Dimension specified as {idx} but tensor has no dimensions" if r == 0 else
                    f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {idx})")
            raise _fail_py("IndexError", text, f"the {r}-D input has no dim {idx} for output_size to match",
                           where="input", got=list(shape))
        for name in ("stride", "padding"):
            if i >= len(getattr(m, name)):
                raise _fail_py("IndexError", "tuple index out of range",
                               f"{name} has fewer entries than spatial dims", where=name)
        if isinstance(m.padding[i], str):
            raise _fail_py("TypeError", "unsupported operand type(s) for -: 'int' and 'str'",
                           "ConvTranspose has no string padding", where="padding", rule="§2.6")
        for name in ("dilation", "kernel_size"):
            if i >= len(getattr(m, name)):
                raise _fail_py("IndexError", "tuple index out of range",
                               f"{name} has fewer entries than spatial dims", where=name)
        lo = (shape[idx] - 1) * m.stride[i] - 2 * m.padding[i] + m.dilation[i] * (m.kernel_size[i] - 1) + 1
        mins.append(lo)
        maxs.append(lo + m.stride[i] - 1)
    spatial_in = shape[2:]  # sic: input.size()[2:], wrong for unbatched input
    if any(not (lo <= v <= hi) for v, lo, hi in zip(requested, mins, maxs)):
        raise _fail_py(
            "ValueError",
            f"requested an output size of {_size_repr(requested)}, but valid sizes range from {mins} to {maxs} "
            f"(for an input of torch.Size({list(spatial_in)}))",
            "output_size must be reachable: between the size with output_padding 0 and that plus stride − 1",
            where="output_size", expected=f"{mins} … {maxs}", got=list(requested),
            suggestions=[f"output_size={mins}"] + ([f"output_size={maxs}"] if mins != maxs else []))
    ex.notes.append(ShapeNote(
        "info", f"output_size={list(requested)} sets output_padding={[v - lo for v, lo in zip(requested, mins)]} "
                f"(the module's output_padding={list(m.output_padding)} is ignored)", severity="info"))
    return [v - lo for v, lo in zip(requested, mins)]


def _steps(ex: Explanation, m: core.Module, shape: Tuple[int, ...], op: list) -> Optional[List[int]]:
    nd = m.nd
    k, s, p, d = (per_dim(t, nd) for t in (m.kernel_size, m.stride, m.padding, m.dilation))
    op = per_dim(op, nd)
    if None in (k, s, p, d, op) or len(shape) not in (nd + 1, nd + 2):
        return None
    outs = []
    for name, L, ki, si, pi, di, oi in zip(spatial_names(nd), shape[-nd:], k, s, p, d, op):
        out = (L - 1) * si - 2 * pi + di * (ki - 1) + oi + 1
        ex.steps.append(DimStep(
            name, L, f"({name} − 1)·s − 2p + d·(k − 1) + op + 1",
            f"({L} − 1)·{si} − 2·{pi} + {di}·({ki} − 1) + {oi} + 1", out,
            {"k": ki, "s": si, "p": pi, "d": di, "op": oi}))
        outs.append(out)
    return outs


def _range_notes(ex: Explanation, m: core.Module, shape: Tuple[int, ...]) -> None:
    """``output-size-range``: every size this layer can produce from this input, and how to pick it."""
    nd = m.nd
    k, s, p, d = (per_dim(t, nd) for t in (m.kernel_size, m.stride, m.padding, m.dilation))
    if None in (k, s, p, d) or len(shape) not in (nd + 1, nd + 2):
        return
    for name, L, ki, si, pi, di in zip(spatial_names(nd), shape[-nd:], k, s, p, d):
        if si <= 1 and di <= 1:
            continue
        lo = (L - 1) * si - 2 * pi + di * (ki - 1) + 1
        top = max(si, di) - 1
        sizes = ", ".join(f"{lo + o} (output_padding={o})" for o in range(top + 1))
        via = (f"; output_size= reaches only {lo}…{lo + si - 1} (its range uses the stride alone)"
               if di > si else f"; or pass output_size= in {lo}…{lo + si - 1} to forward")
        ex.notes.append(ShapeNote(
            "output-size-range",
            f"{name}: a conv with the same k, s, p, d maps {lo}…{lo + si - 1} all to {L}; this layer can give {sizes}"
            + via, dim=name, severity="info", data={"min": lo, "max": lo + top, "output_size_max": lo + si - 1}))


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """``nn.ConvTranspose{nd}d(...)(x, output_size=…)``: construction, output_size, then ATen's conv."""
    if spec.functional:
        from layerlab.shapes.conv_functional import explain_conv_transpose

        return explain_conv_transpose(ex, spec, shape, params)
    nd = spec.nd
    cls = f"ConvTranspose{nd}d"
    in_ch, out_ch = resolve_channels(shape, nd, params)
    advise = ConvTransposeAdvisor(nd, shape, in_ch, out_ch, params, cls="ConvTranspose")
    m = core.construct(nd, True, cls, in_ch, out_ch, params["kernel_size"], params["stride"], params["padding"],
                       params["dilation"], params["groups"], params["padding_mode"],
                       output_padding=params["output_padding"], advise=advise)
    _range_notes(ex, m, shape)
    if params["output_size"] is not None:
        op = output_padding_from_size(shape, params["output_size"], m, ex)
    else:
        op = list(m.output_padding)
    str_at = next((i for i, v in enumerate(m.padding) if isinstance(v, str)), None)
    if str_at is not None:
        raise TorchWouldRaise(
            f"{cls} has no padding={params['padding']!r}: the module splits the string into characters",
            torch_exception="TypeError",
            torch_message=f"conv_transpose{nd}d(): argument 'padding' (position 5) must be tuple of ints, but "
                          f"found element of type str at pos {str_at}",
            rule="§2.6", where="padding", got=params["padding"],
            suggestions=_same_suggestion(m),
        )
    _steps(ex, m, shape, op)
    xb, batched = core.batchify(shape, nd, f"conv_transpose{nd}d", advise)
    try:
        res = core.convolution(xb, m.weight, m.stride, m.padding, m.dilation, True, op, m.groups, advise)
    except TorchWouldRaise as err:
        _backend_note(ex, err, xb, m, op)
        raise
    ex.output_shape = core.unbatch(res.shape, batched)
    if xb[0] == 0:
        ex.notes.append(ShapeNote(
            "info", "empty batch (N=0): torch skips the output_padding and output-size checks", dim="N",
            severity="info"))


def _same_suggestion(m: core.Module) -> List[str]:
    k, d = per_dim(m.kernel_size, m.nd), per_dim(m.dilation, m.nd)
    if k and d and all(di * (ki - 1) % 2 == 0 for ki, di in zip(k, d)):
        p = [di * (ki - 1) // 2 for ki, di in zip(k, d)]
        return [f"padding={p[0] if len(set(p)) == 1 else tuple(p)} (keeps the size at stride 1)"]
    return ["an int padding: p = d·(k−1)/2 keeps the size at stride 1"]


def _backend_note(ex: Explanation, err: TorchWouldRaise, xb, m: core.Module, op) -> None:
    """``backend-message``: the same mistake reads differently when ATen sends it to oneDNN (§2.4)."""
    if err.rule != "§2.4" or "Output size is too small" not in err.torch_message or len(xb) != len(m.weight):
        return
    x4, w4 = list(xb), list(m.weight)
    s, d, o = per_dim(m.stride, m.nd), per_dim(m.dilation, m.nd), per_dim(op, m.nd)
    if None in (s, d, o):
        return
    if m.nd == 1:
        x4, w4 = x4[:2] + [1] + x4[2:], w4[:2] + [1] + w4[2:]
        s, d, o = [1] + s, [1] + d, [0] + o
    if conv_backend.use_onednn(x4, w4, s, d, o, m.groups, True, threads=2):
        ex.notes.append(ShapeNote(
            "backend-message",
            "with more than one intra-op thread (torch's default) this input goes to oneDNN, which reports "
            f"'RuntimeError: {conv_backend.ONEDNN_MEMORY}' for the same mistake (a negative size), or returns an "
            "empty tensor for a size of 0", severity="info",
            data={"torch_message_multithread": conv_backend.ONEDNN_MEMORY}))
