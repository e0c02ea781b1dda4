"""nn.Upsample shape arithmetic against the real module (shape_rules.md §8, §15)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from tests.shapes.oracle import assert_edge_case, Outcome, assert_same_outcome, layerlab_outcome, torch_outcome
from tests.shapes.strategies import mostly

nn = torch.nn

MODES = ["nearest", "nearest-exact", "area", "linear", "bilinear", "bicubic", "trilinear"]
#: Scales with and without a float trap (0.29, 0.57, 0.7 trap at multiples of 100 / 10).
SCALES = [0.29, 0.57, 0.7, 1.5, 1 / 3, 2, 2.0, 0.5, 3, 1.1, 0.3, 2.5, 0.25, 0.1]


def run_torch(shape, params) -> Outcome:
    return torch_outcome(lambda: nn.Upsample(**params)(torch.zeros(shape)))


def check(shape, params) -> Outcome:
    theirs = run_torch(shape, params)
    assert_same_outcome(layerlab_outcome("upsample", shape, **params), theirs, f"upsample{tuple(shape)} {params}")
    return theirs


@st.composite
def upsample_cases(draw):
    rank = draw(st.sampled_from([3, 4, 5] * 8 + [-1]))
    if rank == -1:
        rank = draw(st.integers(0, 6))
    dims = [draw(mostly(list(range(1, 13)) + [100, 90, 200], [0])) for _ in range(rank)]
    if rank >= 2:
        dims[:2] = [draw(st.sampled_from([1, 1, 2, 0])), draw(mostly([1, 2], [0]))]
    spatial = max(rank - 2, 0)
    # Mostly the mode that fits the rank, sometimes any mode (or an unknown one).
    fitting = {3: ["linear"], 4: ["bilinear", "bicubic"], 5: ["trilinear"]}.get(rank, [])
    mode = draw(mostly(fitting * 3 + ["nearest", "nearest-exact", "area"] * 2, MODES + ["lanczos", "foo"]))
    params = dict(mode=mode)
    n = draw(mostly([spatial], [0, 1, 2, 3]))  # tuple length, rarely wrong
    how = draw(st.sampled_from(["size"] * 8 + ["scale"] * 10 + ["both", "neither"]))
    if how in ("size", "both"):
        entry = mostly(range(1, 13), [0, -1])
        params["size"] = draw(entry) if draw(st.booleans()) else tuple(draw(entry) for _ in range(n))
    if how in ("scale", "both"):
        entry = mostly(SCALES, [0, -0.5])
        params["scale_factor"] = draw(entry) if draw(st.booleans()) else tuple(draw(entry) for _ in range(n))
    if draw(mostly([False], [True])) or (mode in ("linear", "bilinear", "bicubic", "trilinear") and draw(st.booleans())):
        params["align_corners"] = draw(st.booleans())
    params["recompute_scale_factor"] = draw(mostly([None, False] + [True] * ("size" not in params), [True]))
    return tuple(dims), params


@settings(max_examples=400, deadline=None, derandomize=True)
@given(upsample_cases())
def test_upsample_matches_torch(case):
    shape, params = case
    check(shape, params)


# --------------------------------------------------------------------------------------------
# §15 edge cases and the float trap, with torch's answers written out

RE = "RuntimeError"
EDGE = [
    ("E30", (1, 1, 100, 100), dict(scale_factor=0.29), (1, 1, 28, 28)),
    ("E31", (1, 1, 5, 5), dict(scale_factor=1.5), (1, 1, 7, 7)),
    ("E32", (1, 1, 9, 9), dict(scale_factor=0.1),
     (RE, "Input and output sizes should be greater than 0, but got input (H: 9, W: 9) output (H: 0, W: 0)")),
    ("E33", (1, 1, 9, 9), dict(scale_factor=0.1, mode="area"), (1, 1, 0, 0)),
    ("8.1-third", (1, 1, 3), dict(scale_factor=1 / 3, mode="linear"), (1, 1, 1)),
    ("8.1-90x0.7", (1, 1, 90), dict(scale_factor=0.7), (1, 1, 62)),
    ("8.1-100x0.57", (1, 1, 100, 100), dict(scale_factor=0.57, mode="bilinear"), (1, 1, 56, 56)),
    ("8.1-200x0.29", (1, 1, 200, 8, 8), dict(scale_factor=0.29, mode="trilinear", recompute_scale_factor=True),
     (1, 1, 57, 2, 2)),
    ("8.3-1d-and", (1, 1, 5), dict(size=0),
     (RE, "Input and output sizes should be greater than 0, but got input (W: 5) and output (W: 0)")),
    ("8.3-area-neg", (1, 1, 9, 9), dict(scale_factor=-0.5, mode="area"),
     (RE, "adaptive_avg_pool2d: elements of output_size must be greater than or equal to 0 but received {-4, -4}")),
    ("8.3-C0", (1, 0, 2, 2), dict(size=2, mode="bilinear"),
     (RE, "Non-empty 4D data tensor expected but got a tensor with sizes [1, 0, 2, 2]")),
    ("8.3-align", (1, 1, 4, 4), dict(size=2, align_corners=False),
     ("ValueError", "align_corners option can only be set with the interpolating modes: linear | bilinear | "
                    "bicubic | trilinear")),
    ("8.2-linear-4d", (1, 1, 4, 4), dict(size=2, mode="linear"),
     ("NotImplementedError", "Got 4D input, but linear mode needs 3D input")),
    ("8.3-recompute", (1, 1, 4, 4), dict(size=2, recompute_scale_factor=True),
     ("ValueError", "recompute_scale_factor is not meaningful with an explicit size.")),
    ("module-scale-0", (1, 1, 4, 4), dict(scale_factor=0),  # nn.Upsample stores scale_factor=0 as None
     ("ValueError", "either size or scale_factor should be defined")),
    ("lanczos", (1, 1, 4, 4), dict(size=2, mode="lanczos"), ("ValueError", "Lanczos mode requires antialias=True")),
]


@pytest.mark.parametrize("case_id, shape, params, expected", EDGE, ids=[e[0] for e in EDGE])
def test_edge_cases(case_id, shape, params, expected):
    assert_edge_case(check(shape, params), "upsample", shape, params, expected)


def test_size_message_quotes_the_tuple():
    shape, params = (1, 1, 5, 5), dict(size=(3,))
    with pytest.raises(TorchWouldRaise, match=r"size has 1 entries but the input has 2 spatial dims") as info:
        output_shape("upsample", shape, **params)
    assert "spatial dimensions of [5, 5] and output size of (3,)." in info.value.torch_message
    check(shape, params)


def test_float_size_is_a_type_error():
    # A float size reaches the C++ binding, whose message goes on over several lines; the first matches.
    for mode, shape in (("nearest", (1, 1, 4, 4)), ("bilinear", (1, 1, 4, 4)), ("area", (1, 1, 4))):
        with pytest.raises(TorchWouldRaise, match="size must be an int"):
            output_shape("upsample", shape, size=2.5, mode=mode)
        check(shape, dict(size=2.5, mode=mode))


# --------------------------------------------------------------------------------------------
# steps and the float-trap note


def test_float_trap_note_e30():
    ex = explain("upsample", (1, 1, 100, 100), scale_factor=0.29)
    assert ex.output_shape == (1, 1, 28, 28)
    traps = [n for n in ex.notes if n.code == "float-trap"]
    assert [n.dim for n in traps] == ["H", "W"]
    assert traps[0].data == {"L": 100, "scale_factor": 0.29, "product": 28.999999999999996, "output": 28,
                             "expected": 29}
    assert "size=" in traps[0].message
    step = ex.steps[0]
    assert (step.dim, step.input, step.output) == ("H", 100, 28)
    assert step.substituted == "int(100.0 · 0.29) = int(28.999999999999996)"


@pytest.mark.parametrize("L, scale, trap", [
    (100, 0.29, True), (90, 0.7, True), (100, 0.57, True), (200, 0.29, True),
    (100, 0.5, False), (5, 1.5, False), (3, 1 / 3, False), (10, 0.3, False),
])
def test_float_trap_only_where_the_decimal_product_differs(L, scale, trap):
    ex = explain("upsample", (1, 1, L), scale_factor=scale)
    assert ex.output_shape == run_torch((1, 1, L), dict(scale_factor=scale)).shape
    assert any(n.code == "float-trap" for n in ex.notes) is trap


def test_steps_for_size_and_dims():
    ex = explain("upsample", (2, 3, 4, 5, 6), size=(8, 10, 12), mode="trilinear")
    assert [(s.dim, s.input, s.output) for s in ex.steps] == [("D", 4, 8), ("H", 5, 10), ("W", 6, 12)]
    assert ex.output_shape == (2, 3, 8, 10, 12)
    assert [s.dim for s in explain("upsample", (1, 1, 7), scale_factor=2).steps] == ["L"]


def test_suggested_scale_survives_the_float_product():
    with pytest.raises(TorchWouldRaise) as info:
        output_shape("upsample", (1, 1, 9, 9), scale_factor=0.1)
    assert "scale_factor ≥ 0.112 (so that every output is ≥ 1)" in info.value.suggestions
    assert check((1, 1, 9, 9), dict(scale_factor=0.112)).shape == (1, 1, 1, 1)
    assert check((1, 1, 9, 9), dict(scale_factor=0.111111)).raised  # the naive 1/9 rounds down to 0
