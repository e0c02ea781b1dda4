"""Op failures whose cause is how an operand was made or labeled, not the op that raised.

Tried before the per-op rules of :mod:`op_rules`, because those read only the failing op's shapes
and would resize or transpose there — where these see, through the op trace, the upstream op
(a ``cat`` on the wrong axis, a reduction over the batch, a reshape by the wrong factor), the
input layout (an (E, 2) edge list, a channels-first flow grid) or the labels (an einsum operand
whose axes another einsum fixed) that is wrong. Each rule returns ``None`` unless its pattern is
unambiguous; then the per-op rules answer as before.

Each rule registers itself (:mod:`layerlab.engine.rule_registry`) with the ops it reads and an
order before the per-op rules' (200–299); importing this module imports them all.
"""

from layerlab.probe import cache_axis_rules, cat_operand_rules, edge_index_rules, einsum_label_rules  # noqa: F401
from layerlab.probe import head_dim_rules, packed_sequence_rules, reduced_batch_rules, sampling_grid_rules  # noqa: F401
from layerlab.probe import trailing_axes_rules  # noqa: F401
