"""Vision models of the second corpus: detection, pose, VQ-VAE, FPN, 2-D positions, mobile
blocks, OCR (CRNN) and feature distillation. Each twin is written first; the broken class
subclasses it and overrides only the wrong part, marked ``# BUG(case)``."""

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- detection: a RetinaNet-style dense head with anchors made by hand -----------------------
class AnchorHeadTwin(nn.Module):
    def __init__(self, c=32, anchors=3, classes=5):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, c, 3, stride=4, padding=1), nn.ReLU(),
                                   nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.cls = nn.Conv2d(c, anchors * classes, 3, padding=1)
        self.reg = nn.Conv2d(c, anchors * 4, 3, padding=1)
        self.num_anchors, self.num_classes = anchors, classes

    def anchors(self, h, w, stride):
        """(h·w·A, 4) anchors as (cx, cy, width, height), position-major like the head's output."""
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        centers = torch.stack([xs, ys], -1).reshape(-1, 1, 2).float() * stride + stride / 2
        sizes = torch.tensor([16.0, 32.0, 64.0])[: self.num_anchors].view(1, -1, 1)
        a = self.num_anchors
        return torch.cat([centers.expand(-1, a, -1), sizes.expand(h * w, a, 2)], -1).reshape(-1, 4)

    def box_deltas(self, f):
        b = f.shape[0]
        return self.reg(f).permute(0, 2, 3, 1).reshape(b, -1, 4)

    def forward(self, img):
        f = self.trunk(img)
        b, _, h, w = f.shape
        logits = self.cls(f).permute(0, 2, 3, 1).reshape(b, -1, self.num_classes)
        deltas = self.box_deltas(f)
        anc = self.anchors(h, w, img.shape[-1] // w)
        centers = anc[:, :2] + deltas[..., :2] * anc[:, 2:]
        sizes = anc[:, 2:] * deltas[..., 2:].exp()
        return logits, torch.cat([centers, sizes], -1)


class AnchorHeadBroken(AnchorHeadTwin):
    def box_deltas(self, f):
        b = f.shape[0]
        return self.reg(f).permute(0, 2, 3, 1).view(b, -1, 4)  # BUG(detection_deltas_view)


# --- pose estimation: soft-argmax over keypoint heatmaps -------------------------------------
class SoftArgmaxPoseTwin(nn.Module):
    def __init__(self, joints=6, c=16, beta=10.0):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, c, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.heat = nn.Conv2d(c, joints, 1)
        self.beta = beta

    def grid(self, h, w):
        """x and y of every heatmap pixel, flattened row-major like ``flatten(2)``: each (h·w,)."""
        ys, xs = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
        return xs.reshape(-1), ys.reshape(-1)

    def forward(self, img):
        hm = self.heat(self.backbone(img))  # (B, J, h, w)
        prob = torch.softmax(self.beta * hm.flatten(2), dim=-1)  # (B, J, h·w)
        xs, ys = self.grid(hm.shape[-2], hm.shape[-1])
        return torch.stack([(prob * xs).sum(-1), (prob * ys).sum(-1)], dim=-1)  # (B, J, 2)


class SoftArgmaxPoseBroken(SoftArgmaxPoseTwin):
    def grid(self, h, w):
        return torch.linspace(0, 1, w), torch.linspace(0, 1, h)  # BUG(pose_softargmax_grid)


# --- VQ-VAE: nearest-codebook quantisation ----------------------------------------------------
class VQVAETwin(nn.Module):
    def __init__(self, d=8, codes=16):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 16, 4, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, d, 4, stride=2, padding=1))
        self.codebook = nn.Embedding(codes, d)
        self.dec = nn.Sequential(nn.ConvTranspose2d(d, 16, 4, stride=2, padding=1), nn.ReLU(),
                                 nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1))

    def to_vectors(self, z):
        """(B, D, H, W) -> (B, H·W, D): one D-vector per position."""
        return z.flatten(2).transpose(1, 2)

    def forward(self, x):
        z = self.enc(x)
        b, d, h, w = z.shape
        zf = self.to_vectors(z)
        e = self.codebook.weight
        dist = (e * e).sum(1) - 2 * zf @ e.t()  # (B, H·W, K), ‖z‖² dropped (argmin does not need it)
        q = self.codebook(dist.argmin(-1))  # (B, H·W, D)
        vq_loss = F.mse_loss(q, zf.detach()) + 0.25 * F.mse_loss(zf, q.detach())  # codebook + commitment
        q = zf + (q - zf).detach()  # straight-through
        return self.dec(q.transpose(1, 2).reshape(b, d, h, w)), vq_loss


class VQVAEBroken(VQVAETwin):
    def to_vectors(self, z):
        return z.flatten(2)  # BUG(vqvae_vectors_transpose)


