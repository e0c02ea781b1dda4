"""Models at real sizes for the DDP check, at module level so the ranks can import them.

:func:`resnet50_like`: ResNet-50's layout (bottlenecks 3-4-6-3, widths 64…2048, 25.6M parameters,
161 parameters + 159 BatchNorm buffers) built from torch.nn by hand (no torchvision).
:func:`lm_loss`: the next-token cross-entropy a causal language model trains on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return F.relu(self.bn3(self.conv3(h)) + self.down(x))


def resnet50_like(classes: int = 1000) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def lm_loss(output, inputs) -> torch.Tensor:
    """Next-token cross-entropy, a mean over the rank's tokens (equal on every rank)."""
    logits, ids = output.logits, inputs["input_ids"]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def logsumexp_loss(output, inputs) -> torch.Tensor:
    """A per-sample mean every logit reaches (a classifier's loss without labels)."""
    return output.logsumexp(-1).mean()
