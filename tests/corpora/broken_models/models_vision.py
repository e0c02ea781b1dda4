"""Broken models and their hand-fixed twins: point clouds, video (3-D convolution), spatial
transformers and NeRF encodings.

Twin first (what the author meant, plain torch), then the broken class (a subclass wherever the
same state_dict can load into both). The wrong line carries ``# BUG(case-name)`` (``# ALSO(case-name)``
for a second line that is part of the same fix). Sizes are tiny: the whole corpus runs in seconds.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- point clouds ----------------------------------------------------------------------------

def knn_indices(x, k):
    """x (B, C, N) -> the k nearest points of every point, (B, N, k)."""
    pts = x.transpose(1, 2)
    return torch.cdist(pts, pts).topk(k, dim=-1, largest=False).indices


class EdgeConvTwin(nn.Module):
    """DGCNN EdgeConv: features [x_j - x_i, x_i] over the k nearest neighbours, max over k."""

    def __init__(self, c=3, out=8, k=4):
        super().__init__()
        self.k = k
        self.conv = nn.Conv2d(2 * c, out, 1)
        self.head = nn.Linear(out, 5)

    def neighbours(self, x):
        B = x.size(0)
        pts = x.transpose(1, 2)                                         # (B, N, C)
        idx = knn_indices(x, self.k)                                     # (B, N, k)
        nbr = pts[torch.arange(B)[:, None, None], idx]                   # (B, N, k, C)
        ctr = pts.unsqueeze(2).expand(-1, -1, self.k, -1)                # (B, N, k, C)
        return nbr, ctr

    def forward(self, x):
        nbr, ctr = self.neighbours(x)
        e = torch.cat([nbr - ctr, ctr], dim=-1)                          # (B, N, k, 2C)
        e = e.permute(0, 3, 1, 2)                                        # (B, 2C, N, k)
        h = self.conv(e).max(dim=-1).values                              # (B, out, N)
        return self.head(h.max(dim=-1).values)


class EdgeConvBroken(EdgeConvTwin):
    def forward(self, x):
        nbr, ctr = self.neighbours(x)
        e = torch.cat([nbr - ctr, ctr], dim=1)  # BUG(dgcnn_edge_cat_dim)
        e = e.permute(0, 3, 1, 2)
        h = self.conv(e).max(dim=-1).values
        return self.head(h.max(dim=-1).values)


class PointNetSegTwin(nn.Module):
    """PointNet segmentation: per-point features joined with the global max-pooled feature."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(3, 16, 1)
        self.conv2 = nn.Conv1d(16, 32, 1)
        self.seg = nn.Conv1d(16 + 32, 4, 1)

    def forward(self, x):
        f = F.relu(self.conv1(x))
        g = F.relu(self.conv2(f)).max(dim=2, keepdim=True).values        # (B, 32, 1)
        g = g.expand(-1, -1, x.size(2))
        return self.seg(torch.cat([f, g], dim=1))


class PointNetSegBroken(PointNetSegTwin):
    def forward(self, x):
        f = F.relu(self.conv1(x))
        g = F.relu(self.conv2(f)).max(dim=2).values  # BUG(pointnet_seg_global_keepdim)
        g = g.expand(-1, -1, x.size(2))  # ALSO(pointnet_seg_global_keepdim)
        return self.seg(torch.cat([f, g], dim=1))


class TNetTwin(nn.Module):
    """PointNet input transform: a learned 3x3 matrix applied to every point (points as rows)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 16, 1)
        self.fc = nn.Linear(16, 9)
        self.feat = nn.Conv1d(3, 8, 1)
        self.head = nn.Linear(8, 4)

    def transform(self, x):
        t = self.fc(F.relu(self.conv(x)).max(dim=2).values).view(-1, 3, 3)
        return t + torch.eye(3)

    def forward(self, x):                                                # x (B, 3, N)
        t = self.transform(x)
        x = torch.bmm(x.transpose(1, 2), t).transpose(1, 2)              # (B, 3, N)
        return self.head(F.relu(self.feat(x)).max(dim=2).values)


class TNetBroken(TNetTwin):
    def forward(self, x):
        t = self.transform(x)
        x = torch.bmm(x, t)  # BUG(pointnet_tnet_bmm)
        return self.head(F.relu(self.feat(x)).max(dim=2).values)


# --- video / 3-D convolution ------------------------------------------------------------------

class VideoHeadTwin(nn.Module):
    """A Conv3d that halves T, H and W (stride 2, padding 1), then a flat classifier head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv3d(3, 4, 3, stride=2, padding=1)            # (8,16,16) -> (4,8,8)
        self.fc = nn.Linear(4 * 4 * 8 * 8, 5)

    def forward(self, x):
        return self.fc(F.relu(self.conv1(x)).flatten(1))


class VideoHeadBroken(VideoHeadTwin):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv3d(3, 4, 3, stride=2)  # BUG(video_conv3d_head_size)


