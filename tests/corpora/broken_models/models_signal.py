"""Broken models and their hand-fixed twins: diffusion UNets, optical flow, capsules, spectral
(FFT) layers and audio.

Twin first (what the author meant, plain torch), then the broken class (a subclass wherever the
same state_dict can load into both). The wrong line carries ``# BUG(case-name)`` (``# ALSO(case-name)``
for a second line that is part of the same fix). Sizes are tiny: the whole corpus runs in seconds.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- diffusion UNets --------------------------------------------------------------------------

def timestep_embedding(t, dim, flatten):
    if flatten:
        t = t.reshape(-1)                                                # (B,) whatever came in
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
    args = t.float()[:, None] * freqs[None]  # ALSO(diffusion_temb_t_shape)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimeResBlockTwin(nn.Module):
    """A DDPM ResBlock; the sampler hands the timesteps over as a (B, 1) column."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 8, 3, padding=1)
        self.temb = nn.Linear(16, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x, t):
        h = F.silu(self.conv1(x))
        h = h + self.temb(timestep_embedding(t, 16, flatten=True))[:, :, None, None]
        return self.conv2(F.silu(h))


class TimeResBlockBroken(TimeResBlockTwin):
    def forward(self, x, t):
        h = F.silu(self.conv1(x))
        emb = timestep_embedding(t, 16, flatten=False)  # BUG(diffusion_temb_t_shape)
        h = h + self.temb(emb)[:, :, None, None]
        return self.conv2(F.silu(h))


