"""compare(): assert_close's numbers, returned instead of raised."""

import math

import pytest
import torch

from layerlab.checks.compare import TOLERANCES, compare, tolerances


def test_tolerances_are_assert_closes_defaults():
    assert tolerances(torch.float32) == (1.3e-6, 1e-5)
    assert tolerances(torch.float64) == (1e-7, 1e-7)
    assert tolerances(torch.float16) == (1e-3, 1e-5)
    assert tolerances(torch.bfloat16) == (1.6e-2, 1e-5)
    assert tolerances(torch.int64) == (0.0, 0.0)
    for dtype, (rtol, atol) in TOLERANCES.items():  # the same verdicts as assert_close itself
        a = torch.tensor([1.0, 2.0], dtype=dtype)
        b = a + torch.tensor([0.0, atol + rtol * 2.0 * 1.5], dtype=dtype)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(b, a)
        assert not compare(b, a, "x").ok


def test_numbers_and_indices():
    expected = torch.zeros(2, 3, dtype=torch.float64)
    actual = expected.clone()
    actual[1, 2] = 0.5
    actual[0, 1] = 1e-6
    c = compare(actual, expected, "out")
    assert not c.ok
    assert (c.mismatched, c.total) == (2, 6)
    assert c.mismatched_pct == pytest.approx(100 * 2 / 6, rel=1e-3)
    assert c.max_abs_diff == 0.5 and c.max_abs_index == [1, 2]
    assert c.actual_at_max == 0.5 and c.expected_at_max == 0.0
    assert math.isinf(c.max_rel_diff)
    assert (c.rtol, c.atol) == (1e-7, 1e-7)
    assert "2/6 elements (33.3%) differ" in c.describe()
    # assert_close agrees on the count
    with pytest.raises(AssertionError, match=r"Mismatched elements: 2 / 6"):
        torch.testing.assert_close(actual, expected)


def test_within_tolerance_and_shape_and_none():
    a = torch.ones(4)
    assert compare(a + 1e-6, a, "x").ok
    bad = compare(torch.ones(3), torch.ones(4), "x")
    assert not bad.ok and "shape (3,)" in bad.note
    missing = compare(None, torch.ones(2), "grad w")
    assert not missing.ok and missing.note.startswith("ours has no gradient")
    assert compare(None, None, "grad w").ok


def test_nan_never_equal():
    a = torch.tensor([1.0, float("nan")])
    c = compare(a, torch.tensor([1.0, 2.0]), "x")
    assert not c.ok and c.mismatched == 1 and "NaN: 1 in ours" in c.note
    assert compare(torch.tensor([float("inf")]), torch.tensor([float("inf")]), "x").ok
