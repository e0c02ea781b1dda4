"""Stock torch.nn module configurations with inputs: a corpus of layers nobody here wrote.

Every entry is correct by construction (it is torch's own module), so any "fail" that
``layerlab.verify`` gives on it is a false alarm. ``tests/checks/test_false_positive_sweep.py``
runs them all in train and eval, with and without a reference.

Each entry: ``(id, build, inputs, kwargs, verify_kwargs)``; ``build()`` returns a fresh module,
``inputs()`` fresh tensors. Letters: B batch · C channels · L length · T time · E features.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

Entry = Tuple[str, Callable[[], nn.Module], Callable[[], tuple], Dict[str, Any], Dict[str, Any]]


def _r(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape)


def _e(id_: str, build: Callable[[], nn.Module], *shapes: Any, kwargs: Dict[str, Any] = None,
       verify: Dict[str, Any] = None) -> Entry:
    def inputs() -> tuple:
        torch.manual_seed(1)
        return tuple(s() if callable(s) else torch.randn(*s) for s in shapes)

    return (id_, build, inputs, kwargs or {}, verify or {})


def _causal(T: int) -> torch.Tensor:
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


def _padding(B: int, T: int) -> Callable[[], torch.Tensor]:
    def make() -> torch.Tensor:
        m = torch.zeros(B, T, dtype=torch.bool)
        m[0, -2:] = True  # the first sample's last two positions are padding
        return m
    return make


ENTRIES: List[Entry] = [
    # -- linear and friends
    _e("Linear", lambda: nn.Linear(6, 4), (3, 6)),
    _e("Linear-nobias", lambda: nn.Linear(6, 4, bias=False), (3, 5, 6)),
    _e("Bilinear", lambda: nn.Bilinear(4, 5, 3), (3, 4), (3, 5)),
    _e("Identity", lambda: nn.Identity(), (3, 4)),
    _e("Embedding", lambda: nn.Embedding(10, 4), lambda: torch.randint(0, 10, (3, 5))),
    _e("Embedding-padding_idx", lambda: nn.Embedding(10, 4, padding_idx=0), lambda: torch.randint(0, 10, (3, 5))),
    _e("EmbeddingBag", lambda: nn.EmbeddingBag(10, 4, mode="mean"), lambda: torch.randint(0, 10, (3, 5))),
    _e("Flatten", lambda: nn.Flatten(), (3, 2, 4)),
    _e("Unflatten", lambda: nn.Unflatten(1, (2, 3)), (3, 6)),
    # -- convolutions
    _e("Conv1d", lambda: nn.Conv1d(3, 4, 3, padding=1), (2, 3, 9)),
    _e("Conv1d-stride-dil", lambda: nn.Conv1d(3, 4, 3, stride=2, dilation=2), (2, 3, 11)),
    _e("Conv1d-reflect", lambda: nn.Conv1d(3, 4, 3, padding=1, padding_mode="reflect"), (2, 3, 9)),
    _e("Conv1d-groups", lambda: nn.Conv1d(4, 4, 3, groups=4, padding="same"), (2, 4, 8)),
    _e("Conv2d", lambda: nn.Conv2d(3, 4, 3, padding=1), (2, 3, 6, 6)),
    _e("Conv2d-circular", lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular"), (2, 2, 5, 5)),
    _e("Conv3d", lambda: nn.Conv3d(2, 3, 2), (2, 2, 4, 4, 4)),
    _e("ConvTranspose1d", lambda: nn.ConvTranspose1d(3, 2, 3, stride=2, output_padding=1), (2, 3, 5)),
    _e("ConvTranspose2d", lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1), (2, 3, 4, 4)),
    _e("Conv2d-unbatched", lambda: nn.Conv2d(3, 4, 3), (3, 6, 6)),
    # -- pooling
    _e("MaxPool1d", lambda: nn.MaxPool1d(2), (2, 3, 8)),
    _e("MaxPool2d-ceil", lambda: nn.MaxPool2d(3, stride=2, ceil_mode=True), (2, 3, 7, 7)),
    _e("AvgPool2d", lambda: nn.AvgPool2d(2, padding=1, count_include_pad=False), (2, 3, 6, 6)),
    _e("AdaptiveAvgPool2d", lambda: nn.AdaptiveAvgPool2d((2, 3)), (2, 3, 7, 8)),
    _e("AdaptiveMaxPool1d", lambda: nn.AdaptiveMaxPool1d(3), (2, 3, 8)),
    _e("LPPool2d-int", lambda: nn.LPPool2d(2, 2), (2, 3, 6, 6)),
    _e("PixelShuffle", lambda: nn.PixelShuffle(2), (2, 8, 3, 3)),
    _e("Upsample-bilinear", lambda: nn.Upsample(scale_factor=2, mode="bilinear"), (2, 3, 4, 4)),
    # -- normalisation
    _e("BatchNorm1d", lambda: nn.BatchNorm1d(4), (5, 4)),
    _e("BatchNorm1d-seq", lambda: nn.BatchNorm1d(4), (5, 4, 6)),
    _e("BatchNorm2d", lambda: nn.BatchNorm2d(3), (4, 3, 5, 5)),
    _e("InstanceNorm1d-affine", lambda: nn.InstanceNorm1d(3, affine=True), (2, 3, 8)),
    _e("GroupNorm", lambda: nn.GroupNorm(2, 4), (3, 4, 5)),
    _e("LayerNorm", lambda: nn.LayerNorm(6), (3, 5, 6)),
    _e("LayerNorm-2d", lambda: nn.LayerNorm([5, 6], elementwise_affine=False), (3, 5, 6)),
    _e("RMSNorm", lambda: nn.RMSNorm(6), (3, 5, 6)),
    _e("LocalResponseNorm", lambda: nn.LocalResponseNorm(2), (2, 4, 5, 5)),
    # -- activations
    _e("ReLU", lambda: nn.ReLU(), (3, 7)),
    _e("GELU-tanh", lambda: nn.GELU("tanh"), (3, 7)),
    _e("SiLU", lambda: nn.SiLU(), (3, 7)),
    _e("Softmax", lambda: nn.Softmax(dim=-1), (3, 7)),
    _e("LogSoftmax", lambda: nn.LogSoftmax(dim=1), (3, 7)),
    _e("Softmax2d", lambda: nn.Softmax2d(), (2, 3, 4, 4)),
    _e("PReLU", lambda: nn.PReLU(3), (2, 3, 5)),
    _e("GLU", lambda: nn.GLU(), (3, 8)),
    _e("Hardswish", lambda: nn.Hardswish(), (3, 7)),
    _e("Threshold", lambda: nn.Threshold(0.1, 20.0), (3, 7)),
    # -- dropout (train mode draws random numbers)
    _e("Dropout", lambda: nn.Dropout(0.2), (3, 7)),
    _e("Dropout2d", lambda: nn.Dropout2d(0.2), (2, 3, 4, 4)),
    # -- recurrent, with and without a state
    _e("RNN", lambda: nn.RNN(4, 5, batch_first=True), (3, 6, 4)),
    _e("RNN-relu-2layer", lambda: nn.RNN(4, 5, num_layers=2, nonlinearity="relu"), (6, 3, 4)),
    _e("LSTM", lambda: nn.LSTM(4, 5, batch_first=True), (3, 6, 4)),
    _e("LSTM-2layer-bidir", lambda: nn.LSTM(4, 5, num_layers=2, bidirectional=True), (6, 3, 4)),
    _e("LSTM-proj", lambda: nn.LSTM(4, 6, proj_size=3, batch_first=True), (3, 6, 4)),
    _e("GRU-hx", lambda: nn.GRU(4, 5, batch_first=True), (3, 6, 4), (1, 3, 5)),
    _e("RNNCell", lambda: nn.RNNCell(4, 5), (3, 4)),
    _e("RNNCell-hx", lambda: nn.RNNCell(4, 5), (3, 4), (3, 5)),
    _e("LSTMCell", lambda: nn.LSTMCell(4, 5), (3, 4)),
    _e("GRUCell", lambda: nn.GRUCell(4, 5), (3, 4)),
    _e("GRUCell-hx", lambda: nn.GRUCell(4, 5), (3, 4), (3, 5)),
    # -- attention and transformers
    _e("MultiheadAttention-self", lambda: nn.MultiheadAttention(8, 2, batch_first=True), (3, 5, 8), (3, 5, 8), (3, 5, 8)),
    _e("MultiheadAttention-causal", lambda: nn.MultiheadAttention(8, 2, batch_first=True), (3, 5, 8), (3, 5, 8),
       (3, 5, 8), kwargs={"attn_mask": _causal(5)}),
    _e("MultiheadAttention-padding", lambda: nn.MultiheadAttention(8, 2, batch_first=True), (3, 5, 8), (3, 5, 8),
       (3, 5, 8), kwargs={"key_padding_mask": _padding(3, 5)()}),
    _e("MultiheadAttention-kdim", lambda: nn.MultiheadAttention(8, 2, kdim=6, vdim=4), (5, 3, 8), (7, 3, 6), (7, 3, 4)),
    _e("TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
       (3, 5, 8)),
    _e("TransformerEncoderLayer-causal", lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=True),
       (3, 5, 8), kwargs={"src_mask": _causal(5), "is_causal": True}),
    _e("TransformerDecoderLayer", lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0), (5, 3, 8), (4, 3, 8)),
    _e("TransformerEncoder-padding", lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2, enable_nested_tensor=False),
       (3, 5, 8), kwargs={"src_key_padding_mask": _padding(3, 5)()}),
    _e("Transformer", lambda: nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True), (3, 5, 8), (3, 4, 8),
       kwargs={"tgt_mask": _causal(4)}),
    # -- containers and small models
    _e("Sequential-MLP", lambda: nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), (4, 6)),
    _e("Sequential-CNN", lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                               nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 5)), (4, 3, 6, 6)),
    _e("Sequential-conv-bias-bn", lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), nn.GELU()), (4, 3, 8)),
    _e("ChannelShuffle", lambda: nn.ChannelShuffle(2), (2, 4, 3, 3)),
    _e("ZeroPad2d", lambda: nn.ZeroPad2d((1, 2, 0, 1)), (2, 3, 4, 4)),
    _e("CosineSimilarity", lambda: nn.CosineSimilarity(dim=1), (3, 5), (3, 5)),
    _e("PairwiseDistance", lambda: nn.PairwiseDistance(), (3, 5), (3, 5)),
    # -- losses (targets are not differentiated)
    _e("MSELoss", lambda: nn.MSELoss(), (3, 4), (3, 4)),
    _e("CrossEntropyLoss", lambda: nn.CrossEntropyLoss(), (3, 5), lambda: torch.tensor([0, 4, 2])),
    _e("BCELoss", lambda: nn.BCELoss(), lambda: torch.rand(3, 4) * 0.8 + 0.1,
       lambda: torch.randint(0, 2, (3, 4)).float()),
    _e("BCEWithLogitsLoss", lambda: nn.BCEWithLogitsLoss(), (3, 4), lambda: torch.randint(0, 2, (3, 4)).float()),
    _e("SmoothL1Loss", lambda: nn.SmoothL1Loss(), (3, 4), (3, 4)),
    _e("SoftMarginLoss", lambda: nn.SoftMarginLoss(), (3, 4), lambda: torch.randint(0, 2, (3, 4)).float() * 2 - 1),
    _e("PoissonNLLLoss", lambda: nn.PoissonNLLLoss(), (3, 4), lambda: torch.poisson(torch.ones(3, 4))),
    # -- what torch's own test-suite feeds its modules: unbatched calls, lazy shapes, the fast path
    _e("MultiheadAttention-unbatched-padding", lambda: nn.MultiheadAttention(8, 2), (5, 8), (5, 8), (5, 8),
       kwargs={"key_padding_mask": torch.tensor([False, False, False, True, True])}),
    _e("Softmax2d-unbatched", lambda: nn.Softmax2d(), (3, 4, 4)),
    _e("LazyLinear", lambda: nn.LazyLinear(4), (3, 6)),
    _e("LazyConv2d", lambda: nn.LazyConv2d(4, 3), (2, 3, 6, 6)),
    _e("TransformerEncoder-fast-path", lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2, enable_nested_tensor=True),
       (3, 5, 8), kwargs={"src_key_padding_mask": _padding(3, 5)()}),
]
