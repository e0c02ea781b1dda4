r"""Scaled dot-product attention, written as its five steps, and a causal-mask helper.

:func:`scaled_dot_product_attention` is equal to
:func:`torch.nn.functional.scaled_dot_product_attention` (same arguments, same mask semantics,
same outputs and gradients), but computed as plain tensor operations you can step through::

    scores  = query @ key.transpose(-2, -1)     # (…, L, S)   matmul
    scores  = scores * scale                     # (…, L, S)   scale, 1/√E by default
    scores  = scores + mask                      # (…, L, S)   mask: −inf where not allowed
    weights = softmax(scores, dim=-1)            # (…, L, S)   each row sums to 1
    weights = dropout(weights, dropout_p)        # (…, L, S)
    output  = weights @ value                    # (…, L, Ev)  matmul

Mask semantics (torch's SDPA):

* **bool** ``attn_mask``: ``True`` = the query **may attend** to that key; ``False`` = blocked.
  (:class:`torch.nn.MultiheadAttention` uses the **opposite** convention for bool masks, see
  :mod:`layerlab.layers.multihead`.)
* **float** ``attn_mask``: added to the scores (``0`` = allowed, ``-inf`` = blocked, anything
  else = a bias). A float mask means the same thing in SDPA and in multi-head attention, which
  makes it the safe form to pass around.
* ``is_causal=True``: query i may attend keys j ≤ i (top-left aligned when L ≠ S, as torch).
* A query row with **every** key blocked gets all-zero weights and a zero output (torch's
  "safe softmax"), not NaN.

Dimension letters used in this module:

    N   batch dims (any number, broadcast like matmul)
    Hq  query heads, Hk key/value heads (only with ``enable_gqa``)
    L   query (target) sequence length
    S   key/value (source) sequence length
    E   query/key features per head
    Ev  value features per head
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._seq_checks import (
    check_mask_dtype,
    check_tensor,
    input_error,
    probability,
    quiet_when_tracing,
    shape_str,
)

__all__ = [
    "causal_mask",
    "scaled_dot_product_attention",
    "attention_with_weights",
    "attend",
    "ScaledDotProductAttention",
    "TorchScaledDotProductAttention",
]

_LAYER = "scaled_dot_product_attention"


def causal_mask(length: int, key_length: Optional[int] = None, *, dtype: torch.dtype = torch.bool,
                device=None) -> Tensor:
    r"""The causal mask ``(L, S)``: query position i may attend key positions j ≤ i.

    Args:
        length (int): L, the query length.
        key_length (int, optional): S, the key length. Default: ``length``. When ``S ≠ L`` the
            mask is top-left aligned (``j ≤ i``), exactly like SDPA's ``is_causal``.
        dtype (torch.dtype, optional): ``torch.bool`` gives SDPA's bool form (``True`` = may
            attend); a floating dtype gives the additive form (``0.0`` = may attend, ``-inf`` =
            blocked), which means the same thing to SDPA and to multi-head attention.
            Default: ``torch.bool``
        device (torch.device, optional): where to create it.

    For :class:`torch.nn.MultiheadAttention`'s bool convention (``True`` = blocked) pass
    ``~causal_mask(L)`` or, better, the float form.

    Examples::

        >>> causal_mask(3)
        tensor([[ True, False, False],
                [ True,  True, False],
                [ True,  True,  True]])
        >>> causal_mask(3, dtype=torch.float32)
        tensor([[0., -inf, -inf],
                [0., 0., -inf],
                [0., 0., 0.]])
    """
    S = length if key_length is None else key_length
    if length < 0 or S < 0:
        raise input_error("causal_mask", "lengths", "L ≥ 0 and S ≥ 0", f"L={length}, S={S}",
                          "pass non-negative lengths")
    allowed = torch.ones(length, S, dtype=torch.bool, device=device).tril()  # (L, S)
    if dtype == torch.bool:
        return allowed
    if not dtype.is_floating_point:
        raise input_error("causal_mask", "dtype", "torch.bool or a floating dtype", dtype,
                          "pass dtype=torch.bool or dtype=torch.float32")
    return torch.zeros(length, S, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


@quiet_when_tracing
def _check_inputs(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor], dropout_p: float,
                  is_causal: bool, enable_gqa: bool) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(_LAYER, name, t)
        if t.dim() < 2:
            raise input_error(_LAYER, f"{name} rank", "≥ 2-D [..., seq, features]",
                              f"{t.dim()}-D {shape_str(t.shape)}", f"add a sequence dim to {name}")

    def shapes() -> str:  # the context of every message, built only when one is raised
        return f"query {shape_str(query.shape)}, key {shape_str(key.shape)}, value {shape_str(value.shape)}"

    if key.shape[-1] != query.shape[-1]:
        raise input_error(_LAYER, "key features E", query.shape[-1], key.shape[-1],
                          "query and key must have the same last dim (their dot product is the score)",
                          context=shapes())
    if key.shape[-2] != value.shape[-2]:
        raise input_error(_LAYER, "value length S", key.shape[-2], value.shape[-2],
                          "key and value must have the same sequence length (one value per key)",
                          context=shapes())
    if query.dtype != key.dtype or query.dtype != value.dtype or not query.dtype.is_floating_point:
        raise input_error(_LAYER, "dtypes", "query, key and value of one floating dtype",
                          f"{query.dtype}, {key.dtype}, {value.dtype}", "convert them with .to(query.dtype)")
    if enable_gqa and query.dim() >= 3 and key.dim() >= 3:
        Hq, Hk = query.shape[-3], key.shape[-3]
        if Hk == 0 or Hq % Hk or value.shape[-3] != Hk:
            raise input_error(_LAYER, "GQA heads", "query heads Hq divisible by key heads Hk = value heads",
                              f"Hq={Hq}, Hk={Hk}, Hv={value.shape[-3]}", "use Hk = Hv dividing Hq",
                              context=shapes())
    if not 0.0 <= dropout_p <= 1.0:
        raise input_error(_LAYER, "dropout_p", "a probability in [0, 1]", dropout_p, "pass 0.0 ≤ dropout_p ≤ 1.0")
    if attn_mask is not None:
        if is_causal:
            raise input_error(_LAYER, "masks", "attn_mask or is_causal=True", "both",
                              "drop attn_mask, or pass is_causal=False and a mask that includes causality "
                              "(e.g. attn_mask & causal_mask(L, S))")
        check_tensor(_LAYER, "attn_mask", attn_mask)
        check_mask_dtype(_LAYER, "attn_mask", attn_mask)
        L, S = query.shape[-2], key.shape[-2]
        if attn_mask.dim() == 0 or attn_mask.shape[-1] not in (1, S) or (
                attn_mask.dim() >= 2 and attn_mask.shape[-2] not in (1, L)):
            raise input_error(_LAYER, "attn_mask shape", f"[..., {L}, {S}] = [..., L, S] (broadcastable)",
                              shape_str(attn_mask.shape), f"build the mask for L={L} queries and S={S} keys",
                              context=shapes())


def _default_scale(E: int) -> float:
    """``1/√E``. Under ``torch.jit.trace`` ``E`` is a traced size (a 0-dim tensor): the scale is
    then computed with tensor ops, so a trace made at one head size stays right at another
    (``math.sqrt`` would freeze the traced ``E`` into the program: silently wrong values)."""
    if isinstance(E, Tensor):
        return E.to(torch.float64).rsqrt()
    return 1.0 / math.sqrt(E)


def _blocked_rows(attn_mask: Tensor) -> Optional[Tensor]:
    """``(…, L, 1)``: True for query rows whose every key is blocked, or ``None`` if there are none.

    Read off the mask, which is usually much smaller than the scores. Eagerly on the CPU, a mask
    without such rows (the usual case) returns ``None`` and the fix-up costs nothing. On an
    accelerator (where asking would wait for the device) and under ``torch.jit.trace`` /
    ``torch.compile`` (whose graphs must not depend on the mask's values) the tensor is always
    returned and the fix-up always runs.
    """
    with torch.no_grad():
        if attn_mask.dtype == torch.bool:
            dead = ~attn_mask.any(dim=-1, keepdim=True)
        else:
            dead = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)
    if dead.device.type != "cpu" or torch.jit.is_tracing() or torch.compiler.is_compiling():
        return dead
    return dead if bool(dead.any()) else None


def attention_with_weights(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                           dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                           enable_gqa: bool = False) -> Tuple[Tensor, Tensor]:
    """:func:`scaled_dot_product_attention` that also returns the attention weights.

    Returns:
        ``(output, weights)``: ``output`` is :math:`(N..., L, E_v)`; ``weights`` is
        :math:`(N..., L, S)`, the matrix that multiplied ``value`` (after dropout).
    """
    _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if enable_gqa and query.dim() >= 3 and key.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        # Grouped-query attention: each key/value head serves Hq/Hk consecutive query heads.
        groups = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(groups, dim=-3)  # (N, Hq, S, E)
        value = value.repeat_interleave(groups, dim=-3)  # (N, Hq, S, Ev)
    return attend(query, key, value, attn_mask, dropout_p, is_causal, scale)


def attend(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
           is_causal: bool = False, scale: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """The six steps with no input checks: for callers that validated already (multi-head attention)."""
    L, S, E = query.shape[-2], key.shape[-2], query.shape[-1]
    scale = _default_scale(E) if scale is None else scale

    scores = query @ key.transpose(-2, -1)  # (N, L, S)   1. matmul
    scores = scores * scale  # (N, L, S)                   2. scale
    dead = None  # rows with every key blocked: softmax would give 0/0 = NaN there
    if is_causal:  # 3. mask (top-left causal: row i keeps key 0, so no row is dead)
        blocked = torch.ones(L, S, dtype=torch.bool, device=scores.device).triu(1)  # key j > query i
        scores = scores.masked_fill(blocked, float("-inf"))
    elif attn_mask is not None:
        # Torch's "safe softmax": a fully blocked row gets weights 0 (output 0), not NaN. Such
        # rows are read off the mask (small) and left unmasked here, then zeroed after the softmax.
        dead = _blocked_rows(attn_mask)  # (…, L, 1) or None
        if attn_mask.dtype == torch.bool:  # bool: True = may attend
            scores = torch.where(attn_mask if dead is None else attn_mask | dead, scores, float("-inf"))
        else:  # float: an additive bias, −inf blocks
            bias = attn_mask.to(scores.dtype)
            scores = scores + (bias if dead is None else bias.masked_fill(dead, 0.0))
    weights = torch.softmax(scores, dim=-1)  # (N, L, S)    4. softmax over keys
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)  # zero weights (and zero gradients) for dead rows
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)  # 5. dropout (on weights, as torch)
    return weights @ value, weights  # (N, L, Ev)         6. matmul


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    r"""Attention as matmul → scale → mask → softmax → dropout → matmul; equal to F.sdpa.

    .. math::

        \text{out} = \text{dropout}\Big(\text{softmax}\big(\tfrac{Q K^T}{\sqrt{E}} + M\big)\Big)\, V

    Args:
        query (Tensor): :math:`(N..., L, E)`.
        key (Tensor): :math:`(N..., S, E)`.
        value (Tensor): :math:`(N..., S, E_v)`.
        attn_mask (Tensor, optional): broadcastable to :math:`(N..., L, S)`; bool (``True`` =
            may attend) or float of the query's dtype (added to the scores). Default: ``None``
        dropout_p (float, optional): dropout on the weights. Like torch's function it is applied
            whenever > 0, training or not; pass ``0.0`` for evaluation. Default: 0.0
        is_causal (bool, optional): apply :func:`causal_mask`; must not be combined with
            ``attn_mask``. Default: ``False``
        scale (float, optional): score scale. Default: :math:`1/\sqrt{E}`
        enable_gqa (bool, optional): grouped-query attention: key/value have Hk heads in dim −3,
            each shared by Hq/Hk query heads. Default: ``False``

    Shape:
        - output: :math:`(N..., L, E_v)`

        where:
            N... = batch dims (e.g. B, H), L = query length, S = key length,
            E = query/key features, E_v = value features

    Reference loop (one batch element, no mask, no dropout)::

        for i in range(L):
            s = [sum(q[i][e] * k[j][e] for e in range(E)) * scale for j in range(S)]
            w = [math.exp(x - max(s)) for x in s]
            w = [x / sum(w) for x in w]
            out[i] = [sum(w[j] * v[j][f] for j in range(S)) for f in range(Ev)]
    """
    return attention_with_weights(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0]


class ScaledDotProductAttention(nn.Module):
    r"""Module form of :func:`scaled_dot_product_attention` that keeps the last weights.

    Args:
        dropout_p (float, optional): dropout on the attention weights, **training mode only**
            (unlike the function). Default: 0.0
        is_causal (bool, optional): apply the causal mask in every call. Default: ``False``
        scale (float, optional): score scale. Default: :math:`1/\sqrt{E}`
        enable_gqa (bool, optional): grouped-query attention. Default: ``False``

    Shape:
        - query: :math:`(N..., L, E)`, key: :math:`(N..., S, E)`, value: :math:`(N..., S, E_v)`
        - attn_mask: broadcastable to :math:`(N..., L, S)`, bool (``True`` = may attend) or float.
        - output: :math:`(N..., L, E_v)`

        where:
            N... = batch dims, L = query length, S = key length, E = query/key features,
            E_v = value features

    Attributes:
        last_attn_weights (Tensor or None): :math:`(N..., L, S)`, the weights that multiplied
            ``value`` in the last forward (after dropout), detached. Not updated by a
            ``torch.jit.trace``-d copy (a trace records tensor ops, not attribute writes).
    """

    def __init__(self, dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                 enable_gqa: bool = False) -> None:
        super().__init__()
        self.dropout_p = probability("ScaledDotProductAttention", "dropout_p", dropout_p)
        self.is_causal = is_causal
        self.scale = scale
        self.enable_gqa = enable_gqa
        self.last_attn_weights: Optional[Tensor] = None

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None) -> Tensor:
        p = self.dropout_p if self.training else 0.0
        out, weights = attention_with_weights(query, key, value, attn_mask, p, self.is_causal, self.scale,
                                              self.enable_gqa)
        self.last_attn_weights = weights.detach()
        return out

    def extra_repr(self) -> str:
        parts = [f"dropout_p={self.dropout_p}"] if self.dropout_p else []
        parts += ["is_causal=True"] if self.is_causal else []
        parts += [f"scale={self.scale}"] if self.scale is not None else []
        parts += ["enable_gqa=True"] if self.enable_gqa else []
        return ", ".join(parts)

    @classmethod
    def from_torch(cls, module: "TorchScaledDotProductAttention") -> "ScaledDotProductAttention":
        """From the torch wrapper (no weights to copy; the settings are copied)."""
        if not isinstance(module, TorchScaledDotProductAttention):
            raise TypeError(f"ScaledDotProductAttention.from_torch: expected a TorchScaledDotProductAttention, "
                            f"got {type(module).__name__}")
        return cls(module.dropout_p, module.is_causal, module.scale, module.enable_gqa).train(module.training)

    def to_torch(self) -> "TorchScaledDotProductAttention":
        """The reference: the same settings around :func:`torch.nn.functional.scaled_dot_product_attention`."""
        return TorchScaledDotProductAttention(self.dropout_p, self.is_causal, self.scale,
                                              self.enable_gqa).train(self.training)


class TorchScaledDotProductAttention(nn.Module):
    """Reference for :class:`ScaledDotProductAttention`: a thin module around torch's fused function.

    torch.nn has no SDPA module; this wrapper gives the registry and the parity checks one
    with the same constructor and forward signature. Dropout acts in training mode only.
    """

    def __init__(self, dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                 enable_gqa: bool = False) -> None:
        super().__init__()
        self.dropout_p = float(dropout_p)
        self.is_causal = is_causal
        self.scale = scale
        self.enable_gqa = enable_gqa

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None) -> Tensor:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                              dropout_p=self.dropout_p if self.training else 0.0,
                                              is_causal=self.is_causal, scale=self.scale,
                                              enable_gqa=self.enable_gqa)
