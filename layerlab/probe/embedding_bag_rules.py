"""``nn.EmbeddingBag`` given each bag's length where it takes each bag's start.

``offsets`` are the starting positions of the bags in the flat ``input`` and must begin at 0;
a list of bag *lengths* (``[3, 2, 4]`` for 9 ids) is the most common mix-up. When every entry is
positive and they add up to the number of ids, they are lengths, and the offsets are their exclusive
cumulative sum: ``torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])`` (verified on a copy).
Putting a 0 in front of the lengths would run with the wrong bags and is not offered; offsets that
are not lengths get a description and no fix.
"""

from __future__ import annotations

from typing import Optional

import torch

from layerlab.probe.report import Diagnosis, FixStep

_RULE = "EmbeddingBag: input (B·L flat ids), offsets (B) the start of each bag, offsets[0] = 0"


def lengths_as_offsets(ctx) -> Optional[Diagnosis]:
    if "offsets[0] has to be 0" not in str(ctx.exc):
        return None
    ids, offsets = ctx.arg("input", 0), ctx.arg("offsets", 1)
    if not isinstance(ids, torch.Tensor) or not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        return None
    key = ctx.locate(offsets)
    values = offsets.tolist()
    if key is not None and all(v > 0 for v in values) and sum(values) == ids.numel():
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
