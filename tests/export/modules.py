"""Small layers with known export behaviour (real torch, no mocks), shared by the export tests."""

import math

import torch
from torch import nn


class SignBranch(nn.Module):
    """A data-dependent Python branch: ``if x.sum() > 0`` picks one of two paths."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.linear(x)
        return -self.linear(x)


class PoolWithIndices(nn.Module):
    """Conv, then MaxPool2d(return_indices=True): returns the pooled map and the int64 indices."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2, return_indices=True)

    def forward(self, x):
        return self.pool(self.conv(x))


class LengthScale(nn.Module):
    """Divides by √T with ``math.sqrt``: a trace freezes T silently (no TracerWarning)."""

    batch_first = True

    def forward(self, x):  # (B, T, E)
        return x / math.sqrt(x.shape[1])


class BatchReshape(nn.Module):
    """Reshapes with the batch size as a Python int taken from the example."""

    def forward(self, x):
        return torch.relu(x).reshape(int(x.shape[0]), -1)
