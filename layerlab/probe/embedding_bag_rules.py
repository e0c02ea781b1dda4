"""``nn.EmbeddingBag`` given each bag's length where it takes each bag's start.

``offsets`` are the starting positions of the bags in the flat ``input`` and must begin at 0;
a list of bag *lengths* (``[3, 2, 4]`` for 9 ids) is the most common mix-up. When every entry is
positive and they add up to the number of ids, they are lengths, and the offsets are their exclusive
cumulative sum: ``torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])`` (verified on a copy).
Putting a 0 in front of the lengths would run with the wrong bags and is not offered; offsets that
are not lengths get a description and no fix. Increasing offsets that add up to the ids read two
ways: lengths, or the starts of a mini-batch cut from a bigger flat list (``[2, 3, 4]`` for ids
sliced from position 2: ``offsets - offsets[0]``). Both are named and no fix is offered.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis, FixStep

_RULE = "EmbeddingBag: input (B·L flat ids), offsets (B) the start of each bag, offsets[0] = 0"


@register_rule("embedding/bag-lengths-as-offsets", stage="module", on=(nn.EmbeddingBag,), order=220)
def lengths_as_offsets(ctx) -> Optional[Diagnosis]:
    """nn.EmbeddingBag given each bag's length where it takes each bag's start: offsets are their exclusive
    cumsum."""
    if "offsets[0] has to be 0" not in str(ctx.exc):
        return None
    ids, offsets = ctx.arg("input", 0), ctx.arg("offsets", 1)
    if not isinstance(ids, torch.Tensor) or not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        return None
    key = ctx.locate(offsets)
    values = offsets.tolist()
    lengths = all(v > 0 for v in values) and sum(values) == ids.numel()
    shifted = all(a <= b for a, b in zip(values, values[1:])) and values[-1] - values[0] <= ids.numel()
    if lengths and shifted:
        starts = [0] + list(torch.tensor(values).cumsum(0)[:-1].tolist())
        return Diagnosis(
            f"EmbeddingBag's offsets {values} start at {values[0]}, not 0, and read two ways: as the bags' lengths "
            f"(they add up to the {ids.numel()} ids: starts {starts}), or as starts of a batch cut from a bigger "
            f"flat list (shifted by {values[0]}: starts {[v - values[0] for v in values]}); layerlab cannot tell",
            expected="offsets[0] = 0 (each bag's start)", got=values, cause="ambiguous",
            hint="lengths: offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]]); "
                 "global starts of a slice: offsets = offsets - offsets[0]",
            rule=_RULE,
        )
    if key is not None and lengths:
        starts = [0] + list(torch.tensor(values).cumsum(0)[:-1].tolist())
        return Diagnosis(
            f"EmbeddingBag's offsets {values} start at {values[0]}, not 0; they add up to the {ids.numel()} ids, "
            f"so they are the bags' lengths: the offsets (starts) are {starts}",
            expected="offsets[0] = 0 (each bag's start)", got=values, cause="offsets",
            hint="offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])",
            fix=FixStep("cast-input", ctx.path, "torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])",
                        {"arg": key, "to": "starts"}),
            alternatives=["not a 0 put in front of the lengths: it runs, with the wrong bags"],
            rule=_RULE,
        )
    return Diagnosis(
        f"EmbeddingBag's offsets start at {values[0]}, not 0; offsets are each bag's start in the flat input",
        expected="offsets[0] = 0", got=values[:8], cause="offsets",
        hint="give each bag's start position (the first bag starts at 0)", rule=_RULE,
    )