class FrameEncoderTwin(nn.Module):
    """Per-frame 2-D CNN over a (B, C, T, H, W) clip, then a GRU over time."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        B, C, T, H, W = x.shape
        f = x.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)
        f = self.conv(f).mean(dim=(2, 3)).view(B, T, -1)
        _, h = self.gru(f)
        return self.head(h[-1])


class FrameEncoderBroken(FrameEncoderTwin):
    def forward(self, x):
        B, C, T, H, W = x.shape
        f = x.permute(0, 2, 1, 3, 4).view(B * T, C, H, W)  # BUG(video_frames_view_noncontig)
        f = self.conv(f).mean(dim=(2, 3)).view(B, T, -1)
        _, h = self.gru(f)
        return self.head(h[-1])


class ClipLSTMTwin(nn.Module):
    """Per-frame features (B, T, F) -> LSTM -> the clip's class from the last hidden state."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.head(h[-1])


class ClipLSTMBroken(ClipLSTMTwin):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 8)  # BUG(video_lstm_batch_first)


# --- spatial transformers ---------------------------------------------------------------------

class STNTwin(nn.Module):
    """Spatial transformer: a localisation net regresses a 2x3 affine, started at identity."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 6))
        with torch.no_grad():
            self.loc[-1].weight.mul_(0.1)
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
        self.head = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

    def warp(self, x, theta):
        grid = F.affine_grid(theta, list(x.size()), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        return self.head(self.warp(x, theta))


class STNBroken(STNTwin):
    def forward(self, x):
        theta = self.loc(x).view(-1, 3, 2)  # BUG(stn_theta_view)
        return self.head(self.warp(x, theta))


class STNTutorialTwin(nn.Module):
    """The PyTorch STN tutorial's localisation net, sized for 20x20 images (4 x 8 x 8 = 256)."""

    def __init__(self, flat=4 * 8 * 8):
        super().__init__()
        self.flat = flat
        self.localization = nn.Sequential(nn.Conv2d(1, 4, 5), nn.MaxPool2d(2), nn.ReLU())
        self.fc_loc = nn.Sequential(nn.Linear(flat, 16), nn.ReLU(), nn.Linear(16, 6))
        with torch.no_grad():
            self.fc_loc[2].weight.zero_()
            self.fc_loc[2].bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(20 * 20, 3))

    def forward(self, x):
        xs = self.localization(x)
        xs = xs.view(-1, self.flat)
        theta = self.fc_loc(xs).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.size()), align_corners=False)
        return self.head(F.grid_sample(x, grid, align_corners=False))


class STNTutorialBroken(STNTutorialTwin):
    def __init__(self):
        super().__init__(flat=4 * 6 * 6)  # BUG(stn_loc_flatten_size)

    def forward(self, x):
        xs = self.localization(x)
        xs = xs.view(-1, self.flat)  # ALSO(stn_loc_flatten_size)
        theta = self.fc_loc(xs).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.size()), align_corners=False)
        return self.head(F.grid_sample(x, grid, align_corners=False))


# --- NeRF positional encodings ----------------------------------------------------------------

def posenc(x, n_freqs):
    """NeRF's gamma(p): p itself, then sin and cos at 2^0 .. 2^(L-1): 3 + 6L features."""
    xb = x[..., None] * (2.0 ** torch.arange(n_freqs))                  # (R, 3, L)
    return torch.cat([x, torch.sin(xb).flatten(-2), torch.cos(xb).flatten(-2)], dim=-1)


class NeRFTwin(nn.Module):
    def __init__(self, n_freqs=4):
        super().__init__()
        self.n_freqs = n_freqs
        self.mlp = nn.Sequential(nn.Linear(3 + 6 * n_freqs, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.mlp(posenc(x, self.n_freqs))


class NeRFBroken(NeRFTwin):
    def __init__(self, n_freqs=4):
        super().__init__(n_freqs)
        self.mlp[0] = nn.Linear(3 * 2 * n_freqs, 32)  # BUG(nerf_posenc_in_features)


def dir_encoding(d, n_freqs, stack_dim):
    xb = d[..., None] * (2.0 ** torch.arange(n_freqs))                  # (R, 3, L)
    e = torch.stack([torch.sin(xb), torch.cos(xb)], dim=stack_dim)  # ALSO(nerf_viewdir_stack_dim)
    return e.flatten(-3)


class NeRFViewTwin(nn.Module):
    """Colour from the trunk's features and the encoded view direction (no identity term)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(3 + 6 * 4, 16)
        self.rgb = nn.Linear(16 + 3 * 2 * 2, 3)

    def forward(self, x, d):
        h = F.relu(self.trunk(posenc(x, 4)))
        return torch.sigmoid(self.rgb(torch.cat([h, dir_encoding(d, 2, -1)], dim=-1)))


class NeRFViewBroken(NeRFViewTwin):
    def forward(self, x, d):
        h = F.relu(self.trunk(posenc(x, 4)))
        e = dir_encoding(d, 2, 0)  # BUG(nerf_viewdir_stack_dim)
        return torch.sigmoid(self.rgb(torch.cat([h, e], dim=-1)))
