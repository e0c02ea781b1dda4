"""Which ATen CPU convolution kernel runs, and how it words degenerate sizes (shape_rules.md §1.7, §2.4).

After ``check_shape_forward`` (:mod:`conv_core`) ATen picks a backend, 1-D already viewed as 2-D:

* an empty batch or channel dim → no kernel at all (the "empty" backend): the output is shaped
  from the formula, so the kernels' own checks are skipped (ConvTranspose N=0, §2.2), but a
  negative size or an empty weight still fails while building the empty result;
* any other empty input → ``Only zero batch or zero channel inputs are supported``;
* oneDNN when ATen's ``use_mkldnn`` says so (float32, here with ONE intra-op thread: roughly a
  strided/dilated/non-1×1 kernel **and** groups > 1, N > 1, kernels > 3×3 or a big input);
* otherwise the native kernels (slow_conv2d/3d, slow_conv_dilated2d/3d, slow_conv_transpose2d/3d).

Only degenerate settings tell them apart — a 0 kernel, a 0 dilation, a too-small ConvTranspose
output — and each words them differently; every message below was checked against torch 2.13.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from layerlab.shapes.conv_core import Advise, fail, shape_str

ONEDNN_PRIMITIVE = (
    "could not create a primitive descriptor for the {what} forward propagation primitive. Run workload "
    "with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information."
)
ONEDNN_MEMORY = "could not construct a memory descriptor using a format tag"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def use_onednn(x4: Sequence[int], w4: Sequence[int], stride, dilation, output_padding, groups: int,
               transposed: bool, threads: int = 1) -> bool:
    """ATen ``ConvParams::use_mkldnn`` for float32 CPU tensors (1-D already viewed as 2-D)."""
    if transposed and any(o >= s for o, s in zip(output_padding, stride)):
        return False
    strided = any(s != 1 for s in stride)
    dilated = any(d != 1 for d in dilation)
    n, c, a, b = x4[0], x4[1], x4[2], x4[3]
    worth = strided or dilated or n >= 16 or w4[-1] != 1 or w4[-2] != 1 or threads > 1
    big = groups > 1 or (w4[-1] > 3 and w4[-2] > 3) or n > 1 or n * c * a * b > 20480
    return worth and big


def empty_result(x, w, outs: List[int], channels: int, advise: Advise) -> Tuple[List[int], int]:
    """ConvBackend::Empty (N = 0 or C = 0): ``input * weight[0]`` reshaped to the formula's shape."""
    if x[1] != 0 and _numel(w) == 0:
        raise fail("empty-weight", "IndexError",
                   "select(): index 0 out of range for tensor of size [0] at dimension 0", "§1.7", advise)
    if x[1] == 0:
        channels = 0  # "Handle empty # of channels": 0 output channels, whatever out_channels is
    view = [x[0], channels] + outs
    inferred = False
    for i, v in enumerate(view):  # Tensor.view: one -1 is "infer", other negatives are errors
        if v == -1:
            if inferred:
                raise fail("view", "RuntimeError", "only one dimension can be inferred", "§2.4", advise, outs=outs)
            inferred = True
        elif v < 0:
            raise fail("view", "RuntimeError", f"invalid shape dimension {v} at index {i} of shape {shape_str(view)}",
                       "§2.4", advise, outs=outs)
    if inferred:
        raise fail("view", "RuntimeError",
                   f"cannot reshape tensor of 0 elements into shape {shape_str(view)} because the unspecified "
                   "dimension size -1 can be any value and is ambiguous", "§2.4", advise, outs=outs)
    return outs, channels


