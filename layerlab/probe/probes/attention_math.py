r"""Per-head statistics of attention distributions, computed beside the model, never inside it.

Two entry points, both under :func:`~layerlab.probe.probes.base.quiet` (no graph, no mode sees
them), both on copies in float32:

* :func:`from_qk`: the weights ``softmax(q kᵀ · scale + mask)`` rebuilt from the arguments of an
  ``F.scaled_dot_product_attention`` call (bool or float ``attn_mask``, ``is_causal`` top-left as
  torch, ``scale``, grouped-query heads), the way torch's fused kernel computes them;
* :func:`from_scores`: the argument of a ``softmax`` an attention module's own code calls
  (Hugging Face "eager" attention, layerlab's layers), scores with the mask already added.

Letters: B batch (every leading dim flattened), H heads, L queries, S keys, E features per head.

Definitions, per row (one query of one head of one sample):

* allowed keys n: keys the mask lets the query see (bool ``True`` in SDPA's convention, a float
  bias above ``finfo.min / 2``, ``j ≤ i`` under ``is_causal``); a row with n = 0 (every key
  blocked: torch's "safe softmax" gives zero weights) is left out of every number;
* entropy :math:`-\sum_j w_j \log w_j` in nats (``0 · log 0 = 0``); uniform over the allowed keys
  gives :math:`\log n`, one key gets everything gives 0;
* max weight :math:`\max_j w_j`.

Per head: the mean of each over its rows (batch × queries). A head is **collapsed to one key**
when ≥ 90 % of its rows with n ≥ 2 put ≥ 0.99 of their weight on one key, **uniform** when ≥ 90 %
of those rows have entropy ≥ 0.99 · log n (rows with one allowed key, like the first query under
a causal mask, are both by construction and count for neither).

Cost: queries beyond :data:`MAX_QUERIES` are sampled evenly (first and last kept) and the batch is
processed in chunks of at most :data:`CHUNK_ELEMENTS` weights, so memory stays bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["HeadStats", "from_qk", "from_scores", "from_weights", "MAX_QUERIES", "ONE_KEY", "UNIFORM", "MAJORITY"]

MAX_QUERIES = 256
CHUNK_ELEMENTS = 1 << 22
ONE_KEY = 0.99  # max weight of a near-one-hot row
UNIFORM = 0.99  # entropy / log n of a near-uniform row
_FLOOR = -60.0  # log-weights clamped here (see _Accumulator.add)
MAJORITY = 0.9  # fraction of a head's rows that must agree for the head to be called collapsed/uniform


@dataclass
class HeadStats:
    """Per-head results (tensors of length H) and what was measured."""

    entropy: torch.Tensor  # mean entropy (nats)
    max_weight: torch.Tensor  # mean max weight
    log_keys: torch.Tensor  # mean log n (the entropy of uniform attention over the allowed keys)
    one_key: torch.Tensor  # bool: collapsed to one key
    uniform: torch.Tensor  # bool: uniform over the allowed keys
    rows: int  # rows measured per head (batch × queries, rows with no allowed key left out)
    keys: int  # S
    queries: int  # L
    sampled: Optional[int] = None  # queries measured when L > MAX_QUERIES


class _Accumulator:
    def __init__(self, heads: int, device) -> None:
        z = lambda: torch.zeros(heads, dtype=torch.float64, device=device)  # noqa: E731
        self.ent, self.maxw, self.logn, self.valid = z(), z(), z(), z()
        self.multi, self.onehot, self.flat = z(), z(), z()

    def add(self, logp: torch.Tensor, n: torch.Tensor) -> None:
        """``logp``: (b, H, l, S) log-weights; ``n``: allowed keys per row, broadcastable to (b, H, l)."""
        # weights below e^-60 change no entropy digit; clamping keeps them out of the denormal range,
        # where CPU arithmetic is many times slower (masked keys, −inf, become e^-60 ≈ 1e-26: negligible)
        logp = logp.clamp(min=_FLOOR)
        p = logp.exp()
        ent = (p * logp).sum(-1).neg()
        maxw = p.amax(-1)
        n = n.expand_as(maxw)
        valid = n >= 1
        multi = n >= 2
        logn = torch.log(n.clamp(min=1).to(ent.dtype))
        ent = torch.where(valid, ent, torch.zeros((), dtype=ent.dtype, device=ent.device))
        maxw = torch.where(valid, maxw, torch.zeros((), dtype=maxw.dtype, device=maxw.device))
        dims = (0, 2)
        self.ent += ent.sum(dims).double()
        self.maxw += maxw.sum(dims).double()
        self.logn += torch.where(valid, logn, 0.0).sum(dims).double()
        self.valid += valid.sum(dims).double()
        self.multi += multi.sum(dims).double()
        self.onehot += (multi & (maxw >= ONE_KEY)).sum(dims).double()
        self.flat += (multi & (ent >= UNIFORM * logn)).sum(dims).double()

    def result(self, keys: int, queries: int, sampled: Optional[int]) -> HeadStats:
        valid = self.valid.clamp(min=1)
        multi = self.multi.clamp(min=1)
        has_multi = self.multi > 0
        return HeadStats(
            entropy=self.ent / valid, max_weight=self.maxw / valid, log_keys=self.logn / valid,
            one_key=has_multi & (self.onehot / multi >= MAJORITY), uniform=has_multi & (self.flat / multi >= MAJORITY),
            rows=int(self.valid.max().item()) if self.valid.numel() else 0, keys=keys, queries=queries,
            sampled=sampled,
        )


def _as_bhld(t: torch.Tensor) -> torch.Tensor:
    """(…, L, D) as (B, H, L, D): 2-D one head one sample, 3-D one head, ≥ 5-D leading dims flattened."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    if t.dim() == 4:
        return t
    return t.reshape(-1, *t.shape[-3:])