# --- FPN: top-down merge of multi-scale features ----------------------------------------------
class FPNTwin(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.c2 = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU())
        self.c3 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
        self.c4 = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU())
        self.lat2, self.lat3, self.lat4 = nn.Conv2d(16, c, 1), nn.Conv2d(32, c, 1), nn.Conv2d(64, c, 1)
        self.smooth = nn.Conv2d(c, c, 3, padding=1)

    def merge(self, top, lateral):
        return F.interpolate(top, size=lateral.shape[-2:], mode="nearest") + lateral

    def forward(self, x):
        c2 = self.c2(x)
        c3 = self.c3(c2)
        c4 = self.c4(c3)
        p3 = self.merge(self.lat4(c4), self.lat3(c3))
        p2 = self.merge(p3, self.lat2(c2))
        return self.smooth(p2)


class FPNBroken(FPNTwin):
    def merge(self, top, lateral):
        return F.interpolate(top, scale_factor=2, mode="nearest") + lateral  # BUG(fpn_topdown_odd_size)


# --- learned 2-D positional embeddings on a non-square patch grid ------------------------------
class RowColPositionTwin(nn.Module):
    def __init__(self, d=32, patch=8, max_side=16, classes=5):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.row = nn.Parameter(torch.randn(max_side, d // 2) * 0.02)
        self.col = nn.Parameter(torch.randn(max_side, d // 2) * 0.02)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, classes)

    def grid(self, feat):
        """Rows and columns of the patch grid."""
        return feat.shape[-2], feat.shape[-1]

    def forward(self, img):
        f = self.patch(img)
        tokens = f.flatten(2).transpose(1, 2)  # (B, h·w, d)
        h, w = self.grid(f)
        pos = torch.cat([self.row[:h, None].expand(h, w, -1), self.col[None, :w].expand(h, w, -1)], -1)
        x = tokens + pos.reshape(h * w, -1)
        x = x + self.mlp(x)
        return self.head(x.mean(1))


class RowColPositionBroken(RowColPositionTwin):
    def grid(self, feat):
        side = int((feat.shape[-2] * feat.shape[-1]) ** 0.5)  # BUG(pos2d_square_grid)
        return side, side


# --- mobile inverted-residual blocks -----------------------------------------------------------
class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand=4):
        super().__init__()
        hid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False),
                                nn.BatchNorm2d(hid), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.use_res = self.has_residual(cin, cout, stride)

    @staticmethod
    def has_residual(cin, cout, stride):
        return stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.dw(self.expand(x)))
        return x + y if self.use_res else y


class InvertedResidualBroken(InvertedResidual):
    @staticmethod
    def has_residual(cin, cout, stride):
        return cin == cout  # BUG(mobile_residual_stride)


class MobileNetTwin(nn.Module):
    block = InvertedResidual

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(self.block(16, 16, 1), self.block(16, 24, 2),
                                    self.block(24, 24, 2), self.block(24, 24, 1))
        self.head = nn.Linear(24, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class MobileNetBroken(MobileNetTwin):
    block = InvertedResidualBroken


# --- OCR: a CRNN whose conv stack must bring the text line's height to 1 ----------------------
class CRNNTwin(nn.Module):
    def __init__(self, classes=12, hidden=32):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # H 32 -> 16
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 16 -> 8
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)),  # 8 -> 4
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d((4, 1)))  # 4 -> 1
        self.rnn = nn.LSTM(32, hidden, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, img):  # (B, 1, 32, W)
        f = self.cnn(img)  # (B, 32, 1, W/4)
        seq = f.squeeze(2).permute(2, 0, 1)  # (T, B, C), seq-first for the LSTM
        out, _ = self.rnn(seq)
        return self.fc(out).log_softmax(-1)


class CRNNBroken(CRNNTwin):
    def __init__(self, classes=12, hidden=32):
        super().__init__(classes, hidden)
        self.cnn[11] = nn.MaxPool2d((2, 1))  # BUG(crnn_height_not_collapsed)


# --- knowledge distillation: logits with temperature plus a feature hint ----------------------
class FeatureDistillTwin(nn.Module):
    def __init__(self, temperature=4.0, classes=10):
        super().__init__()
        self.student = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
        self.teacher = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU())
        self.s_head, self.t_head = nn.Linear(32, classes), nn.Linear(64, classes)
        for p in list(self.teacher.parameters()) + list(self.t_head.parameters()):
            p.requires_grad_(False)
        self.adapter = nn.Linear(32, 64)  # maps the student's channels to the teacher's, per position
        self.temperature = temperature

    def adapt(self, fs):  # (B, 32, h, w) -> (B, 64, h, w)
        return self.adapter(fs.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def forward(self, x):
        fs, ft = self.student(x), self.teacher(x)
        t = self.temperature
        s_logits, t_logits = self.s_head(fs.mean((2, 3))), self.t_head(ft.mean((2, 3)))
        kd = F.kl_div(F.log_softmax(s_logits / t, -1), F.softmax(t_logits / t, -1),
                      reduction="batchmean") * t * t
        return kd + F.mse_loss(self.adapt(fs), ft)


class FeatureDistillBroken(FeatureDistillTwin):
    def adapt(self, fs):
        return self.adapter(fs)  # BUG(distill_hint_adapter)
