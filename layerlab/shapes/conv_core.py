"""What ``nn.ConvNd`` / ``nn.ConvTransposeNd`` and ATen's ``_convolution`` do with shapes — no torch.

Shared by :mod:`conv`, :mod:`conv_transpose` and :mod:`patch`. It follows torch 2.13 (CPU, one
intra-op thread) step by step, because *which* check fires first decides the message
(shape_rules.md §1.7, §2.5):

1. module construction (Python ``_ConvNd.__init__``): groups, divisibility, padding string,
   ``'same'`` + stride, padding_mode, then ``torch.empty(weight_shape)``;
2. ``batchify``: the input must have ``nd+1`` or ``nd+2`` dims (an unbatched input gets N=1);
3. ``_convolution``: expand stride/padding/dilation/output_padding to the weight's spatial rank,
   ``check_shape_forward`` (signs, weight rank, groups, channels, kernel vs padded input);
4. the backend (:mod:`conv_backend`), 1-D viewed as 2-D (``(N, C, 1, L)``) from here on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Union

from layerlab.errors import TorchWouldRaise, UsageError
from layerlab.shapes.fpad import negative_dimension, shape_str

Advise = Optional[Callable[[str, dict], dict]]


_DEFAULT_EXPLAIN = {
    "rank": "the input must be {expected}",
    "param-length": "{name} has {got} values but the weight has {dim} spatial dims",
    "negative-padding": "padding cannot be negative",
    "negative-output-padding": "output_padding cannot be negative",
    "nonpositive-stride": "stride must be at least 1",
    "negative-dilation": "dilation must be at least 1",
    "weight-dim": "the kernel has {wdim} dims (with out/in channels) but the input has {idim}",
    "groups-weight": "the weight's first dim ({w0}) must be a positive multiple of groups={groups}",
    "channels": "the layer expects {expected} input channels but the input has {got}",
    "kernel-too-big": "the (dilated) kernel is larger than the padded input",
    "empty-input": "a spatial dim of the input is 0 (only N=0 or C=0 may be empty)",
    "empty-weight": "the weight has no elements and the batch is empty: torch fails while building the empty result",
    "view": "the output size is negative, so torch cannot shape the empty result",
    "kernel-zero": "kernel_size must be at least 1",
    "dilation-zero": "dilation must be at least 1",
    "output-padding": "output_padding must be smaller than stride or dilation in every dim",
    "weight-empty": "the weight has no elements (out_channels=0 or a 0 kernel size)",
    "too-small": "the computed output size is below 1",
    "groups-positive": "groups must be a positive integer",
    "in-divisible": "in_channels must be a multiple of groups",
    "out-divisible": "out_channels must be a multiple of groups",
    "padding-string": "padding must be an int, a tuple, 'same' or 'valid'",
    "same-strided": "padding='same' needs stride 1",
    "padding-mode": "padding_mode is not supported",
    "negative-dimension": "channels and kernel_size must not be negative",
    "narrow": "padding='same' with this kernel removes more pixels than the input has",
    "huge-padding": "padding {padding} is more than torch's limit 2**62 − 1 (2·padding must fit in 64 bits)",
}

#: The largest padding ``_convolution`` accepts (2·padding must fit in int64).
PADDING_MAX = (1 << 62) - 1


def wrap_int64(v: int) -> int:
    """``v`` as C++ int64 arithmetic leaves it (two's complement wrap-around)."""
    return (v + (1 << 63)) % (1 << 64) - (1 << 63)


def fail(check: str, exc: str, torch_message: str, rule: str, advise: Advise = None, **data) -> TorchWouldRaise:
    """Build the error; ``advise(check, data)`` (from the op module) may give plain words and suggestions."""
    template = _DEFAULT_EXPLAIN.get(check, check)
    try:
        text = template.format(**data)
    except (KeyError, IndexError):
        text = template
    info = dict(message=text)
    if advise is not None:
        info.update(advise(check, data) or {})
    return TorchWouldRaise(
        info.pop("message"), torch_exception=exc, torch_message=torch_message, rule=info.pop("rule", rule), **info
    )


# ---------------------------------------------------------------------------------------------
# module construction
# ---------------------------------------------------------------------------------------------

def ntuple(value, n: int, name: str) -> tuple:
    """``torch.nn.modules.utils._ntuple``: an iterable becomes a tuple as is, a scalar is repeated."""
    if isinstance(value, (list, tuple, str)):
        out = tuple(value)
        if not out:
            raise UsageError(f"{name} must not be empty", where=name, got=value)
    else:
        out = (value,) * n
    for v in out:
        if not (isinstance(v, int) and not isinstance(v, bool)) and not isinstance(v, str):
            raise UsageError(f"{name} must be an int or a tuple of ints", where=name, got=value)
    return out


@dataclass
class Module:
    """The attributes ``_ConvNd.__init__`` stores (tuples as torch keeps them)."""

    nd: int
    transposed: bool
    in_channels: int
    out_channels: int
    kernel_size: tuple
    stride: tuple
    padding: Union[str, tuple]
    dilation: tuple
    output_padding: tuple
    groups: int
    padding_mode: str
    reversed_padding: list  # ``_reversed_padding_repeated_twice`` (F.pad order)
    weight: tuple


def construct(nd: int, transposed: bool, cls: str, in_channels: int, out_channels: int, kernel_size, stride,
              padding, dilation, groups: int, padding_mode: str, output_padding=0,
              advise: Advise = None) -> Module:
    """``nn.Conv{nd}d(...)`` / ``nn.ConvTranspose{nd}d(...)``: the attributes, or torch's ValueError."""
    k = ntuple(kernel_size, nd, "kernel_size")
    s = ntuple(stride, nd, "stride")
    d = ntuple(dilation, nd, "dilation")
    op = ntuple(output_padding, nd, "output_padding")
    for name, t in (("kernel_size", k), ("stride", s), ("dilation", d), ("output_padding", op)):
        if any(isinstance(v, str) for v in t):
            raise UsageError(f"{name} must be an int or a tuple of ints", where=name, got=t)
    if transposed or not isinstance(padding, str):
        p = ntuple(padding, nd, "padding")  # ConvTranspose runs _ntuple on a string too (§2.6)
    else:
        p = padding
    if transposed and padding_mode != "zeros":
        raise fail("padding-mode", "ValueError", f'Only "zeros" padding mode is supported for {cls}', "§2.5",
                   advise, mode=padding_mode)
    if groups <= 0:
        raise fail("groups-positive", "ValueError", "groups must be a positive integer", "§1.2", advise,
                   groups=groups)
    if in_channels % groups != 0:
        raise fail("in-divisible", "ValueError", "in_channels must be divisible by groups", "§1.2", advise,
                   channels=in_channels, groups=groups)
    if out_channels % groups != 0:
        raise fail("out-divisible", "ValueError", "out_channels must be divisible by groups", "§1.2", advise,
                   channels=out_channels, groups=groups)
    if isinstance(p, str):
        if p not in ("same", "valid"):
            raise fail("padding-string", "ValueError",
                       f"Invalid padding string {p!r}, should be one of {{'same', 'valid'}}", "§1.4", advise,
                       padding=p)
        if p == "same" and any(x != 1 for x in s):
            raise fail("same-strided", "ValueError", "padding='same' is not supported for strided convolutions",
                       "§1.5", advise, stride=s)
    if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
        raise fail("padding-mode", "ValueError",
                   "padding_mode must be one of {'circular', 'reflect', 'replicate', 'zeros'}, but got "
                   f"padding_mode='{padding_mode}'", "§1.6", advise, mode=padding_mode)
    if isinstance(p, str):
        rpad = [0, 0] * len(k)
        if p == "same":
            # Python floor division here (the module's F.pad path), unlike ATen's 'same' (C++ truncation)
            for di, ki, i in zip(d, k, range(len(k) - 1, -1, -1)):
                total = di * (ki - 1)
                rpad[2 * i], rpad[2 * i + 1] = total // 2, total - total // 2
    else:
        rpad = [x for x in reversed(p) for _ in range(2)]
    weight = (in_channels, out_channels // groups) + k if transposed else (out_channels, in_channels // groups) + k
    if any(x < 0 for x in weight):
        raise fail("negative-dimension", "RuntimeError", negative_dimension(weight), "§1.2", advise, weight=weight)
    return Module(nd, transposed, in_channels, out_channels, k, s, p, d, op, groups, padding_mode, rpad, weight)


# ---------------------------------------------------------------------------------------------
# the functional entry points
# ---------------------------------------------------------------------------------------------

def batchify(shape: Tuple[int, ...], nd: int, fname: str, advise: Advise = None) -> Tuple[Tuple[int, ...], bool]:
    """ATen ``batchify``: ``(C, *S)`` gets N=1; any other rank than ``nd+1``/``nd+2`` raises (§1.3)."""
    if len(shape) not in (nd + 1, nd + 2):
        raise fail("rank", "RuntimeError",
                   f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {fname}, but got input of "
                   f"size: {shape_str(shape)}", "§1.3", advise,
                   expected=f"{nd + 1}-D (C, *spatial) or {nd + 2}-D (N, C, *spatial)", got=len(shape), shape=shape)
    return (shape if len(shape) == nd + 2 else (1,) + shape), len(shape) == nd + 2


def _expand(values: Sequence[int], name: str, dim: int, advise: Advise) -> List[int]:
    if len(values) == 1:
        return [values[0]] * dim
    if len(values) != dim:
        raise fail("param-length", "RuntimeError",
                   f"expected {name} to be a single integer value or a list of {dim} values to match the "
                   f"convolution dimensions, but got {name}={shape_str(values)}", "§1.4", advise,
                   name=name, dim=dim, got=len(values))
    return list(values)


def conv_same(x: Tuple[int, ...], w: tuple, stride, dilation, groups: int, advise: Advise = None):
    """``_convolution_same`` (functional ``padding='same'``): checks, then pads and convolves.

    Left pad ``total/2`` in C++ (truncating), right pad the rest. An asymmetric dim is fixed by
    ``constant_pad_nd`` on the right (extra pixel at the END, §1.5); a negative difference (only
    for a 0 kernel or negative dilation) narrows the input on the left instead.
    """
    k = len(w)
    if k <= 2:
        raise fail("weight-dim", "RuntimeError", "weight should have at least three dimensions", "§1.7", advise,
                   wdim=k, idim=len(x))
    dim = k - 2
    if k != len(x):
        raise fail("weight-dim", "RuntimeError",
                   f"Expected {k}-dimensional input for {k}-dimensional weight{shape_str(w)}, but got {len(x)}-"
                   f"dimensional input of size {shape_str(x)} instead", "§1.7", advise, wdim=k, idim=len(x))
    for name, vals in (("stride", stride), ("dilation", dilation)):
        if len(vals) not in (dim, 1):
            raise fail("param-length", "RuntimeError", f"{name} cannot broadcast to {dim} dimensions", "§1.4",
                       advise, name=name, dim=dim, got=len(vals))
    if any(v != 1 for v in stride):  # (the module refused this at construction, as a ValueError)
        raise fail("same-strided", "RuntimeError", "padding='same' is not supported for strided convolutions",
                   "§1.5", advise, stride=tuple(stride))
    x = list(x)
    pad_l = []
    for i in range(dim):
        di = dilation[0] if len(dilation) == 1 else dilation[i]
        total = di * (w[i + 2] - 1)
        left = int(total / 2)  # C++ integer division truncates toward zero
        delta = (total - left) - left
        if delta > 0:
            x[i + 2] += delta
        elif delta < 0:
            if x[i + 2] + delta < 0:
                raise fail("narrow", "RuntimeError", "narrow(): length must be non-negative.", "§1.5", advise)
            x[i + 2] += delta
        pad_l.append(left)
    return tuple(x), pad_l


@dataclass
class ConvResult:
    """The output shape (batched form) and how it was reached."""

    shape: Tuple[int, ...]
    input: Tuple[int, ...]  # the batched input the kernel saw
    backend: str  # 'empty', 'onednn' or 'native'


def convolution(x: Tuple[int, ...], w: tuple, stride, padding, dilation, transposed: bool, output_padding,
                groups: int, advise: Advise = None) -> ConvResult:
    """``at::convolution`` on a batched input ``x`` with weight shape ``w``; the batched output shape."""
    k = len(w)
    dim = k - 2
    if dim <= 0:
        raise fail("weight-dim", "RuntimeError", "weight should have at least three dimensions", "§1.7", advise,
                   wdim=k, idim=len(x))
    s = _expand(stride, "stride", dim, advise)
    p = _expand(padding, "padding", dim, advise)
    d = _expand(dilation, "dilation", dim, advise)
    op = _expand(output_padding, "output_padding", dim, advise)
    for i, v in enumerate(p):  # _convolution keeps 2·padding in int64
        if v > PADDING_MAX:
            raise fail("huge-padding", "RuntimeError",
                       f"Given padding={v} at dimension {i} , expected padding to be at most {PADDING_MAX}", "§1.7",
                       advise, padding=v)
    # check_shape_forward
    if any(v < 0 for v in p):
        raise fail("negative-padding", "RuntimeError", "negative padding is not supported", "§1.7", advise, padding=p)
    if any(v < 0 for v in op):
        raise fail("negative-output-padding", "RuntimeError", "negative output_padding is not supported", "§2.2",
                   advise, output_padding=op)
    if any(v <= 0 for v in s):
        raise fail("nonpositive-stride", "RuntimeError", "non-positive stride is not supported", "§1.7", advise,
                   stride=s)
    if any(v < 0 for v in d):
        raise fail("negative-dilation", "RuntimeError", "dilation should be greater than zero", "§1.7", advise,
                   dilation=d)
    if k != len(x):
        raise fail("weight-dim", "RuntimeError",
                   f"Expected {k}-dimensional input for {k}-dimensional weight {shape_str(w)}, but got {len(x)}-"
                   f"dimensional input of size {shape_str(x)} instead", "§1.7", advise, wdim=k, idim=len(x))
    if w[0] < groups:
        raise fail("groups-weight", "RuntimeError",
                   f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got weight "
                   f"of size {shape_str(w)} instead", "§1.2", advise, w0=w[0], groups=groups)
    if w[0] % groups:
        raise fail("groups-weight", "RuntimeError",
                   f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                   f"weight of size [{shape_str(w)}] instead", "§1.2", advise, w0=w[0], groups=groups)
    if not transposed:
        if x[1] != w[1] * groups:
            raise fail("channels", "RuntimeError",
                       f"Given groups={groups}, weight of size {shape_str(w)}, expected input{shape_str(x)} to have "
                       f"{w[1] * groups} channels, but got {x[1]} channels instead", "§1.2", advise,
                       expected=w[1] * groups, got=x[1], input=x)
        padded = [wrap_int64(x[i + 2] + 2 * p[i]) for i in range(dim)]  # C++ int64: may wrap (sic)
        eff = [d[i] * (w[i + 2] - 1) + 1 for i in range(dim)]
        if any(a < b for a, b in zip(padded, eff)):
            raise fail("kernel-too-big", "RuntimeError",
                       f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
                       f"({' x '.join(map(str, eff))}). Kernel size can't be greater than actual input size",
                       "§1.1", advise, padded=padded, effective=eff)
    elif x[1] != w[0]:
        raise fail("channels", "RuntimeError",
                   f"Given transposed=1, weight of size {shape_str(w)}, expected input{shape_str(x)} to have "
                   f"{w[0]} channels, but got {x[1]} channels instead", "§2.5", advise,
                   expected=w[0], got=x[1], input=x)

    # 1-D runs as 2-D from here on: (N, C, 1, L), weight (.., .., 1, k)
    view1d = dim == 1
    if view1d:
        x, w = x[:2] + (1,) + x[2:], w[:2] + (1,) + w[2:]
        s, p, d, op = [1] + s, [0] + p, [1] + d, [0] + op
        dim = 2
    sizes = x[2:]
    if transposed:
        outs = [(sizes[i] - 1) * s[i] - 2 * p[i] + d[i] * (w[i + 2] - 1) + op[i] + 1 for i in range(dim)]
        channels = w[1] * groups
    else:
        outs = [(sizes[i] + 2 * p[i] - (d[i] * (w[i + 2] - 1) + 1)) // s[i] + 1 for i in range(dim)]
        channels = w[0]

    from layerlab.shapes import conv_backend  # (it imports fail/shape_str from here)

    if x[0] == 0 or x[1] == 0:
        outs, channels = conv_backend.empty_result(x, w, outs, channels, advise)
        backend = "empty"
    else:
        backend = conv_backend.run(x, w, s, d, op, groups, transposed, outs, advise)
    full = (x[0], channels) + tuple(outs)
    return ConvResult(full[:2] + full[3:] if view1d else full, x, backend)


def unbatch(shape: Tuple[int, ...], batched: bool) -> Tuple[int, ...]:
    """``output.squeeze(0)`` for an unbatched input."""
    return shape if batched else shape[1:]
