r"""A Transformer encoder block (self-attention + feed-forward), equal to nn.TransformerEncoderLayer.

Post-LN (``norm_first=False``, the original paper and torch's default)::

    x = norm1(x + dropout1(self_attn(x)))
    x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))

Pre-LN (``norm_first=True``, GPT-2 and most modern models; trains more stably when deep)::

    x = x + dropout1(self_attn(norm1(x)))
    x = x + dropout2(linear2(dropout(activation(linear1(norm2(x))))))

The three dropouts sit exactly where torch puts them: on the attention output before the
residual add (``dropout1``), inside the feed-forward after the activation (``dropout``), and on
the feed-forward output before the residual add (``dropout2``); the attention weights are also
dropped out inside ``self_attn``.

Submodule names equal torch's (``self_attn``, ``linear1``, ``dropout``, ``linear2``, ``norm1``,
``norm2``, ``dropout1``, ``dropout2``), so state_dicts load either way. ``self_attn`` is
layerlab's :class:`~layerlab.layers.multihead.MultiheadAttention`; the linears and norms are
torch.nn's.

Dimension letters used in this module:

    B   batch size (absent for unbatched input)
    T   sequence length
    D   d_model, the features of every token
    F   dim_feedforward, the hidden features of the feed-forward network

Note: in eval mode torch's layer may take a fused "fast path"
(``torch._transformer_encoder_layer_fwd``); it computes the same function, so parity holds in
both modes (tests compare eval mode, and train mode with dropout 0).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._seq_checks import (
    TorchTwin,
    check_dim,
    check_tensor,
    input_error,
    one_of,
    positive_int,
    quiet_when_tracing,
    shape_str,
)
from layerlab.layers.multihead import MultiheadAttention

__all__ = ["TransformerEncoderLayer"]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(TorchTwin, nn.Module):
    r"""One Transformer encoder block: multi-head self-attention, then a position-wise MLP.

    Args:
        d_model (int): D, features per token.
        nhead (int): number of attention heads; must divide D.
        dim_feedforward (int, optional): F, hidden features of the MLP. Default: 2048
        dropout (float, optional): probability of all three dropouts and of the attention
            dropout. Default: 0.1
        activation (str or callable, optional): ``"relu"``, ``"gelu"`` (exact erf form) or a
            tensor → tensor function. Default: ``"relu"``
        layer_norm_eps (float, optional): ε of both layer norms. Default: 1e-5
        batch_first (bool, optional): input/output are :math:`(B, T, D)` instead of
            :math:`(T, B, D)`. Default: ``False``
        norm_first (bool, optional): pre-LN (norm before each sub-block) instead of post-LN.
            Default: ``False``
        bias (bool, optional): biases in the linears, the attention and the layer norms.
            Default: ``True``

    Forward args:
        src (Tensor): the sequence, see Shape.
        src_mask (Tensor, optional): attention mask, as ``attn_mask`` of
            :class:`~layerlab.layers.multihead.MultiheadAttention`: **bool True = NOT allowed**,
            or float added to the scores. Default: ``None``
        src_key_padding_mask (Tensor, optional): per-sequence padding, True = ignore that key.
            Default: ``None``
        is_causal (bool, optional): ``src_mask`` is causal (a hint, as in torch); without
            ``src_mask`` the causal mask is built. Default: ``False``

    Shape:
        - src: :math:`(T, B, D)`, :math:`(B, T, D)` with ``batch_first``, or :math:`(T, D)` (unbatched)
        - src_mask: :math:`(T, T)` or :math:`(B \cdot nhead, T, T)`
        - src_key_padding_mask: :math:`(B, T)` or :math:`(T)`
        - output: shaped like src

        where:
            T = sequence length, B = batch size, D = d_model, nhead = attention heads

    Attributes:
        self_attn: :class:`~layerlab.layers.multihead.MultiheadAttention` (D, nhead), with its
            initialisation (Xavier-uniform in-projection, zero biases)
        linear1: ``Linear(D, F)``, ``linear2``: ``Linear(F, D)``; torch.nn.Linear's default init
        norm1, norm2: ``LayerNorm(D, eps=layer_norm_eps)``; weight ones, bias zeros
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Union[str, Callable[[Tensor], Tensor]] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        name = "TransformerEncoderLayer"
        if not callable(activation):
            activation = _ACTIVATIONS[one_of(name, "activation", activation, tuple(_ACTIVATIONS))]
        positive_int(name, "dim_feedforward", dim_feedforward)
        factory = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            **factory)
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = activation

    @property
    def batch_first(self) -> bool:
        return self.self_attn.batch_first

    def forward(self, src: Tensor, src_mask: Optional[Tensor] = None, src_key_padding_mask: Optional[Tensor] = None,
                is_causal: bool = False) -> Tensor:
        self._check(src)
        x = src  # (B, T, D) or (T, B, D) or (T, D)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor],
                  is_causal: bool) -> Tensor:
        """Self-attention sub-block, then ``dropout1`` (before the residual add)."""
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        """Feed-forward sub-block: D → F → activation → dropout → D, then ``dropout2``."""
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))  # (…, F) inside, (…, D) out
        return self.dropout2(x)

    @quiet_when_tracing
    def _check(self, src: Tensor) -> None:
        name = "TransformerEncoderLayer"
        check_tensor(name, "src", src)
        layout = "[B, T, D] (batch_first=True)" if self.batch_first else "[T, B, D] (batch_first=False)"
        check_dim(name, "src", src, (2, 3), f"3-D {layout} or 2-D [T, D] (unbatched)")
        D = self.linear1.in_features
        if src.shape[-1] != D:
            raise input_error(name, "d_model", D, src.shape[-1],
                              f"give src {D} features in its last dim, or build the layer with d_model={src.shape[-1]}",
                              context=f"src shape {shape_str(src.shape)}")

    def extra_repr(self) -> str:
        parts = [f"norm_first={self.norm_first}"]
        act = {F.relu: "relu", F.gelu: "gelu"}.get(self.activation, getattr(self.activation, "__name__", "custom"))
        return ", ".join(parts + [f"activation={act}"])

    # ---- weights to and from torch.nn (from_torch / to_torch: TorchTwin) ---------------------

    _torch_cls = nn.TransformerEncoderLayer

    @staticmethod
    def _config_of(m: nn.Module) -> dict:
        """Constructor arguments read back from ours or torch's (both have the same submodules)."""
        act = m.activation
        if act is F.relu or isinstance(act, nn.ReLU):
            act = "relu"
        elif act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
            act = "gelu"
        return {"d_model": m.linear1.in_features, "nhead": m.self_attn.num_heads,
                "dim_feedforward": m.linear1.out_features, "dropout": m.dropout.p, "activation": act,
                "layer_norm_eps": m.norm1.eps, "batch_first": m.self_attn.batch_first, "norm_first": m.norm_first,
                "bias": m.linear1.bias is not None}