def run(x, w, s, d, op, groups: int, transposed: bool, outs: List[int], advise: Advise) -> str:
    """A non-empty batch: the backend's checks; returns its name (``onednn`` or ``native``)."""
    if any(v == 0 for v in x):
        raise fail("empty-input", "RuntimeError",
                   f"Only zero batch or zero channel inputs are supported, but got input shape: {shape_str(x)}",
                   "§1.7", advise, input=x)
    kernel = list(w[2:])
    w_numel = _numel(w)
    if not use_onednn(x, w, s, d, op, groups, transposed):
        # the native kernels run once per group, on the group's slice of the weight (dim 0)
        _native_checks(x, (w[0] // groups,) + tuple(w[1:]), s, d, op, outs, transposed, w_numel, advise)
        return "native"
    if not transposed:
        if any(v <= 0 for v in d):
            raise fail("dilation-zero", "RuntimeError", "non-positive dilation is not supported", "§1.7", advise,
                       dilation=d)
        if w_numel == 0:
            raise fail("kernel-zero", "RuntimeError", ONEDNN_PRIMITIVE.format(what="convolution"), "§1.7", advise,
                       kernel=kernel)
        return "onednn"
    if any(v < 0 for v in outs):
        raise fail("too-small", "RuntimeError", ONEDNN_MEMORY, "§2.4", advise, input=list(x[2:]), outs=outs)
    # oneDNN sees dilation d−1: −1 is rejected outright in 3-D, and in 2-D where the kernel is
    # > 1. (A 0 dilation on a kernel of 1 is accepted or not depending on the stride, padding
    # and the other dim, by oneDNN's choice of implementation: not modelled, we predict success.)
    if len(kernel) == 3 and any(v == 0 for v in d):
        raise fail("dilation-zero", "RuntimeError", "dimensions are invalid", "§1.7", advise, dilation=d)
    if w_numel == 0 or any(v == 0 and kk > 1 for v, kk in zip(d, kernel)):
        check = "weight-empty" if w_numel == 0 else "dilation-zero"
        raise fail(check, "RuntimeError", ONEDNN_PRIMITIVE.format(what="deconvolution"), "§1.7", advise,
                   kernel=kernel, dilation=d, weight=w)
    return "onednn"  # a size of 0 comes back as an empty tensor here (the native kernel rejects it)


def _names(dim: int) -> List[str]:
    return ["depth", "height", "width"][3 - dim:]


def _native_checks(x, w, s, d, op, outs, transposed, w_numel, advise) -> None:
    """The checks of ATen's native CPU kernels (slow_conv2d/3d, slow_conv_dilated, slow_conv_transpose)."""
    dim = len(s)
    kernel = list(w[2:])
    dilated = any(v != 1 for v in d)
    names = _names(dim)
    if not transposed:
        if dilated:
            if any(v <= 0 for v in kernel):
                raise fail("kernel-zero", "RuntimeError",
                           f"kernel size should be greater than zero, but got {shape_str(kernel)}", "§1.7", advise,
                           kernel=kernel)
            if any(v <= 0 for v in d):
                raise fail("dilation-zero", "RuntimeError",
                           f"dilation should be greater than zero, but got {shape_str(d)}", "§1.7", advise,
                           dilation=d)
        elif any(v <= 0 for v in kernel):
            if dim == 2:
                got = f"kernel_height: {kernel[0]} kernel_width: {kernel[1]}"
            else:
                got = f": {kernel[0]} x {kernel[1]} x {kernel[2]} (TxHxW)"
            raise fail("kernel-zero", "RuntimeError", "kernel size should be greater than zero, but got" +
                       ("" if dim == 3 else " ") + got, "§1.7", advise, kernel=kernel)
        return
    if dim == 2 and any(v <= 0 for v in kernel):
        raise fail("kernel-zero", "RuntimeError",
                   f"kernel size should be greater than zero, but got kernel_height: {kernel[0]} kernel_width: "
                   f"{kernel[1]}", "§1.7", advise, kernel=kernel)
    if any(v <= 0 for v in d):
        got = ", ".join(f"dilation_{n}: {v}" for n, v in zip(names, d))
        raise fail("dilation-zero", "RuntimeError", f"dilation should be greater than zero, but got {got}", "§1.7",
                   advise, dilation=d)
    if any(not (o < si or o < di) for o, si, di in zip(op, s, d)):
        got = " ".join(
            [f"output_padding_{n}: {v}" for n, v in zip(names, op)] + [f"stride_{n}: {v}" for n, v in zip(names, s)]
            + [f"dilation_{n}: {v}" for n, v in zip(names, d)])
        raise fail("output-padding", "RuntimeError",
                   f"output padding must be smaller than either stride or dilation, but got {got}", "§2.2", advise,
                   output_padding=op, stride=s, dilation=d)
    if w_numel == 0:
        if dim == 2:
            msg = f"non-empty 2D or 4D weight tensor expected, but got: {shape_str(w)}"
        else:
            msg = ("non-empty 5D (n_output_plane x n_input_plane x kernel_depth x kernel_height x kernel_width) "
                   f"tensor expected for weight, but got: {shape_str(w)}")
        raise fail("weight-empty", "RuntimeError", msg, "§1.7", advise, weight=w, kernel=kernel)
    if any(v < 1 for v in outs):
        raise fail("too-small", "RuntimeError",
                   f"Given input size per channel: ({' x '.join(map(str, x[2:]))}). Calculated output size per "
                   f"channel: ({' x '.join(map(str, outs))}). Output size is too small", "§2.4", advise,
                   input=list(x[2:]), outs=outs)
