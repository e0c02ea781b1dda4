"""Registry entries of the sequence reference layers (static data; importing this never imports torch).

Each entry's ``reference`` is the ``torch.nn`` class its ``from_torch``/``to_torch`` convert to;
parameter names are torch's, so weights align by name. Notes:

* ``scaled_dot_product_attention``: torch.nn has no module for it; the reference is a thin
  module around ``F.scaled_dot_product_attention`` (``TorchScaledDotProductAttention``).
  Its bool masks mean True = may attend; ``multihead_attention``'s mean True = NOT allowed.
  The default ``{"causal": T}`` masks are float (0 / −inf), which both read the same way.
* ``sinusoidal_positional_encoding`` has no torch counterpart (tests use an independent loop);
  ``learned_positional_embedding``'s table converts to an ``nn.Embedding`` (``to_torch()``),
  but that takes position ids, not embeddings, so neither has a registry reference.
* Recurrent states keep torch's layout ``[num_layers·D, B, H]`` even with ``batch_first``.
"""

from __future__ import annotations

from typing import List

from layerlab.registry_types import LayerEntry

_CELL_ARGS = {"input_size": 8, "hidden_size": 16}
_CELL_INPUTS = {"input": {"shape": [4, 8]}}
_RNN_ARGS = {"input_size": 8, "hidden_size": 16, "num_layers": 2, "batch_first": True}
_SEQ_INPUTS = {"input": {"shape": [4, 7, 8]}}  # (B, T, I) with batch_first
_ATTN_INPUTS = {  # self-attention over (B, T, E) with a causal float mask
    "query": {"shape": [2, 10, 16]}, "key": {"same_as": "query"}, "value": {"same_as": "query"},
    "attn_mask": {"causal": 10},
}

ENTRIES: List[LayerEntry] = [
    LayerEntry(
        name="rnn_cell", target="layerlab.layers.cells:RNNCell", reference="torch.nn:RNNCell",
        args=_CELL_ARGS, inputs=_CELL_INPUTS,
        summary="one Elman RNN step h' = tanh(W_ih x + b_ih + W_hh h + b_hh)",
        tags=("recurrent",),
    ),
    LayerEntry(
        name="lstm_cell", target="layerlab.layers.cells:LSTMCell", reference="torch.nn:LSTMCell",
        args=_CELL_ARGS, inputs=_CELL_INPUTS,
        summary="one LSTM step; gates i, f, g, o stacked in torch's order in one matmul",
        tags=("recurrent",),
    ),
    LayerEntry(
        name="gru_cell", target="layerlab.layers.cells:GRUCell", reference="torch.nn:GRUCell",
        args=_CELL_ARGS, inputs=_CELL_INPUTS,
        summary="one GRU step; gates r, z, n with r ⊙ (W_hn h + b_hn) as torch places it",
        tags=("recurrent",),
    ),
    LayerEntry(
        name="rnn", target="layerlab.layers.recurrent:RNN", reference="torch.nn:RNN",
        args=_RNN_ARGS, inputs=_SEQ_INPUTS,
        summary="multi-layer Elman RNN as a Python time loop; h0 stays [num_layers·D, B, H] with batch_first",
        tags=("recurrent", "causal"),
    ),
    LayerEntry(
        name="lstm", target="layerlab.layers.recurrent:LSTM", reference="torch.nn:LSTM",
        args=_RNN_ARGS, inputs=_SEQ_INPUTS,
        summary="multi-layer LSTM: input projection for all steps at once, then one matmul per step",
        tags=("recurrent", "causal"),
    ),
    LayerEntry(
        name="gru", target="layerlab.layers.recurrent:GRU", reference="torch.nn:GRU",
        args=_RNN_ARGS, inputs=_SEQ_INPUTS,
        summary="multi-layer GRU with torch's gate order and reset-gate placement",
        tags=("recurrent", "causal"),
    ),
    LayerEntry(
        name="scaled_dot_product_attention", target="layerlab.layers.attention:ScaledDotProductAttention",
        reference="layerlab.layers.attention:TorchScaledDotProductAttention",
        args={}, inputs={
            "query": {"shape": [2, 4, 10, 8]}, "key": {"same_as": "query"}, "value": {"same_as": "query"},
            "attn_mask": {"causal": 10},
        },
        summary="matmul → scale → mask → softmax → dropout → matmul; bool mask True = may attend",
        tags=("causal",),
    ),
    LayerEntry(
        name="multihead_attention", target="layerlab.layers.multihead:MultiheadAttention",
        reference="torch.nn:MultiheadAttention",
        args={"embed_dim": 16, "num_heads": 4, "batch_first": True}, inputs=_ATTN_INPUTS,
        summary="nn.MultiheadAttention written out; bool masks True = NOT allowed; weights in last_attn_weights",
        tags=("causal",),
    ),
    LayerEntry(
        name="transformer_encoder_layer", target="layerlab.layers.transformer:TransformerEncoderLayer",
        reference="torch.nn:TransformerEncoderLayer",
        args={"d_model": 16, "nhead": 4, "dim_feedforward": 32, "dropout": 0.1, "batch_first": True},
        inputs={"src": {"shape": [2, 10, 16]}},
        summary="self-attention + MLP block, post-LN or pre-LN (norm_first), dropouts where torch puts them",
        tags=("stochastic",),
    ),
    LayerEntry(
        name="sinusoidal_positional_encoding", target="layerlab.layers.positional:SinusoidalPositionalEncoding",
        reference=None,
        args={"embed_dim": 16, "max_len": 64, "batch_first": True}, inputs={"input": {"shape": [2, 10, 16]}},
        summary="adds sin(pos / 10000^(2i/D)), cos(…) per feature pair; buffer extends for longer inputs",
        tags=("causal",),
    ),
    LayerEntry(
        name="learned_positional_embedding", target="layerlab.layers.positional:LearnedPositionalEmbedding",
        reference=None,
        args={"max_len": 64, "embed_dim": 16, "batch_first": True}, inputs={"input": {"shape": [2, 10, 16]}},
        summary="adds a learned vector per position (an nn.Embedding table indexed by position)",
        tags=("causal",),
    ),
]
