"""layerlab's reference layers: hand-written, debuggable, each equal to its torch.nn counterpart.

Names are imported lazily (on first attribute access), so ``import layerlab.layers`` stays cheap
and one group's import error does not hide another's. Add a layer by adding its name here.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module (relative to this package) that defines it
_LAZY = {
    # spatial
    "Conv1d": "conv", "Conv2d": "conv", "Conv3d": "conv",
    "Im2colConv2d": "im2col",
    "SeparableConv2d": "separable",
    "MaxPool1d": "pool", "MaxPool2d": "pool", "AvgPool1d": "pool", "AvgPool2d": "pool",
    "AdaptiveAvgPool1d": "adaptive", "AdaptiveAvgPool2d": "adaptive",
    "AdaptiveMaxPool1d": "adaptive", "AdaptiveMaxPool2d": "adaptive", "SoftAdaptivePool2d": "adaptive",
    "Linear": "linear",
    "PatchEmbedding": "patch",
    "LayerInputError": "_checks",
    # sequence layers
    "RNNCell": "cells", "LSTMCell": "cells", "GRUCell": "cells",
    "RNN": "recurrent", "LSTM": "recurrent", "GRU": "recurrent",
    "ScaledDotProductAttention": "attention", "TorchScaledDotProductAttention": "attention",
    "scaled_dot_product_attention": "attention", "attention_with_weights": "attention", "causal_mask": "attention",
    "MultiheadAttention": "multihead",
    "TransformerEncoderLayer": "transformer",
    "SinusoidalPositionalEncoding": "positional", "LearnedPositionalEmbedding": "positional",
    "sinusoidal_encoding": "positional",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layerlab.layers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"layerlab.layers.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
