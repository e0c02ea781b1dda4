"""Small models with planted training bugs, for `layerlab train-check` (see configs/train_*.yaml)."""

import torch
from torch import nn


def dead_relu_mlp(in_features: int = 16, hidden: int = 32, out_features: int = 4, bias: float = -100.0) -> nn.Module:
    """Linear → ReLU → Linear whose first bias is so negative that every ReLU output is 0 (dead)."""
    model = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))
    with torch.no_grad():
        model[0].bias.fill_(bias)
    return model


class TwoHeads(nn.Module):
    """Returns (logits, aux): a spec whose loss reads output 1 leaves `head` untrained."""

    def __init__(self, in_features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.trunk = nn.Linear(in_features, hidden)
        self.head = nn.Linear(hidden, classes)
        self.aux = nn.Linear(hidden, classes)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return self.head(h), self.aux(h)
