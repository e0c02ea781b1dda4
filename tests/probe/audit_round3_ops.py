"""The third audit's broken models whose bug is an op of their own code
(tests/probe/test_audit_round3.py): one realistic one-line bug each.

Every case returns ``(broken, inputs, hand_fixed)``: ``inputs`` is a tuple of positional arguments
or a dict of keyword arguments; ``hand_fixed`` is the model a user would write after the right
fix, sharing the broken model's weights where that fix keeps them (``None`` where the fix changes
a layer's size: the test then copies the verified copy's weights into its own hand-fixed model).
Kept in their own file: the op-level fixes name these source lines.
"""
import torch
import torch.nn as nn

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class PermView(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 20, 5)

    def forward(self, x):
        h = self.conv(x).permute(0, 2, 1)         # (B, T, C)
        h = h.view(h.size(0), -1)                 # BUG: view on non-contiguous
        return self.fc(h)


class PermViewFixed(PermView):
    def forward(self, x):
        h = self.conv(x).permute(0, 2, 1)
        h = h.reshape(h.size(0), -1)
        return self.fc(h)


@case
def c10_view_after_permute():
    torch.manual_seed(0)
    m = PermView(); f = PermViewFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 4, 20),), f


class TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 16, 3, padding=1)
        self.fuse = nn.Conv2d(24, 4, 1)

    def forward(self, x):
        h = torch.cat([self.a(x), self.b(x)], dim=0)   # BUG: channel concat is dim=1
        return self.fuse(h)


class TwoBranchFixed(TwoBranch):
    def forward(self, x):
        return self.fuse(torch.cat([self.a(x), self.b(x)], dim=1))


@case
def c11_cat_wrong_dim():
    torch.manual_seed(0)
    m = TwoBranch(); f = TwoBranchFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 3, 8, 8),), f


class ResBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.ff = nn.Linear(32, 64)              # BUG: expands but no projection back

    def forward(self, x):
        return x + self.ff(self.norm(x))


@case
def c12_residual_width():
    torch.manual_seed(0)
    return ResBlock(), (torch.randn(2, 5, 32),), None


class BmmAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        scores = torch.bmm(q, k)                 # BUG: needs k.transpose(1, 2)
        return scores.softmax(-1)


class BmmAttnFixed(BmmAttn):
    def forward(self, x):
        q, k = self.q(x), self.k(x)
        return torch.bmm(q, k.transpose(1, 2)).softmax(-1)


@case
def c13_bmm_transpose():
    torch.manual_seed(0)
    m = BmmAttn(); f = BmmAttnFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 10, 16),), f


class EinsumAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 4, 8).unbind(2)   # each (B, T, H, D)
        q = q.transpose(1, 2)                                  # (B, H, T, D)
        att = torch.einsum("bhqd,bhkd->bhqk", q, k)            # BUG: k still (B, T, H, D)
        return att.softmax(-1)


class EinsumAttnFixed(EinsumAttn):
    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 4, 8).unbind(2)
        q = q.transpose(1, 2)
        att = torch.einsum("bhqd,bhkd->bhqk", q, k.transpose(1, 2))
        return att.softmax(-1)


@case
def c14_einsum_layout():
    torch.manual_seed(0)
    m = EinsumAttn(); f = EinsumAttnFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 6, 32),), f


class TinyUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.MaxPool2d(2)
        self.mid = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x):
        s = self.enc(x)                            # 15x15
        h = self.up(self.mid(self.down(s)))        # 7 -> 14
        return self.dec(torch.cat([h, s], dim=1))  # BUG: 14 vs 15 (odd input)


class TinyUNetFixed(TinyUNet):
    def forward(self, x):
        s = self.enc(x)
        h = self.up(self.mid(self.down(s)), output_size=s.shape[-2:])
        return self.dec(torch.cat([h, s], dim=1))


@case
def c19_convtranspose_odd():
    torch.manual_seed(0)
    m = TinyUNet(); f = TinyUNetFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(1, 3, 15, 15),), f
