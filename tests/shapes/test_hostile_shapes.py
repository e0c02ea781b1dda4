"""Issue 11, the explain-shape part: hostile values get torch's answer (or a clear usage error),
inverse questions are solved arithmetically, and nothing scans a huge input pixel by pixel.

Every expected value comes from running torch here (CPU, one thread)."""

import json
import time
import tracemalloc

import numpy as np
import pytest
import torch
from torch import nn

from layerlab.cli.app import main
from layerlab.errors import UsageError
from layerlab.shapes import explain, output_shape
from layerlab.shapes.inverse import solve_target, solve_undo
from tests.shapes.oracle import assert_same_outcome, layerlab_outcome, torch_outcome

torch.set_num_threads(1)


def _cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _torch_shape(module, shape):
    with torch.no_grad():
        return tuple(module(torch.zeros(shape)).shape)


# --- item 5: conv_transpose with a string padding in --target / --undo -------------------------


def test_conv_transpose_target_with_string_padding_is_a_clear_usage_error(capsys):
    for pad in ("same", "valid"):
        code, out, err = _cli(capsys, "explain-shape", "--op", "conv_transpose", "--input", "8", "--kernel", "3",
                              "--padding", pad, "--target", "16")
        assert code == 2, out + err
        assert "Traceback" not in out + err and "TypeError at forward" in out + err
        with pytest.raises(TypeError, match="must be tuple of ints"):  # why: torch rejects the string
            nn.ConvTranspose2d(1, 1, 3, padding=pad)(torch.zeros(1, 1, 8, 8))


def test_undo_a_valid_conv_gives_an_int_padding_that_torch_runs(capsys):
    code, out, err = _cli(capsys, "explain-shape", "--op", "conv_transpose", "--input", "8", "--kernel", "3",
                          "--stride", "2", "--padding", "valid", "--undo", "17", "--json")
    assert code == 0, out + err
    cand = json.loads(out)["dims"][0]["candidates"][0]["params"]
    assert _torch_shape(nn.Conv2d(1, 1, 3, 2, padding="valid"), (1, 1, 17, 17))[-1] == 8
    assert _torch_shape(nn.ConvTranspose2d(1, 1, 3, 2, **cand), (1, 1, 8, 8))[-1] == 17


@pytest.mark.parametrize("k, d", [(3, 1), (5, 1), (4, 1), (4, 3), (2, 2)])
def test_undo_a_same_conv(k, d):
    result = solve_undo("conv_transpose1d", (1, 1, 9), (9,), kernel_size=k, dilation=d, padding="same")
    assert _torch_shape(nn.Conv1d(1, 1, k, dilation=d, padding="same"), (1, 1, 9)) == (1, 1, 9)
    works = [(p, op) for p in range(0, 8) for op in range(0, 3)
             if _safe_shape(nn.ConvTranspose1d(1, 1, k, padding=p, output_padding=op, dilation=d), (1, 1, 9)) == 9]
    if works:
        cand = result.dims[0].candidates[0].params
        assert (cand["padding"], cand["output_padding"]) in works
    else:
        assert not result.ok


def _safe_shape(module, shape):
    try:
        return _torch_shape(module, shape)[-1]
    except RuntimeError:
        return None


# --- item 6 and 12: inverse questions -------------------------------------------------------


@pytest.mark.parametrize("k, ceil", [(10**6, False), (10**7, False), (10**7, True)])
def test_target_with_a_huge_kernel_is_arithmetic(k, ceil):
    start = time.perf_counter()
    result = solve_target("max_pool1d", (1, 1, 2 * k), (2,), kernel_size=k, ceil_mode=ceil)
    assert time.perf_counter() - start < 2.0
    assert result.ok
    first = result.dims[0].candidates[0].params
    if k == 10**6:  # torch itself on 2·10⁶ samples (8 MB)
        assert _torch_shape(nn.MaxPool1d(k, first["stride"], first["padding"], ceil_mode=ceil), (1, 1, 2 * k)) == (1, 1, 2)


def test_pinned_padding_is_honoured_by_target(capsys):
    code, out, err = _cli(capsys, "explain-shape", "--input", "32", "--kernel", "3", "--padding", "0",
                          "--target", "16", "--json")
    assert code == 1, out + err
    dim = json.loads(out)["dims"][0]
    assert dim["candidates"] == []
    assert "padding is fixed by --padding: p = 0" in dim["derivation"]
    # The outputs it lists for each stride are torch's.
    assert f"k=3, s=2, p=0: 32 → {_torch_shape(nn.Conv2d(1, 1, 3, 2, 0), (1, 1, 32, 32))[-1]}" in dim["derivation"]
    code, out, err = _cli(capsys, "explain-shape", "--input", "32", "--kernel", "3", "--padding", "1",
                          "--target", "16", "--json")
    assert code == 0, out + err
    assert all(c["params"]["padding"] == 1 for c in json.loads(out)["dims"][0]["candidates"])


