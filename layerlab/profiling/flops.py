"""FLOP counting for ``layerlab profile``: torch's ``FlopCounterMode`` plus the formulas it lacks,
and a record of the compute ops that ran without any formula.

Why: ``FlopCounterMode`` counts only ops in its registry and silently counts 0 for the rest. On CPU,
``F.scaled_dot_product_attention`` runs ``aten._scaled_dot_product_flash_attention_for_cpu`` (and
its ``_backward``), which torch's registry does not know, so every attention row read 0 FLOPs and a
GPT-2 step came out ~18 % short. :func:`flop_counter` passes formulas for those ops through
``FlopCounterMode(custom_mapping=…)``, reusing torch's own ``sdpa_flop_count`` /
``sdpa_backward_flop_count`` (so the convention is torch's: 2 FLOPs per multiply-add, the full
L×S score matrix even for a causal kernel, a backward that recomputes the scores).

:class:`UncountedOps` is a dispatch mode entered *below* the counter: it sees every op the counter
let run and records, per owner, those that are compute ops (matmuls, convolutions, attention,
recurrent layers: see :data:`COMPUTE_OP`) and still have no formula, so a report can say
"not counted: aten.mkldnn_rnn_layer ×1" instead of a silent 0. Element-wise ops, views,
normalisations and reductions are not flagged: torch counts them as 0 by convention.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Callable, Dict, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["COMPUTE_OP", "extra_formulas", "flop_counter", "UncountedOps"]

#: Op names that do real arithmetic (so a missing formula is a real under-count): matmul family,
#: convolutions (``conv`` followed by ``olution``, a digit or ``_``: not ``_convert_…``),
#: attention kernels, recurrent kernels, vector products. Interpolation (``upsample_bilinear2d``)
#: is not a product and is left out.
COMPUTE_OP = re.compile(
    r"^(?!_?upsample)(.*(mm|matmul|einsum|linear|addmv|(^|_)v?dot$|addr$|tensordot|cdist"
    r"|conv(olution|\d|_)|attention|attn|rnn|lstm|gru)|mv$)"
)


def _qkv4(shape: Any) -> tuple:
    """A (…, L, E) shape as torch's formulas want it: (B, H, L, E), leading dims merged."""
    s = tuple(shape)
    if len(s) < 4:
        return (1,) * (4 - len(s)) + s
    return (math.prod(s[:-3]),) + s[-3:]


def _sdpa_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Forward of a fused SDPA kernel: Q·Kᵀ and P·V (torch's ``sdpa_flop_count``)."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(_qkv4(query), _qkv4(key), _qkv4(value))


def _sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Backward of a fused SDPA kernel: scores recomputed, then four matmuls
    (torch's ``sdpa_backward_flop_count``)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(_qkv4(grad_out), _qkv4(query), _qkv4(key), _qkv4(value))


def _native_mha(query, key, value, embed_dim, num_head, *args, out_shape=None, **kwargs) -> int:
    """``nn.MultiheadAttention``'s inference fast path in one op: in-projections of q, k and v,
    attention, out-projection (what the slow path counts through mm/bmm, op by op)."""
    E = int(embed_dim)
    L, S = query[-2], key[-2]
    B = math.prod(query[:-2])
    projections = 2 * B * (L + 2 * S) * E * E + 2 * B * L * E * E
    return projections + 4 * B * L * S * E


#: op name → formula over shapes; only those missing from torch's registry are used.
_FORMULAS: Dict[str, Callable[..., int]] = {
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_forward,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
    "_scaled_dot_product_fused_attention_overrideable": _sdpa_forward,
    "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward,
    "_scaled_dot_product_attention_math_for_mps": _sdpa_forward,
    "_native_multi_head_attention": _native_mha,
}


def extra_formulas() -> Dict[Any, Callable[..., int]]:
    """``custom_mapping`` for ``FlopCounterMode``: formulas for ops this torch has and its
    registry lacks (a newer torch that registers one keeps its own)."""
    from torch.utils.flop_counter import flop_registry

    mapping = {}
    for name, formula in _FORMULAS.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and packet not in flop_registry:
            mapping[packet] = formula
    return mapping


def flop_counter():
    """A silent ``FlopCounterMode`` that also knows :func:`extra_formulas`."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=extra_formulas())


class UncountedOps(TorchDispatchMode):
    """Records compute ops that ran without a FLOP formula, per owner.

    Enter it *before* the counter (so it sits below it and sees the ops the counter ran, after any
    decomposition): ``with UncountedOps(counter.flop_registry, owner): with counter: …``.

    Args:
        registry: the counter's ``flop_registry`` (op packet → formula).
        owner: called for each flagged op; returns who ran it (a row index) or ``None``.

    Attributes:
        total: ``{"aten.op": count}`` over the whole step.
        by_owner: ``{owner: {"aten.op": count}}``.
    """

    def __init__(self, registry: Dict[Any, Any], owner: Callable[[], Optional[int]] = lambda: None) -> None:
        super().__init__()
        self.registry = registry
        self.owner = owner
        self.total: Counter = Counter()
        self.by_owner: Dict[Optional[int], Counter] = {}
        self._verdict: Dict[Any, bool] = {}

    def _flagged(self, packet: Any) -> bool:
        verdict = self._verdict.get(packet)
        if verdict is None:
            name = str(packet).rsplit(".", 1)[-1]
            verdict = packet not in self.registry and bool(COMPUTE_OP.search(name))
            self._verdict[packet] = verdict
        return verdict

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func._overloadpacket
        if self._flagged(packet):
            name = str(packet)
            self.total[name] += 1
            self.by_owner.setdefault(self.owner(), Counter())[name] += 1
        return func(*args, **(kwargs or {}))
