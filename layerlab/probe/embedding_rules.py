"""nn.Embedding's contract: integer ids in ``[0, num_embeddings)``.

Float (or bool) ids are cast only when they hold whole numbers; otherwise they are features, and a
cast would look up garbage (:func:`layerlab.probe.op_rules.float_ids`). An id past the table is a
vocabulary set too small (``num_embeddings=max + 1``) or ids to remap; a negative id is never valid.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.op_rules import float_ids
from layerlab.probe.report import Diagnosis, FixStep


@register_rule("embedding/ids", stage="module", on=(nn.Embedding,), order=210)
def embedding(ctx) -> Optional[Diagnosis]:
    """nn.Embedding given float ids or ids out of ``[0, num_embeddings)``."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    rule = "Embedding: ids (*) integer in [0, num_embeddings) → (*, embedding_dim)"
    if x.is_floating_point() or x.dtype == torch.bool:
        found = float_ids(x, FixStep("cast-input", ctx.path, "x.long()", {"arg": ctx.key("input", 0), "to": "long"}),
                          "Embedding", f"nn.Linear(in_features, {m.embedding_dim})", rule)
        if found.fix is not None:
            found.hint += " (in a spec: dtype: int64 with low/high)"
        return found
    if x.numel() == 0:
        return None
    lo, hi = int(x.min()), int(x.max())
    n = m.num_embeddings
    if lo >= 0 and hi < n:
        return None
    bad = hi if hi >= n else lo
    return Diagnosis(
        f"Embedding index {bad} out of range: num_embeddings = {n} allows ids 0..{n - 1}; "
        f"the input's ids span {lo}..{hi}",
        expected=f"0 ≤ id < {n}", got=bad, cause="index-range",
        hint=(f"set num_embeddings={hi + 1} (or larger) if the vocabulary really has {hi + 1} ids, or remap the ids"
              if bad >= n else "negative ids are never valid: remap them (padding ids must be ≥ 0)"),
        fix=FixStep("set-arg", ctx.path, f"num_embeddings={hi + 1}", {"name": "num_embeddings", "value": hi + 1})
        if bad >= n else None,
        rule=rule,
    )
