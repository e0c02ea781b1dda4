"""Hypothesis building blocks shared by the shape property tests."""

from __future__ import annotations

from hypothesis import strategies as st


def per_dim(draw, nd: int, values):
    """An int, an nd-tuple, a 1-tuple or (rarely) a tuple of the wrong length."""
    form = draw(st.sampled_from(["int"] * 8 + ["tuple"] * 6 + ["one"] + ["bad"]))
    if form == "int":
        return draw(values)
    if form == "one":
        return (draw(values),)
    n = nd if form == "tuple" else draw(st.sampled_from([n for n in (2, 3, 4) if n != nd]))
    return tuple(draw(values) for _ in range(n))


def often(common, rare):
    """Each of ``common`` six times as likely as each of ``rare``."""
    return st.sampled_from(list(common) * 6 + list(rare))


def mostly(valid, invalid):
    """Mostly ``valid`` values, about one draw in 20 from ``invalid``."""
    return st.sampled_from(list(valid) * (20 // len(valid) + 1) + list(invalid))