def test_lp_pool_target_is_answered_and_torch_agrees():
    result = solve_target("lp_pool2d", (1, 1, 32, 32), (16,), kernel_size=2)
    assert result.ok
    for c in result.dims[0].candidates:
        assert _torch_shape(nn.LPPool2d(2, c.params["kernel_size"], c.params["stride"]), (1, 1, 32, 32))[-1] == 16


# --- numpy integers, bools, types ---------------------------------------------------------


@pytest.mark.parametrize("op, shape, params, build", [
    ("conv2d", (1, 1, 8, 8), dict(kernel_size=np.int64(3), stride=np.int32(2)), lambda p: nn.Conv2d(1, 1, **p)),
    ("conv2d", (1, 1, 8, 8), dict(kernel_size=True), lambda p: nn.Conv2d(1, 1, **p)),
    ("conv2d", (1, 1, 8, 8), dict(kernel_size=3, padding=True), lambda p: nn.Conv2d(1, 1, **p)),
    ("conv2d", (1, 1, 8, 8), dict(kernel_size=3, groups=True), lambda p: nn.Conv2d(1, 1, **p)),
    ("conv_transpose2d", (1, 1, 8, 8), dict(kernel_size=3, stride=True), lambda p: nn.ConvTranspose2d(1, 1, **p)),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=np.int64(3)), lambda p: nn.MaxPool2d(**p)),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=True), lambda p: nn.MaxPool2d(**p)),
    ("max_pool1d", (1, 1, 8), dict(kernel_size=2, stride=True), lambda p: nn.MaxPool1d(**p)),
    ("avg_pool1d", (1, 1, 8), dict(kernel_size=True), lambda p: nn.AvgPool1d(**p)),
    ("avg_pool2d", (1, 1, 8, 8), dict(kernel_size=3, divisor_override=2.0), lambda p: nn.AvgPool2d(**p)),
    ("avg_pool2d", (1, 1, 8, 8), dict(kernel_size=3, divisor_override=np.int64(2)), lambda p: nn.AvgPool2d(**p)),
    ("adaptive_max_pool2d", (1, 1, 8, 8), dict(output_size=np.int64(3)), lambda p: nn.AdaptiveMaxPool2d(**p)),
    ("adaptive_avg_pool2d", (1, 1, 8, 8), dict(output_size=(np.int64(3), 4)), lambda p: nn.AdaptiveAvgPool2d(**p)),
    ("adaptive_avg_pool1d", (1, 1, 8), dict(output_size=True), lambda p: nn.AdaptiveAvgPool1d(**p)),
    ("pixel_shuffle", (1, 4, 3, 3), dict(upscale_factor=np.int64(2)), lambda p: nn.PixelShuffle(**p)),
    ("pixel_shuffle", (1, 4, 3, 3), dict(upscale_factor=True), lambda p: nn.PixelShuffle(**p)),
    ("flatten", (1, 1, 8, 8), dict(start_dim=0, end_dim=True), lambda p: nn.Flatten(**p)),
    ("unfold", (1, 1, 8, 8), dict(kernel_size=True), lambda p: nn.Unfold(**p)),
])
def test_numpy_ints_and_bools_as_torch_takes_them(op, shape, params, build):
    theirs = torch_outcome(lambda: build(params)(torch.zeros(shape)))
    assert_same_outcome(layerlab_outcome(op, shape, **params), theirs, f"{op} {params}")


# --- int64 limits ----------------------------------------------------------------------------


@pytest.mark.parametrize("op, shape, params, build", [
    ("conv1d", (1, 1, 8), dict(kernel_size=3, padding=2**62), lambda p: nn.Conv1d(1, 1, **p)),
    ("conv2d", (1, 1, 8, 8), dict(kernel_size=3, padding=(1, 2**62)), lambda p: nn.Conv2d(1, 1, **p)),
    ("conv1d", (1, 1, 8), dict(kernel_size=3, padding=2**62 - 1), lambda p: nn.Conv1d(1, 1, **p)),
    ("conv1d", (1, 1, 8), dict(kernel_size=3, stride=2**62), lambda p: nn.Conv1d(1, 1, **p)),
    ("conv_transpose1d", (1, 1, 8), dict(kernel_size=3, padding=2**62), lambda p: nn.ConvTranspose1d(1, 1, **p)),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=2, stride=2**31), lambda p: nn.MaxPool2d(**p)),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=2**31 - 1), lambda p: nn.MaxPool2d(**p)),
    ("avg_pool1d", (1, 1, 8), dict(kernel_size=2, stride=2**31), lambda p: nn.AvgPool1d(**p)),
    ("max_pool1d", (1, 1, 8), dict(kernel_size=2, stride=2**62), lambda p: nn.MaxPool1d(**p)),
    ("upsample", (1, 1, 8, 8), dict(scale_factor=1e9, mode="bilinear"), lambda p: nn.Upsample(**p)),
    ("upsample", (1, 1, 8), dict(scale_factor=2e18), lambda p: nn.Upsample(**p)),
    ("upsample", (1, 1, 8), dict(size=2**61), lambda p: nn.Upsample(**p)),
    ("flatten", (0, 2**40, 2**40), dict(start_dim=1), lambda p: nn.Flatten(**p)),
])
def test_int64_limits_as_torch(op, shape, params, build):
    theirs = torch_outcome(lambda: build(params)(torch.empty(shape)))
    assert_same_outcome(layerlab_outcome(op, shape, **params), theirs, f"{op} {params}")


