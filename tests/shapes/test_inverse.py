"""Inverse questions, checked with real torch: every answer really reaches the target, and no
padding torch would accept is missing from the answers."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerlab.errors import UsageError
from layerlab.shapes.inverse import solve_target, solve_undo

torch.set_num_threads(1)


def _torch_out(module, L):
    with torch.no_grad():
        try:
            return module(torch.zeros(1, 1, L, L)).shape[-1]
        except RuntimeError:
            return None


def _paddings(result):
    return sorted(c.params["padding"] for c in result.dims[0].candidates if isinstance(c.params["padding"], int))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(L=st.integers(1, 40), t=st.integers(1, 40), k=st.integers(1, 7), s=st.integers(1, 4), d=st.integers(1, 2))
def test_conv_paddings_are_exactly_torchs(L, t, k, s, d):
    result = solve_target("conv2d", (1, 1, L, L), (t,), kernel_size=k, stride=s, dilation=d)
    # Paddings ≥ E (windows of pure padding) are never offered; below that, exactly torch's set.
    E = d * (k - 1) + 1
    expected = [p for p in range(0, E) if _torch_out(torch.nn.Conv2d(1, 1, k, s, p, d), L) == t]
    assert _paddings(result) == expected


@settings(max_examples=120, deadline=None, derandomize=True)
@given(L=st.integers(1, 40), t=st.integers(1, 40), k=st.integers(1, 6), s=st.integers(1, 4),
       ceil=st.booleans())
def test_maxpool_paddings_are_exactly_torchs(L, t, k, s, ceil):
    result = solve_target("max_pool2d", (1, 1, L, L), (t,), kernel_size=k, stride=s, ceil_mode=ceil)
    expected = [p for p in range(0, 10)
                if _torch_out(torch.nn.MaxPool2d(k, s, p, ceil_mode=ceil), L) == t]
    assert _paddings(result) == expected


def test_keep_size_odd_and_even_kernels():
    odd = solve_target("conv2d", (1, 1, 32, 32), (32,), kernel_size=3, stride=1)
    assert [c.params["padding"] for c in odd.dims[0].candidates] == [1]
    even = solve_target("conv2d", (1, 1, 32, 32), (32,), kernel_size=4, stride=1)
    assert [c.params["padding"] for c in even.dims[0].candidates] == ["same"]
    conv = torch.nn.Conv2d(1, 1, 4, padding="same")
    assert conv(torch.zeros(1, 1, 32, 32)).shape[-1] == 32


def test_free_kernel_and_stride_are_searched_and_verified():
    result = solve_target("conv2d", (1, 1, 32, 32), (16,))
    cands = result.dims[0].candidates
    assert len(cands) > 3
    for c in cands:
        p = c.params
        conv = torch.nn.Conv2d(1, 1, p["kernel_size"], p["stride"], p["padding"])
        assert conv(torch.zeros(1, 1, 32, 32)).shape[-1] == 16, p
    assert cands[0].comment == "reads every pixel"
    assert {"kernel_size": 3, "stride": 2, "padding": 1} in [c.params for c in cands]


def test_dilated_maxpool_cannot_keep_the_size():
    result = solve_target("max_pool2d", (1, 1, 8, 8), (8,), kernel_size=3, stride=1, dilation=2)
    assert not result.ok
    with pytest.raises(RuntimeError, match="pad should be smaller than or equal to half"):
        torch.nn.MaxPool2d(3, 1, 2, dilation=2)(torch.zeros(1, 1, 8, 8))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(L=st.integers(1, 20), t=st.integers(1, 60), k=st.integers(1, 5), s=st.integers(1, 4), p=st.integers(0, 2))
def test_conv_transpose_output_padding(L, t, k, s, p):
    result = solve_target("conv_transpose2d", (1, 1, L, L), (t,), kernel_size=k, stride=s, padding=p)
    reachable = []
    for opad in range(0, s):
        m = torch.nn.ConvTranspose2d(1, 1, k, s, p, output_padding=opad)
        if _torch_out(m, L) == t:
            reachable.append(opad)
    assert sorted(c.params["output_padding"] for c in result.dims[0].candidates) == reachable


def test_unet_undo():
    # 25 -> MaxPool2d(2) -> 12 ; ConvTranspose2d(k=2, s=2) gives 24 unless output_padding=1
    result = solve_undo("conv_transpose2d", (1, 8, 12, 12), (25,), kernel_size=2, stride=2)
    (cand,) = result.dims[0].candidates
    assert cand.params == {"output_padding": 1}
    up = torch.nn.ConvTranspose2d(8, 8, 2, 2, output_padding=1)
    assert up(torch.zeros(1, 8, 12, 12)).shape[-2:] == (25, 25)


def test_undo_rejects_a_conv_that_did_not_produce_the_input():
    result = solve_undo("conv_transpose2d", (1, 1, 10, 10), (25,), kernel_size=2, stride=2)
    assert not result.ok
    assert "did not produce it" in result.dims[0].derivation[-1]


def test_target_on_unsupported_op_is_usage_error():
    with pytest.raises(UsageError, match="--target is answered for"):
        solve_target("upsample", (1, 1, 8, 8), (16,), scale_factor=2.0)
