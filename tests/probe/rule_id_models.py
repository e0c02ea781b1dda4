"""Small broken models for the rules no corpus case reaches; each returns ``(model, args, kwargs)``.

Each one is checked against plain torch by :mod:`tests.probe.test_rule_ids` (it must raise there)
before layerlab's diagnosis is read.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _g() -> torch.Generator:
    return torch.Generator().manual_seed(0)


class _LstmHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.lstm(x))  # the bug: the LSTM's whole (output, (h_n, c_n))


def tuple_into_linear():
    torch.manual_seed(0)
    return _LstmHead(), (torch.randn(2, 5, 8, generator=_g()),), {}


def input_on_meta():
    """Parameters on the CPU, the input on the meta device: two devices without a GPU."""
    return nn.Linear(4, 2), (torch.randn(3, 4, device="meta"),), {}


def conv3d_frames_first():
    torch.manual_seed(0)
    return nn.Conv3d(3, 8, 3, padding=1), (torch.randn(2, 6, 3, 8, 8, generator=_g()),), {}


def transformer_integer_mask():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    pad = torch.zeros(2, 6, dtype=torch.int64)
    pad[0, 4:] = 1  # the bug: an int64 padding mask (1 = padding) where a bool one goes
    return model, (torch.randn(2, 6, 16, generator=_g()),), {"src_key_padding_mask": pad}


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 64)
        self.unflatten = nn.Unflatten(1, (4, 4, 4))  # takes 64 …

    def forward(self, z):
        return self.unflatten(self.fc(z)[:, :48])  # … and gets 48


def unflatten_wrong_size():
    torch.manual_seed(0)
    return _Decoder(), (torch.randn(2, 8, generator=_g()),), {}


class _FloatTargetLoss(nn.Module):
    def __init__(self, functional: bool):
        super().__init__()
        self.fc, self.functional, self.loss = nn.Linear(8, 5), functional, nn.CrossEntropyLoss()

    def forward(self, x, target):
        logits = self.fc(x)
        return F.nll_loss(logits.log_softmax(-1), target) if self.functional else self.loss(logits, target)


def float_class_target_op():
    torch.manual_seed(0)
    return _FloatTargetLoss(True), (torch.randn(4, 8, generator=_g()), torch.tensor([0., 3., 1., 4.])), {}


def float_class_target_module():
    torch.manual_seed(0)
    return _FloatTargetLoss(False), (torch.randn(4, 8, generator=_g()), torch.tensor([0., 3., 1., 4.])), {}


class _SegLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.loss = nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.CrossEntropyLoss()

    def forward(self, x, mask):
        return self.loss(self.conv(x), mask)  # logits at H/2 × W/2 against a full-size mask


def target_shape_module():
    torch.manual_seed(0)
    g = _g()
    return _SegLoss(), (torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 4, (2, 16, 16), generator=g)), {}


class _Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.rnn = nn.Embedding(20, 8), nn.GRU(8, 16, batch_first=True)
        self.head, self.loss = nn.Linear(16, 5), nn.CrossEntropyLoss()

    def forward(self, ids, labels):
        out, _ = self.rnn(self.emb(ids))
        return self.loss(self.head(out), labels)  # (N, T, C) logits for one label per sequence


def per_step_logits_module():
    torch.manual_seed(0)
    g = _g()
    return _Tagger(), (torch.randint(0, 20, (3, 6), generator=g), torch.randint(0, 5, (3,), generator=g)), {}


def pool_padding_over_half_kernel():
    return nn.MaxPool2d(2, padding=2), (torch.randn(1, 3, 6, 6, generator=_g()),), {}


CASES = {f.__name__: f for f in (tuple_into_linear, input_on_meta, conv3d_frames_first, transformer_integer_mask,
                                  unflatten_wrong_size, float_class_target_op, float_class_target_module,
                                  target_shape_module, per_step_logits_module, pool_padding_over_half_kernel)}
