r"""Multi-head attention, equal to :class:`torch.nn.MultiheadAttention`, with readable weights.

The forward pass, step by step (batch-first inside, whatever the input layout)::

    q, k, v = query W_q^T + b_q, key W_k^T + b_k, value W_v^T + b_v   # (B, L|S, E)
    q, k, v = split E into nh heads of hs features                     # (B, nh, L|S, hs)
    mask    = attn_mask + key_padding_mask, as floats (−inf = blocked)  # (B, nh, L, S)
    out, w  = attention(q, k, v, mask)   # softmax(q k^T / √hs + mask) → dropout → @ v
    out     = merge heads, then out_proj                                # (B, L, E)

.. warning::

    **Bool masks mean the opposite of SDPA's here.** In :class:`torch.nn.MultiheadAttention`
    (and in this class) a bool ``attn_mask`` or ``key_padding_mask`` is ``True`` where
    attention is **NOT allowed**. In :func:`torch.nn.functional.scaled_dot_product_attention`
    (and :mod:`layerlab.layers.attention`) ``True`` means **may attend**. Passing an SDPA mask
    here silently attends to exactly the wrong keys. Float masks (``0`` allowed, ``-inf``
    blocked) mean the same thing in both: prefer them, e.g. ``causal_mask(L, dtype=x.dtype)``.

Dimension letters used in this module:

    B    batch size (N in torch's docs; absent for unbatched input)
    L    target (query) sequence length
    S    source (key/value) sequence length (+1 with add_bias_kv, +1 with add_zero_attn)
    E    embed_dim (query features and output features)
    Ek   kdim (key features), Ev  vdim (value features)
    nh   num_heads
    hs   head size = E / nh
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._seq_checks import (
    TorchTwin,
    check_dim,
    check_float_dtype,
    check_mask_dtype,
    check_tensor,
    input_error,
    positive_int,
    probability,
    quiet_when_tracing,
    shape_str,
)
from layerlab.layers.attention import attend, causal_mask

__all__ = ["MultiheadAttention"]

_LAYER = "MultiheadAttention"


class MultiheadAttention(TorchTwin, nn.Module):
    r"""Multi-head attention: nh scaled dot-product attentions over learned projections.

    .. math::

        \text{MultiHead}(Q, K, V) = \text{Concat}(\text{head}_1, \dots, \text{head}_{nh}) W^O,
        \quad \text{head}_i = \text{softmax}\Big(\frac{Q W_i^Q (K W_i^K)^T}{\sqrt{hs}} + M\Big) V W_i^V

    Equal to :class:`torch.nn.MultiheadAttention` in outputs, returned weights, gradients,
    parameter names and layouts. **Read the module warning: a bool mask is True = blocked.**

    Args:
        embed_dim (int): E, features of the query and of the output.
        num_heads (int): nh; must divide E (each head gets hs = E / nh features).
        dropout (float, optional): dropout on the attention weights (training mode only). Default: 0.0
        bias (bool, optional): biases in the input and output projections. Default: ``True``
        add_bias_kv (bool, optional): append a learned key and value (``bias_k``, ``bias_v``)
            to the key/value sequences (S grows by 1). Default: ``False``
        add_zero_attn (bool, optional): append an all-zero key and value per head after the
            projection (S grows by 1). Default: ``False``
        kdim (int, optional): Ek, features of ``key``. Default: E
        vdim (int, optional): Ev, features of ``value``. Default: E
        batch_first (bool, optional): inputs and output are :math:`(B, L, E)` instead of
            :math:`(L, B, E)`. Default: ``False``

    Forward args:
        query, key, value (Tensor): see Shape.
        key_padding_mask (Tensor, optional): keys to ignore per batch element: bool (``True``
            = ignore) or float (added to the scores). Default: ``None``
        need_weights (bool, optional): also return the attention weights. Default: ``True``
        attn_mask (Tensor, optional): 2-D, the same for every batch element and head, or 3-D,
            one per (batch element, head) with index ``b·nh + h``. Bool (``True`` = NOT
            allowed) or float (added). Default: ``None``
        average_attn_weights (bool, optional): average the returned weights over heads. Default: ``True``
        is_causal (bool, optional): the causal mask applies. With ``attn_mask`` given it is a
            hint, as in torch (``attn_mask`` is used and must be causal). Unlike torch, which
            raises, ``is_causal=True`` without ``attn_mask`` builds the causal mask. Default: ``False``

    Shape:
        - query: :math:`(L, B, E)`, :math:`(B, L, E)` with ``batch_first``, or :math:`(L, E)` (unbatched)
        - key: :math:`(S, B, E_k)`, :math:`(B, S, E_k)`, or :math:`(S, E_k)`
        - value: :math:`(S, B, E_v)`, :math:`(B, S, E_v)`, or :math:`(S, E_v)`
        - key_padding_mask: :math:`(B, S)` or :math:`(S)` (unbatched)
        - attn_mask: :math:`(L, S)` or :math:`(B \cdot nh, L, S)`
        - output: shaped like query (with E features)
        - weights: :math:`(B, L, S)` averaged, :math:`(B, nh, L, S)` per head (drop B when
          unbatched); ``None`` with ``need_weights=False``

        where:
            B = batch size, L = query length, S = key/value length, E = embed_dim,
            E_k = kdim, E_v = vdim, nh = num_heads

    Attributes:
        in_proj_weight: :math:`(3E, E)`, rows ``[W_q | W_k | W_v]``, Xavier-uniform over the
            whole :math:`(3E, E)` matrix; only when ``kdim == vdim == E``
        q_proj_weight, k_proj_weight, v_proj_weight: :math:`(E, E)`, :math:`(E, E_k)`,
            :math:`(E, E_v)`, each Xavier-uniform; only when kdim or vdim differ from E
        in_proj_bias: :math:`(3E)`, zeros
        out_proj.weight: :math:`(E, E)`, :class:`torch.nn.Linear`'s default init
        out_proj.bias: :math:`(E)`, zeros
        bias_k, bias_v: :math:`(1, 1, E)`, Xavier-normal; only with ``add_bias_kv``
        last_attn_weights (Tensor or None): per-head weights of the last forward,
            :math:`(B, nh, L, S)` (or :math:`(nh, L, S)` unbatched), after dropout, detached;
            kept even with ``need_weights=False``.

    Differences from torch (all pinned by tests):
        * a query row whose keys are all blocked gets zero weights and output ``out_proj.bias``;
          torch gives NaN there when ``need_weights=True`` (and zeros when ``False``).
        * ``is_causal=True`` without ``attn_mask`` works (torch raises).
        * ``is_causal=True`` with ``add_bias_kv`` / ``add_zero_attn`` keeps the appended key
          attendable; torch's ``need_weights=False`` path hands the hint to SDPA, whose causal
          mask then also blocks that key (its ``need_weights=True`` path agrees with ours).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        positive_int(_LAYER, "embed_dim", embed_dim)
        positive_int(_LAYER, "num_heads", num_heads)
        if embed_dim % num_heads:
            divisors = [h for h in range(1, embed_dim + 1) if embed_dim % h == 0]
            raise input_error(_LAYER, "num_heads", f"a divisor of embed_dim={embed_dim}", num_heads,
                              f"pick num_heads from {divisors}")
        dropout = probability(_LAYER, "dropout", dropout)
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = batch_first
        self.add_zero_attn = add_zero_attn
        E = embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * E, E, **factory))  # (3E, E)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = nn.Parameter(torch.empty(E, E, **factory))  # (E, E)
            self.k_proj_weight = nn.Parameter(torch.empty(E, self.kdim, **factory))  # (E, Ek)
            self.v_proj_weight = nn.Parameter(torch.empty(E, self.vdim, **factory))  # (E, Ev)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * E, **factory))  # (3E,)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(E, E, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, E, **factory))  # (1, 1, E)
            self.bias_v = nn.Parameter(torch.empty(1, 1, E, **factory))  # (1, 1, E)
        else:
            self.bias_k = self.bias_v = None
        self.last_attn_weights: Optional[Tensor] = None
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """torch's initialisation (see Attributes); ``out_proj.weight`` keeps Linear's default."""
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    def extra_repr(self) -> str:
        s = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.in_proj_bias is None:
            s += ", bias=False"
        if self.bias_k is not None:
            s += ", add_bias_kv=True"
        if self.add_zero_attn:
            s += ", add_zero_attn=True"
        if not self._qkv_same_embed_dim:
            s += f", kdim={self.kdim}, vdim={self.vdim}"
        if self.batch_first:
            s += ", batch_first=True"
        return s

    # ---- forward -----------------------------------------------------------------------------

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        batched = self._check(query, key, value, key_padding_mask, attn_mask)
        self_attention = query is key and key is value  # one fused projection below

        def batch_major(t: Tensor) -> Tensor:
            if not batched:
                return t.unsqueeze(0)  # (1, seq, feat)
            return t if self.batch_first else t.transpose(0, 1)  # (B, seq, feat)

        query, key, value = batch_major(query), batch_major(key), batch_major(value)
        B, L, E = query.shape
        nh, hs = self.num_heads, self.head_dim

        # 1. input projections
        if self._qkv_same_embed_dim:
            if self_attention:
                q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)  # (B, L, E) ×3
            else:
                w_q, w_k, w_v = self.in_proj_weight.chunk(3)  # (E, E) each
                b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
                q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        else:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
            q = F.linear(query, self.q_proj_weight, b_q)  # (B, L, E)
            k = F.linear(key, self.k_proj_weight, b_k)  # (B, S, E)
            v = F.linear(value, self.v_proj_weight, b_v)  # (B, S, E)

        # 2. masks → one additive float mask (MHA's bool convention: True = blocked)
        mask = self._merge_masks(attn_mask, key_padding_mask, is_causal, B, L, k.shape[1], q.dtype, q.device)

        # 3. optional extra key/value rows: a learned one (bias_kv), then a zero one per head
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.expand(B, 1, E)], dim=1)  # (B, S+1, E)
            v = torch.cat([v, self.bias_v.expand(B, 1, E)], dim=1)  # (B, S+1, E)
            mask = F.pad(mask, (0, 1)) if mask is not None else None  # the new key is allowed
        q = q.view(B, L, nh, hs).transpose(1, 2)  # (B, nh, L, hs)
        k = k.reshape(B, -1, nh, hs).transpose(1, 2)  # (B, nh, S, hs)
        v = v.reshape(B, -1, nh, hs).transpose(1, 2)  # (B, nh, S, hs)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(B, nh, 1, hs)], dim=2)  # (B, nh, S+1, hs)
            v = torch.cat([v, v.new_zeros(B, nh, 1, hs)], dim=2)  # (B, nh, S+1, hs)
            mask = F.pad(mask, (0, 1)) if mask is not None else None

        # 4. attention per head, 5. merge heads and project
        p = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, mask, dropout_p=p)  # (B, nh, L, hs), (B, nh, L, S)
        out = out.transpose(1, 2).reshape(B, L, E)  # (B, L, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)  # (B, L, E), as torch (no module call)

        self.last_attn_weights = weights.detach() if batched else weights.detach().squeeze(0)
        if not batched:
            out = out.squeeze(0)  # (L, E)
        elif not self.batch_first:
            out = out.transpose(0, 1)  # (L, B, E)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(dim=1)  # (B, L, S)
        return out, (weights if batched else weights.squeeze(0))

    def _merge_masks(self, attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], is_causal: bool,
                     B: int, L: int, S: int, dtype: torch.dtype, device: torch.device) -> Optional[Tensor]:
        """``attn_mask`` and ``key_padding_mask`` as one float mask broadcastable to (B, nh, L, S)."""
        def as_float(m: Tensor) -> Tensor:
            if m.dtype == torch.bool:  # MHA convention: True = NOT allowed
                return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
            return m.to(dtype)

        mask = None
        if attn_mask is None and is_causal:
            attn_mask = causal_mask(L, S, dtype=dtype, device=device)  # torch would raise; we build it
        if attn_mask is not None:
            mask = as_float(attn_mask)
            if mask.dim() == 3:
                mask = mask.view(B, self.num_heads, L, S)  # index b·nh + h → [b, h]
        if key_padding_mask is not None:
            kpm = as_float(key_padding_mask).view(B, 1, 1, S)  # (B, 1, 1, S): the same for every query
            mask = kpm if mask is None else mask + kpm
        return mask

    # ---- checks ------------------------------------------------------------------------------

    @quiet_when_tracing
    def _check(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor],
               attn_mask: Optional[Tensor]) -> bool:
        """Validate the inputs against torch's rules; return whether they are batched."""
        layout = "[B, L, E] (batch_first=True)" if self.batch_first else "[L, B, E] (batch_first=False)"
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_tensor(_LAYER, name, t)
        check_dim(_LAYER, "query", query, (2, 3), f"3-D {layout} or 2-D [L, E] (unbatched)")
        batched = query.dim() == 3

        def shapes() -> str:  # the context of every message, built only when one is raised
            return f"query {shape_str(query.shape)}, key {shape_str(key.shape)}, value {shape_str(value.shape)}"

        for name, t in (("key", key), ("value", value)):
            if t.dim() != query.dim():
                raise input_error(_LAYER, f"{name} rank", f"{query.dim()}-D like query", f"{t.dim()}-D",
                                  f"give {name} the same layout as query", context=shapes())
        for name, t, want, arg in (("query", query, self.embed_dim, "embed_dim"), ("key", key, self.kdim, "kdim"),
                                   ("value", value, self.vdim, "vdim")):
            if t.shape[-1] != want:
                raise input_error(_LAYER, f"{name} features ({arg})", want, t.shape[-1],
                                  f"project {name} to {want} features, or build the layer with {arg}={t.shape[-1]}",
                                  context=shapes())
            check_float_dtype(_LAYER, name, t, self.out_proj.weight.dtype)
        seq_dim = 1 if (batched and self.batch_first) else 0
        if key.shape[seq_dim] != value.shape[seq_dim]:
            raise input_error(_LAYER, "value length S", key.shape[seq_dim], value.shape[seq_dim],
                              "key and value must have the same sequence length", context=shapes())
        if batched:
            b_dim = 0 if self.batch_first else 1
            if not query.shape[b_dim] == key.shape[b_dim] == value.shape[b_dim]:
                raise input_error(_LAYER, "batch size", f"one B for query, key, value (dim {b_dim})",
                                  f"{query.shape[b_dim]}, {key.shape[b_dim]}, {value.shape[b_dim]}",
                                  "pass query, key and value with the same batch size", context=shapes())
        B = query.shape[0 if self.batch_first else 1] if batched else 1
        L, S = query.shape[seq_dim], key.shape[seq_dim]
        if key_padding_mask is not None:
            check_tensor(_LAYER, "key_padding_mask", key_padding_mask)
            check_mask_dtype(_LAYER, "key_padding_mask", key_padding_mask)
            want = [B, S] if batched else [S]
            if list(key_padding_mask.shape) != want:
                raise input_error(_LAYER, "key_padding_mask shape",
                                  f"{shape_str(want)} = {'[B, S]' if batched else '[S] (unbatched)'}",
                                  shape_str(key_padding_mask.shape),
                                  "pass one flag per key (True = ignore that key)", context=shapes())
        if attn_mask is not None:
            check_tensor(_LAYER, "attn_mask", attn_mask)
            check_mask_dtype(_LAYER, "attn_mask", attn_mask)
            ok = [[L, S], [B * self.num_heads, L, S]]
            if list(attn_mask.shape) not in ok:
                raise input_error(_LAYER, "attn_mask shape",
                                  f"{shape_str(ok[0])} = [L, S] or {shape_str(ok[1])} = [B·num_heads, L, S]",
                                  shape_str(attn_mask.shape),
                                  "build a 2-D mask shared by all, or a 3-D one with index b·num_heads + h",
                                  context=shapes())
        return batched

    # ---- weights to and from torch.nn (from_torch / to_torch: TorchTwin) ---------------------

    _torch_cls = nn.MultiheadAttention

    @staticmethod
    def _config_of(m: nn.Module) -> dict:
        """Constructor arguments read from ours or from torch's (the attribute names agree)."""
        return {"embed_dim": m.embed_dim, "num_heads": m.num_heads, "dropout": m.dropout,
                "bias": m.in_proj_bias is not None, "add_bias_kv": m.bias_k is not None,
                "add_zero_attn": m.add_zero_attn, "kdim": m.kdim, "vdim": m.vdim,
                "batch_first": m.batch_first}
