"""The third audit's broken models (tests/probe/test_audit_round3.py): one realistic one-line bug each.

Every case returns ``(broken, inputs, hand_fixed)``: ``inputs`` is a tuple of positional arguments
or a dict of keyword arguments; ``hand_fixed`` is the model a user would write after the right
fix, sharing the broken model's weights where that fix keeps them (``None`` where the fix changes
a layer's size: the test then copies the verified copy's weights into its own hand-fixed model).
Kept in their own file because the op-level fixes name these source lines.
"""
import copy
import torch
import torch.nn as nn
import torch.nn.functional as F

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class SmallCNN(nn.Module):
    def __init__(self, in_feat):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)          # 28 -> 26, no padding
        self.pool = nn.MaxPool2d(2)             # 26 -> 13
        self.flat = nn.Flatten()
        self.fc = nn.Linear(in_feat, 10)

    def forward(self, x):
        return self.fc(self.flat(self.pool(F.relu(self.conv(x)))))


@case
def c01_flatten_linear():
    torch.manual_seed(0)
    m = SmallCNN(8 * 14 * 14)                   # BUG: assumed padding keeps 28 -> 14
    return m, (torch.randn(2, 1, 28, 28),), None


class ImgNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y = F.relu(self.conv(x))
        return self.head(y.mean((2, 3)))


class ImgNetFixed(ImgNet):
    def forward(self, x):
        return super().forward(x.permute(0, 3, 1, 2))


@case
def c02_nhwc_conv2d():
    torch.manual_seed(0)
    m = ImgNet()
    f = ImgNetFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 24, 20, 3),), f   # BUG: an NHWC image from PIL/numpy


class SeqConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 32)
        self.conv = nn.Conv1d(32, 32, 3, padding=1)

    def forward(self, x):                        # x (B, T, 12)
        h = self.proj(x)                         # (B, T, 32)
        return self.conv(h)                      # BUG: conv wants (B, 32, T)


class SeqConvFixed(SeqConv):
    def forward(self, x):
        return self.conv(self.proj(x).transpose(1, 2))


@case
def c03_conv1d_btc():
    torch.manual_seed(0)
    m = SeqConv(); f = SeqConvFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 50, 12),), f


class GRUTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 16, num_layers=2, batch_first=True)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h0 = torch.zeros(x.size(0), 2, 16)       # BUG: h0 is (num_layers, B, H) even with batch_first
        y, _ = self.gru(x, h0)
        return self.out(y)


class GRUTaggerFixed(GRUTagger):
    def forward(self, x):
        h0 = torch.zeros(2, x.size(0), 16)
        y, _ = self.gru(x, h0)
        return self.out(y)


@case
def c04_gru_h0_swapped():
    torch.manual_seed(0)
    m = GRUTagger(); f = GRUTaggerFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(4, 7, 8),), f


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(32, 4)  # BUG: batch_first defaults to False

    def forward(self, x, pad):
        y, _ = self.mha(x, x, x, key_padding_mask=pad)
        return y


@case
def c05_mha_seq_first():
    torch.manual_seed(0)
    m = Attn(); f = copy.deepcopy(m); f.mha.batch_first = True
    x = torch.randn(4, 10, 32)
    pad = torch.zeros(4, 10, dtype=torch.bool); pad[:, 8:] = True
    return m, (x, pad), f


class AttnMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x, attention_mask):        # HF-style mask: 1 = keep, 0 = pad
        y, _ = self.mha(x, x, x, key_padding_mask=attention_mask)   # BUG: int, and opposite meaning
        return y


class AttnMaskFixed(AttnMask):
    def forward(self, x, attention_mask):
        y, _ = self.mha(x, x, x, key_padding_mask=attention_mask == 0)
        return y


@case
def c06_kpm_int_meaning():
    torch.manual_seed(0)
    m = AttnMask(); f = AttnMaskFixed(); f.load_state_dict(m.state_dict())
    am = torch.ones(3, 9, dtype=torch.long); am[0, 6:] = 0; am[2, 4:] = 0
    return m, (torch.randn(3, 9, 32), am), f


