"""Models made by factories, the way model zoos hand them out (import with --allow-import).

``make_mlp`` is a function that returns a module (as ``torchvision.models.resnet18`` is);
``TinyMLP.from_sizes`` is a classmethod that does (as ``AutoModel.from_config`` is).
"""

from typing import Sequence

import torch.nn as nn


class TinyMLP(nn.Sequential):
    """Linear → GELU → … → Linear over the last dimension: x (N, sizes[0]) → (N, sizes[-1])."""

    @classmethod
    def from_sizes(cls, sizes: Sequence[int], dropout: float = 0.0) -> "TinyMLP":
        layers = []
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(sizes) - 2:  # no activation after the last projection
                layers += [nn.GELU(), nn.Dropout(dropout)]
        return cls(*layers)


def make_mlp(in_features: int, hidden: int, out_features: int, depth: int = 2, dropout: float = 0.0) -> nn.Module:
    """A factory: ``depth`` hidden layers of width ``hidden``."""
    return TinyMLP.from_sizes([in_features] + [hidden] * depth + [out_features], dropout=dropout)
