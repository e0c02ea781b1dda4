"""Op failures whose cause is how an operand was made or labeled, not the op that raised.

Tried before the per-op rules of :mod:`op_rules`, because those read only the failing op's shapes
and would resize or transpose there — where these see, through the op trace, the upstream op
(a ``cat`` on the wrong axis, a reduction over the batch, a reshape by the wrong factor), the
input layout (an (E, 2) edge list, a channels-first flow grid) or the labels (an einsum operand
whose axes another einsum fixed) that is wrong. Each rule returns ``None`` unless its pattern is
unambiguous; then the per-op rules answer as before.
"""

from __future__ import annotations

from typing import Optional

from layerlab.probe import cache_axis_rules, cat_operand_rules, edge_index_rules, einsum_label_rules
from layerlab.probe import head_dim_rules, packed_sequence_rules, reduced_batch_rules, sampling_grid_rules
from layerlab.probe import trailing_axes_rules
from layerlab.probe.report import Diagnosis


def diagnose(ctx, failed) -> Optional[Diagnosis]:
    from layerlab.probe.op_rules import _BROADCAST, _MATMUL

    op = failed.record.op
    name = op.lstrip("_").rstrip("_") if op.startswith("__") else op
    rules = [reduced_batch_rules.reduced_batch]
    if op == "einsum":
        rules.insert(0, einsum_label_rules.relabel)
    elif op == "F.grid_sample":
        rules.insert(0, sampling_grid_rules.grid_layout)
    elif op in ("_pack_padded_sequence", "pack_padded_sequence"):
        rules.insert(0, packed_sequence_rules.packed)
    elif op in ("cat", "concat", "concatenate"):
        rules = [cat_operand_rules.unflattened_map, cat_operand_rules.reshape_factor]
    elif op in _MATMUL:
        rules += [cache_axis_rules.grown_axis]
    elif op in _BROADCAST or name in _BROADCAST:
        rules += [trailing_axes_rules.missing_trailing_axes, edge_index_rules.edge_index_layout,
                  cache_axis_rules.grown_axis, head_dim_rules.table_for_width]
    for rule in rules:
        found = rule(ctx, failed)
        if found is not None:
            return found
    return None