class TinyUNetTwin(nn.Module):
    """One down, one up; the upsampled map is brought back to the skip's own size."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.mid = nn.Conv2d(8, 8, 3, padding=1)
        self.up_conv = nn.Conv2d(8 + 4, 4, 3, padding=1)

    def forward(self, x):
        m = F.relu(self.mid(F.relu(self.down(x))))
        u = F.interpolate(m, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.up_conv(torch.cat([u, x], dim=1))


class TinyUNetBroken(TinyUNetTwin):
    def forward(self, x):
        m = F.relu(self.mid(F.relu(self.down(x))))
        u = F.interpolate(m, scale_factor=2, mode="bilinear", align_corners=False)  # BUG(diffusion_upsample_skip_size)
        return self.up_conv(torch.cat([u, x], dim=1))


class CFGConditionTwin(nn.Module):
    """Classifier-free guidance: label -1 means 'dropped' and maps to an extra null row."""

    def __init__(self, n_classes=5, rows=6):
        super().__init__()
        self.n_classes = n_classes
        self.emb = nn.Embedding(rows, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x, y):
        y = torch.where(y < 0, torch.full_like(y, self.n_classes), y)
        return self.proj(x + self.emb(y))


class CFGConditionBroken(CFGConditionTwin):
    def __init__(self):
        super().__init__(rows=5)

    def forward(self, x, y):
        return self.proj(x + self.emb(y))  # BUG(diffusion_null_class_embedding)


# --- optical flow / capsules / hypernetworks --------------------------------------------------

class LocalCorrelationTwin(nn.Module):
    """PWC-Net-style local correlation over a (2r+1)^2 window, built with unfold."""

    def __init__(self, r=1):
        super().__init__()
        self.r = r
        self.feat = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d((2 * r + 1) ** 2, 2, 3, padding=1)

    def window(self, f2, padding):
        return F.unfold(f2, kernel_size=2 * self.r + 1, padding=padding)

    def forward(self, im1, im2):
        f1, f2 = self.feat(im1), self.feat(im2)
        B, C, H, W = f1.shape
        k = 2 * self.r + 1
        f2u = self.window(f2, self.r).view(B, C, k * k, H, W)
        return self.head((f1.unsqueeze(2) * f2u).sum(1) / C)


class LocalCorrelationBroken(LocalCorrelationTwin):
    def forward(self, im1, im2):
        f1, f2 = self.feat(im1), self.feat(im2)
        B, C, H, W = f1.shape
        k = 2 * self.r + 1
        f2u = self.window(f2, 0)  # BUG(optflow_unfold_padding)
        f2u = f2u.view(B, C, k * k, H, W)  # ALSO(optflow_unfold_padding)
        return self.head((f1.unsqueeze(2) * f2u).sum(1) / C)


def squash(s, dim=-1):
    n2 = (s ** 2).sum(dim, keepdim=True)
    return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)


class CapsuleLayerTwin(nn.Module):
    """Dynamic routing between 6 input capsules (dim 5) and 3 output capsules (dim 4)."""

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(0.1 * torch.randn(1, 6, 3, 4, 5))

    def route(self, u_hat):
        b = torch.zeros(u_hat.shape[:3])
        for _ in range(3):
            c = b.softmax(dim=2)
            v = squash((c[..., None] * u_hat).sum(1))                  # (B, 3, 4)
            b = b + (u_hat * v[:, None]).sum(-1)
        return v.norm(dim=-1)

    def forward(self, u):                                                # u (B, 6, 5)
        u_hat = (self.W @ u[:, :, None, :, None]).squeeze(-1)             # (B, 6, 3, 4)
        return self.route(u_hat)


class CapsuleLayerBroken(CapsuleLayerTwin):
    def forward(self, u):
        u_hat = (self.W @ u[:, :, None, :]).squeeze(-1)  # BUG(capsule_u_hat_unsqueeze)
        return self.route(u_hat)


# --- spectral layers and audio ----------------------------------------------------------------

class GlobalFilterTwin(nn.Module):
    """GFNet global filter: a learned complex filter on rfft2's (H, W//2 + 1) half-spectrum."""

    def __init__(self, c=4, h=8, w=8 // 2 + 1):
        super().__init__()
        self.weight = nn.Parameter(0.02 * torch.randn(c, h, w, 2))
        self.mlp = nn.Conv2d(c, c, 1)

    def forward(self, x):
        X = torch.fft.rfft2(x, norm="ortho") * torch.view_as_complex(self.weight)
        y = torch.fft.irfft2(X, s=x.shape[-2:], norm="ortho")
        return self.mlp(y + x)


class GlobalFilterBroken(GlobalFilterTwin):
    def __init__(self):
        super().__init__(w=8)  # BUG(gfnet_rfft_weight_size)


class SpectralConv1dTwin(nn.Module):
    """FNO spectral convolution on the lowest 4 modes; inputs of odd length 15."""

    def __init__(self, c=4, modes=4):
        super().__init__()
        self.modes = modes
        self.w = nn.Parameter(0.1 * torch.randn(c, c, modes, 2))

    def spectral(self, x):
        X = torch.fft.rfft(x)
        out = torch.zeros_like(X)
        m = self.modes
        out[..., :m] = torch.einsum("bix,iox->box", X[..., :m], torch.view_as_complex(self.w))
        return out

    def forward(self, x):
        y = torch.fft.irfft(self.spectral(x), n=x.size(-1))
        return F.gelu(y + x)


class SpectralConv1dBroken(SpectralConv1dTwin):
    def forward(self, x):
        y = torch.fft.irfft(self.spectral(x))  # BUG(fft_irfft_odd_length)
        return F.gelu(y + x)


class SpecCNNTwin(nn.Module):
    """Log-magnitude STFT -> Conv2d -> pooled classifier."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(32))
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, wav):
        spec = torch.stft(wav, n_fft=32, hop_length=16, window=self.window,
                          return_complex=True).abs()
        h = F.relu(self.conv(torch.log1p(spec).unsqueeze(1)))
        return self.head(h.mean(dim=(2, 3)))


class SpecCNNBroken(SpecCNNTwin):
    def forward(self, wav):
        spec = torch.stft(wav, n_fft=32, hop_length=16, window=self.window, return_complex=True)  # BUG(stft_complex_conv)
        h = F.relu(self.conv(torch.log1p(spec).unsqueeze(1)))
        return self.head(h.mean(dim=(2, 3)))