class CausalEnc(nn.Module):
    def __init__(self, max_len=16):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(max_len))

    def forward(self, x):
        return self.layer(x, src_mask=self.causal)   # BUG: mask is (max_len, max_len), not (T, T)


class CausalEncFixed(CausalEnc):
    def forward(self, x):
        T = x.size(1)
        return self.layer(x, src_mask=self.causal[:T, :T])


@case
def c07_causal_mask_size():
    torch.manual_seed(0)
    m = CausalEnc(); f = CausalEncFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 10, 32),), f


class BagModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.fc = nn.Linear(16, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


@case
def c08_embedding_float_ids():
    torch.manual_seed(0)
    m = BagModel(); f = BagModel(); f.load_state_dict(m.state_dict())
    ids = torch.randint(0, 100, (3, 7)).float()   # BUG: ids came through a float tensor / dataset
    fx = copy.deepcopy(f)
    class F_(nn.Module):
        def __init__(s): super().__init__(); s.m = fx
        def forward(s, ids): return s.m(ids.long())
    return m, (ids,), F_()


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@case
def c09_double_input():
    torch.manual_seed(0)
    m = Regressor()
    x = torch.from_numpy(__import__("numpy").random.RandomState(0).randn(6, 5))  # float64
    class F_(nn.Module):
        def __init__(s): super().__init__(); s.m = copy.deepcopy(m)
        def forward(s, x): return s.m(x.float())
    return m, (x,), F_()


class TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)           # BUG: vocab has 51 tokens (ids 0..50)
        self.fc = nn.Linear(8, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids))


@case
def c15_embedding_oob():
    torch.manual_seed(0)
    ids = torch.tensor([[1, 5, 50, 3], [0, 2, 49, 50]])
    return TokenModel(), (ids,), None


class VideoNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)

    def forward(self, x):                         # x (B, T, C, H, W) from a video loader
        return self.conv(x).mean((2, 3, 4))       # BUG: Conv3d reads (B, C, T, H, W)


class VideoNetFixed(VideoNet):
    def forward(self, x):
        return self.conv(x.transpose(1, 2)).mean((2, 3, 4))


@case
def c16_conv3d_btchw():
    torch.manual_seed(0)
    m = VideoNet(); f = VideoNetFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(2, 5, 3, 8, 8),), f


class Signal(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 16, 5, padding=2)
        self.head = nn.Linear(16, 2)

    def forward(self, x):                         # x (B, L) raw waveform
        return self.head(self.conv(x).mean(-1))   # BUG: needs (B, 1, L)


class SignalFixed(Signal):
    def forward(self, x):
        return self.head(self.conv(x.unsqueeze(1)).mean(-1))


@case
def c17_conv1d_missing_channel():
    torch.manual_seed(0)
    m = Signal(); f = SignalFixed(); f.load_state_dict(m.state_dict())
    return m, (torch.randn(4, 100),), f


@case
def c18_pool_to_zero():
    torch.manual_seed(0)
    layers = []
    c = 3
    for i in range(4):
        layers += [nn.Conv2d(c, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        c = 8
    m = nn.Sequential(*layers)                    # BUG: 8x8 input cannot take 4 poolings: 8,4,2,1,0
    return m, (torch.randn(2, 3, 8, 8),), None


class Upsampler(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)   # BUG: should be 3 * 2**2 = 12
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x):
        return self.shuffle(self.conv(x))


@case
def c20_pixelshuffle():
    torch.manual_seed(0)
    return Upsampler(), (torch.randn(1, 3, 8, 8),), None


@case
def c21_unflatten():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(10, 512), nn.Unflatten(1, (16, 8, 8)),   # BUG: 512 != 16*8*8
                      nn.ConvTranspose2d(16, 3, 4, 2, 1))
    return m, (torch.randn(2, 10),), None
