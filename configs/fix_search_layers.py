"""A broken causal TCN for the README's fix-search example (``configs/tcn_chomp.yaml``).

Each block pads its conv by 2 on both sides and should cut the 2 extra steps off the *time* axis
(``x[:, :, :-2]``); ``Chomp`` here cuts them off the channels (``x[:, :-2]``). Resizing the next
conv to the 30 channels it gets also runs: it keeps the padded steps, and its last step reads
padding. The fix search finds the slice.
"""

import torch
import torch.nn as nn


class Chomp(nn.Module):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x):
        return x[:, :-self.k]


class CausalTCN(nn.Module):
    def __init__(self, channels: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.c1, self.ch1 = nn.Conv1d(8, channels, 3, padding=2), Chomp(2)
        self.c2, self.ch2 = nn.Conv1d(channels, channels, 3, padding=2), Chomp(2)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        h = torch.relu(self.ch1(self.c1(x)))
        h = torch.relu(self.ch2(self.c2(h)))
        return self.head(h[:, :, -1])
