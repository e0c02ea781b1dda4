"""Near misses of the round-8 failure-blame rules (tests in :mod:`tests.probe.test_rule_near_misses_round8`).

Every builder returns ``(model, inputs)``; ``fixed=True`` gives the hand-fixed twin (the right fix
written by hand in its forward or its layer sizes, same parameter names, same inputs). Each raises
the torch error a round-8 rule was written for, with another right fix."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class CTCTimeFirstMaskAxis(nn.Module):
    """Time-first GRU (T, N, C) already; the lengths summed the mask over the batch axis (T entries)."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.rnn = nn.GRU(12, 16)  # time-first: (T, N, H)
        self.out = nn.Linear(16, 6)

    def forward(self, feats, mask, targets, tgt_lens):
        h, _ = self.rnn(feats)
        log_probs = self.out(h).log_softmax(-1)  # (T, N, C): right already
        in_lens = mask.sum(0) if self.fixed else mask.sum(1)  # mask (T, N): per-sample = sum over T
        return F.ctc_loss(log_probs, targets, in_lens, tgt_lens)


def ctc_time_first_mask_axis(fixed=False):
    T, N = 6, 4
    mask = torch.ones(T, N, dtype=torch.long)
    mask[5:, 1] = 0
    mask[4:, 3] = 0
    g = torch.Generator().manual_seed(0)
    return CTCTimeFirstMaskAxis(fixed), (torch.randn(T, N, 12), mask, torch.randint(1, 6, (N, 2), generator=g),
                                         torch.full((N,), 2, dtype=torch.long))


class CTCTimeFirstFlatTargets(nn.Module):
    """Like above with 1-D concatenated targets: only target_lengths tells the batch."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.out = nn.Linear(12, 6)

    def forward(self, feats, mask, targets, tgt_lens):
        log_probs = self.out(feats).log_softmax(-1)  # feats (T, N, F)
        in_lens = mask.sum(0) if self.fixed else mask.sum(1)
        return F.ctc_loss(log_probs, targets, in_lens, tgt_lens)


def ctc_time_first_flat_targets(fixed=False):
    T, N = 6, 4
    mask = torch.ones(T, N, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    return CTCTimeFirstFlatTargets(fixed), (torch.randn(T, N, 12), mask, torch.randint(1, 6, (N * 2,), generator=g),
                                            torch.full((N,), 2, dtype=torch.long))


class LatentWithCritic(nn.Module):
    """Latent 4 (mu is right, logvar built 32 wide); a critic on h (in_features 32) is used by another method."""

    def __init__(self, fixed=False):
        super().__init__()
        self.mu = nn.Linear(32, 4)
        self.logvar = nn.Linear(32, 4 if fixed else 32)
        self.critic = nn.Linear(32, 1)

    def score(self, h):
        return self.critic(h)

    def forward(self, h):
        mu, logvar = self.mu(h), self.logvar(h)
        return mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)


def latent_with_critic(fixed=False):
    return LatentWithCritic(fixed), (torch.randn(5, 32),)


class CVAEConditioned(nn.Module):
    """Conditional VAE: latent 4 (logvar built 8 wide); the cond projection (in 8) runs after, the decoder takes 4+6."""

    def __init__(self, fixed=False):
        super().__init__()
        self.enc = nn.Linear(20, 16)
        self.mu = nn.Linear(16, 4)
        self.logvar = nn.Linear(16, 4 if fixed else 8)
        self.cond = nn.Linear(8, 6)
        self.dec = nn.Linear(4 + 6, 20)

    def forward(self, x, c):
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(torch.cat([z, self.cond(c)], dim=-1))


def cvae_conditioned(fixed=False):
    return CVAEConditioned(fixed), (torch.randn(5, 20), torch.randn(5, 8))


class BagSlicedOffsets(nn.Module):
    """A mini-batch cut from a big flat list: ids sliced, offsets still global (starts + 2)."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.bag = nn.EmbeddingBag(50, 8, mode="sum")

    def forward(self, ids, offsets):
        return self.bag(ids, offsets - offsets[0] if self.fixed else offsets)


def bag_sliced_offsets(fixed=False):
    return BagSlicedOffsets(fixed), (torch.arange(9) % 50, torch.tensor([2, 3, 4]))


class FlatChannelsLast(nn.Module):
    """A flat HWC image (numpy order) into Conv2d(3, …): view(-1, 3, 4, 4) would run, scrambling pixels."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        if self.fixed:
            x = x.view(-1, 4, 4, 3).permute(0, 3, 1, 2)
        return self.conv(x)


def flat_channels_last(fixed=False):
    return FlatChannelsLast(fixed), (torch.randn(2, 48),)


class FlatSpectrogram(nn.Module):
    """A flat (N, 64) mel patch of 4 mels × 16 frames into Conv2d(1, …): the 8×8 guess runs on the wrong grid."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv2d(1, 2, (2, 3))

    def forward(self, x):
        if self.fixed:
            x = x.view(-1, 1, 4, 16)
        return self.conv(x).flatten(1)


def flat_spectrogram(fixed=False):
    return FlatSpectrogram(fixed), (torch.randn(2, 64),)


class LeafFromBoth(nn.Module):
    """The flag is set on a tensor made from the input *and* a parameter: detaching the input is not enough."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        if self.fixed:
            h = h.detach()
        h.requires_grad = True
        return h * 2


def leaf_from_both(fixed=False):
    return LeafFromBoth(fixed), (torch.randn(3, 4),)


class WindowsStrideTwo(nn.Module):
    """unfold(1, 4, 2): half-overlap by design; the head was sized for 32 samples, not 48."""

    def __init__(self, fixed=False):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.head = nn.Linear((23 if fixed else 7) * 8, 3)

    def forward(self, x):
        return self.head(self.embed(x.unfold(1, 4, 2)).flatten(1))


def windows_stride_two(fixed=False):
    return WindowsStrideTwo(fixed), (torch.randn(3, 48),)


CASES = {f.__name__: f for f in (ctc_time_first_mask_axis, ctc_time_first_flat_targets, latent_with_critic,
                                 cvae_conditioned, bag_sliced_offsets, flat_channels_last, flat_spectrogram,
                                 leaf_from_both, windows_stride_two)}