def test_values_beyond_int64_are_usage_errors():
    with pytest.raises(TypeError, match="Overflow when unpacking long"):
        nn.Conv2d(1, 1, 3, padding=2**63)(torch.zeros(1, 1, 8, 8))
    with pytest.raises(UsageError, match="64-bit"):
        explain("conv2d", (1, 1, 8, 8), kernel_size=3, padding=2**63)
    with pytest.raises(UsageError, match="64-bit"):
        explain("conv1d", (1, 1, 2**63), kernel_size=3)


# --- unread pixels: arithmetic, not a scan --------------------------------------------------------


def test_unread_notes_on_huge_1d_inputs_are_constant_time_and_memory():
    tracemalloc.start()
    start = time.perf_counter()
    ex = explain("conv1d", (1, 1, 2**40), kernel_size=3, stride=5)
    reflect = explain("conv1d", (1, 1, 3 * 10**7), kernel_size=3, stride=2, padding=1, padding_mode="reflect")
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 1.0 and peak < 20 * 2**20, (elapsed, peak)
    skipped = next(n for n in ex.notes if n.code == "skipped")
    # The same pattern as torch's zero-gradient pixels on a short input with the same k, s.
    x = torch.rand(1, 1, 53).requires_grad_()
    nn.Conv1d(1, 1, 3, 5)(x).sum().backward()
    zero = [i for i in range(50) if x.grad[0, 0, i] == 0]
    assert skipped.data["pixels"][:len(zero)] == zero
    assert reflect.output_shape == (1, 1, (3 * 10**7 + 2 - 3) // 2 + 1)
    assert not [n for n in reflect.notes if n.code in ("cropped", "skipped")]  # 30 000 000 is even: none lost


@pytest.mark.parametrize("L, k, s, p, mode", [(11, 3, 4, 1, "reflect"), (12, 2, 5, 2, "circular"),
                                             (13, 1, 3, 1, "replicate"), (17, 4, 6, 3, "reflect")])
def test_unread_with_padding_modes_match_autograd(L, k, s, p, mode):
    ex = explain("conv1d", (1, 1, L), kernel_size=k, stride=s, padding=p, padding_mode=mode)
    x = torch.rand(1, 1, L).requires_grad_()
    conv = nn.Conv1d(1, 1, k, s, p, padding_mode=mode)
    nn.init.constant_(conv.weight, 1.0)
    conv(x).sum().backward()
    zero = [i for i in range(L) if x.grad[0, 0, i] == 0]
    noted = sorted(x for n in ex.notes if n.code in ("cropped", "skipped") for x in n.data["pixels"])
    assert noted == zero


# --- suggestions, chain input, patch_embed ------------------------------------------------------


def test_same_is_not_suggested_with_a_stride():
    ex = explain("conv2d", (1, 1, 8, 8), kernel_size=3, stride=2, padding="full")
    assert "padding='same'" not in ex.error.suggestions
    with pytest.raises(ValueError, match="not supported for strided"):
        nn.Conv2d(1, 1, 3, stride=2, padding="same")


def test_patch_embed_advice_names_its_own_parameters():
    ex = explain("patch_embed", (1, 3, 8, 8), patch_size=16)
    assert ex.error is not None and any("patch_size" in s for s in ex.error.suggestions)
    assert not any(s.startswith(("padding", "kernel_size", "stride")) for s in ex.error.suggestions)


@pytest.mark.parametrize("flatten", [True, False])
def test_patch_embed_unbatched_matches_torch(flatten):
    conv = nn.Conv2d(3, 8, 16, 16)
    with torch.no_grad():
        y = conv(torch.zeros(3, 32, 48))
        if flatten:
            y = y.flatten(2).transpose(1, 2)
    assert output_shape("patch_embed", (3, 32, 48), patch_size=16, embed_dim=8, flatten=flatten) == tuple(y.shape)


def test_chain_with_a_bare_input_follows_the_first_op(capsys):
    code, out, err = _cli(capsys, "explain-shape", "--input", "100", "--chain", "conv1d k=3 | conv1d k=3 s=2",
                          "--json")
    assert code == 0, out + err
    conv = nn.Sequential(nn.Conv1d(1, 1, 3), nn.Conv1d(1, 1, 3, 2))
    assert tuple(json.loads(out)["output_shape"]) == _torch_shape(conv, (1, 1, 100))