def _query_rows(L: int) -> Optional[torch.Tensor]:
    if L <= MAX_QUERIES:
        return None
    return torch.linspace(0, L - 1, MAX_QUERIES).round().long().unique()


def from_qk(query: torch.Tensor, key: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
            is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False) -> HeadStats:
    """Per-head statistics of SDPA's weights for these arguments (see the module docstring)."""
    L, S, E = query.shape[-2], key.shape[-2], query.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    lead = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]) if not enable_gqa else query.shape[:-2]
    q = _as_bhld(query.expand(*lead, L, E) if query.shape[:-2] != lead else query)
    if enable_gqa and key.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    k = _as_bhld(key.expand(*lead, S, E) if key.shape[:-2] != lead else key)
    rows = _query_rows(L)
    if rows is not None:
        q = q[:, :, rows]
    bias = allowed = None
    if is_causal:
        qi = rows if rows is not None else torch.arange(L)
        allowed = (torch.arange(S)[None, :] <= qi[:, None]).to(q.device)[None, None]  # (1, 1, l, S)
    elif attn_mask is not None:
        m = attn_mask if rows is None or attn_mask.shape[-2] == 1 else attn_mask[..., rows.to(attn_mask.device), :]
        if m.dtype == torch.bool:
            allowed = m
        else:
            allowed = m > torch.finfo(m.dtype).min / 2
            bias = m
        l = q.shape[2]
        allowed = _as_bhld(allowed.expand(*lead, l, S))
        bias = _as_bhld(bias.expand(*lead, l, S)) if bias is not None else None
    B, H, l = q.shape[0], q.shape[1], q.shape[2]
    acc = _Accumulator(H, q.device)
    step = max(1, CHUNK_ELEMENTS // max(1, H * l * S))
    n_all = torch.full((1, 1, 1), S, device=q.device)
    for b0 in range(0, B, step):
        qc, kc = q[b0:b0 + step].float(), k[b0:b0 + step].float()
        s = (qc * scale) @ kc.transpose(-2, -1)  # (b, H, l, S)
        if bias is not None:
            s = s + bias[b0:b0 + step].float()
        if allowed is not None:
            a = allowed[b0:b0 + step] if allowed.shape[0] > 1 else allowed
            s = s.masked_fill(~a, float("-inf"))
            n = a.sum(-1)
        else:
            n = n_all
        acc.add(torch.log_softmax(s, dim=-1), n)
    return acc.result(S, L, None if rows is None else len(rows))


def from_scores(scores: torch.Tensor) -> HeadStats:
    """Per-head statistics of ``softmax(scores, dim=-1)``; masked keys are the scores at or below
    ``finfo.min / 2`` (−inf, or the dtype's minimum that Hugging Face adds)."""
    s = _as_bhld(scores)
    L, S = s.shape[-2], s.shape[-1]
    rows = _query_rows(L)
    if rows is not None:
        s = s[:, :, rows.to(s.device)]
    B, H, l = s.shape[0], s.shape[1], s.shape[2]
    floor = torch.finfo(scores.dtype).min / 2
    acc = _Accumulator(H, s.device)
    step = max(1, CHUNK_ELEMENTS // max(1, H * l * S))
    for b0 in range(0, B, step):
        sc = s[b0:b0 + step].float()
        allowed = sc > floor
        sc = sc.masked_fill(~allowed, float("-inf"))
        acc.add(torch.log_softmax(sc, dim=-1), allowed.sum(-1))
    return acc.result(S, L, None if rows is None else len(rows))


def from_weights(weights: torch.Tensor, allowed: Optional[torch.Tensor]) -> HeadStats:
    """Per-head statistics of weights already computed (rows summing to 1 over the allowed keys;
    ``allowed`` broadcastable to the weights, ``None`` = every key)."""
    w = _as_bhld(weights)
    L, S = w.shape[-2], w.shape[-1]
    a = None if allowed is None else _as_bhld(allowed.expand(weights.shape))
    rows = _query_rows(L)
    if rows is not None:
        w = w[:, :, rows.to(w.device)]
        a = a[:, :, rows.to(w.device)] if a is not None else None
    B, H, l = w.shape[0], w.shape[1], w.shape[2]
    acc = _Accumulator(H, w.device)
    step = max(1, CHUNK_ELEMENTS // max(1, H * l * S))
    n_all = torch.full((1, 1, 1), S, device=w.device)
    for b0 in range(0, B, step):
        wc = w[b0:b0 + step].float()
        logp = torch.log(wc)  # log 0 = −inf: 0 · log 0 is taken as 0 below
        if a is not None:
            ac = a[b0:b0 + step]
            acc.add(logp.masked_fill(~ac, float("-inf")), ac.sum(-1))
        else:
            acc.add(logp, n_all)
    return acc.result(S, L, None if rows is None else len(rows))
