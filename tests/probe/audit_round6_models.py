"""Round-6 audit cases of ``layerlab inspect``'s failure blame: 15 broken models of the kind people post
about (written from the README alone, before layerlab was run on them), each ``build(fixed)`` returning
``(model, inputs)``; ``fixed=True`` is the hand-fixed twin with the same parameters (``load_state_dict``
carries the weights). The negative twins at the end are near misses where a rule must *not* give its fix.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# 1 ----------------------------------------------------------------------------------------------
class TinyUNet(nn.Module):
    """One down/up level; the skip concat breaks on an odd input size (37 → pool 18 → up 36)."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.mid = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Conv2d(16, 8, 3, padding=1)
        self.out = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        skip = torch.relu(self.enc(x))
        y = torch.relu(self.mid(self.pool(skip)))
        y = self.up(y)
        if self.fixed:  # pad the upsampled map to the skip's size (milesial U-Net's fix)
            dy, dx = skip.shape[-2] - y.shape[-2], skip.shape[-1] - y.shape[-1]
            y = F.pad(y, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        y = torch.cat([y, skip], dim=1)  # raises: 36 vs 37
        return self.out(torch.relu(self.dec(y)))


def unet(fixed=False):
    torch.manual_seed(0)
    return TinyUNet(fixed), (torch.randn(2, 3, 37, 37),)


# 2 ----------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, down_stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=down_stride, bias=False),
                                        nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = self.downsample(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + identity  # raises: 8 vs 16
        return torch.relu(out)


class SmallResNet(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2, 2 if fixed else 1))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(torch.relu(self.stem(x))))
        return self.fc(x.mean((2, 3)))


def resnet_down(fixed=False):
    torch.manual_seed(0)
    return SmallResNet(fixed), (torch.randn(2, 3, 16, 16),)


# 3 ----------------------------------------------------------------------------------------------
class GRUClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(12, 24, batch_first=True)
        self.fc = nn.Linear(24, 5)

    def forward(self, x, y):
        out, h = self.gru(x)               # (B, T, H)
        feats = out[:, -1] if self.fixed else out
        logits = self.fc(feats)            # (B, T, 5) unfixed
        return F.cross_entropy(logits, y)  # raises: target (B,) vs logits (B, T, C)


def gru_ce(fixed=False):
    torch.manual_seed(0)
    return GRUClassifier(fixed), (torch.randn(4, 7, 12), torch.tensor([0, 1, 2, 4]))


# 4 ----------------------------------------------------------------------------------------------
class SelfAttention(nn.Module):
    """GPT-style attention; merges heads with .view after a transpose."""

    def __init__(self, fixed=False, d=32, nh=4):
        super().__init__()
        self.fixed, self.nh = fixed, nh
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.nh, C // self.nh).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        v = v.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (k.shape[-1] ** 0.5)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = att.softmax(-1) @ v  # (B, nh, T, hd)
        y = y.transpose(1, 2)
        y = y.contiguous().view(B, T, C) if self.fixed else y.view(B, T, C)  # raises: view on non-contiguous
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.attn = SelfAttention(fixed)

    def forward(self, x):
        return x + self.attn(self.ln(x))


def attn_view(fixed=False):
    torch.manual_seed(0)
    return GPTBlock(fixed), (torch.randn(2, 6, 32),)


# 5 ----------------------------------------------------------------------------------------------
class ESPCN(nn.Module):
    """x3 super-resolution; the conv was sized for x2 (3 * 2**2 = 12 channels)."""

    def __init__(self, fixed=False, scale=3):
        super().__init__()
        self.scale = scale
        self.feat = nn.Conv2d(3, 16, 5, padding=2)
        self.to_sub = nn.Conv2d(16, 3 * (scale if fixed else 2) ** 2, 3, padding=1)
        self.shuffle = nn.PixelShuffle(scale)  # raises: 12 not divisible by 9

    def forward(self, x):
        return self.shuffle(self.to_sub(torch.tanh(self.feat(x))))


def pixelshuffle(fixed=False):
    torch.manual_seed(0)
    return ESPCN(fixed), (torch.randn(2, 3, 8, 8),)


# 6 ----------------------------------------------------------------------------------------------
class AudioCNN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.net = nn.Sequential(nn.Conv1d(1, 8, 9, stride=4), nn.ReLU(),
                                 nn.Conv1d(8, 16, 9, stride=4), nn.ReLU(),
                                 nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 4))

    def forward(self, wav):  # wav (B, T)
        if self.fixed:
            wav = wav.unsqueeze(1)
        return self.net(wav)  # raises: net.0 sees (B, T) as unbatched (C=B, L=T)


def audio_no_channel(fixed=False):
    torch.manual_seed(0)
    return AudioCNN(fixed), (torch.randn(4, 400),)


# 7 ----------------------------------------------------------------------------------------------
def single_image(fixed=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 7 * 7, 10))
    x = torch.randn(3, 16, 16)
    return model, ((x.unsqueeze(0) if fixed else x),)  # raises at 4 (Linear): (8, 49) vs 392


# 8 ----------------------------------------------------------------------------------------------
class CLSEncoder(nn.Module):
    """Prepends a learned CLS token; the padding mask still has the tokenizer's length T."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(50, 16, padding_idx=0)
        self.cls = nn.Parameter(torch.randn(1, 1, 16))
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, ids):
        pad = ids == 0                               # (B, T)
        x = self.emb(ids)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)  # (B, T + 1, E)
        if self.fixed:
            pad = torch.cat([pad.new_zeros(pad.shape[0], 1), pad], dim=1)
        x = self.encoder(x, src_key_padding_mask=pad)  # raises: mask (B, T) vs keys T + 1
        return self.head(x[:, 0])


def cls_mask(fixed=False):
    torch.manual_seed(0)
    ids = torch.tensor([[5, 7, 9, 3, 0, 0], [4, 8, 2, 6, 1, 0], [3, 3, 0, 0, 0, 0]])
    return CLSEncoder(fixed), (ids,)


# 9 ----------------------------------------------------------------------------------------------
class BagOfWords(nn.Module):
    """The tokenizer's vocabulary has 1024 ids; the table was sized for 1000."""

    def __init__(self, fixed=False, vocab=1024):
        super().__init__()
        self.emb = nn.Embedding(vocab if fixed else 1000, 16)  # raises: ids up to 1023
        self.fc = nn.Linear(16, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def embedding_oob(fixed=False):
    torch.manual_seed(0)
    ids = torch.tensor([[1, 17, 1003, 5], [1023, 2, 999, 0]])
    return BagOfWords(fixed), (ids,)


# 10 ---------------------------------------------------------------------------------------------
def bert_mean_axis(fixed=False):
    """HF BertModel; mean-pools over the hidden axis instead of the tokens."""
    from transformers import BertConfig, BertModel

    class BertClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=32)
            self.bert = BertModel(cfg)
            self.classifier = nn.Linear(32, 3)

        def forward(self, input_ids, attention_mask):
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            pooled = h.mean(dim=1) if fixed else h.mean(dim=-1)  # (B, T) unfixed
            return self.classifier(pooled)  # raises: (2, 9) vs in_features 32

    torch.manual_seed(0)
    ids = torch.randint(1, 64, (2, 9))
    return BertClassifier(), (ids, torch.ones(2, 9, dtype=torch.long))


# 11 ---------------------------------------------------------------------------------------------
class VAE(nn.Module):
    def __init__(self, fixed=False, latent=8):
        super().__init__()
        self.fixed = fixed
        self.enc = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2 * latent))
        self.dec = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, 20))

    def forward(self, x):
        h = self.enc(x)                                       # (B, 2L)
        mu, logvar = h.chunk(2, dim=-1 if self.fixed else 0)  # unfixed: halves the batch
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar                        # raises at dec.0: (B/2, 2L) vs L


def vae_chunk(fixed=False):
    torch.manual_seed(0)
    return VAE(fixed), (torch.randn(6, 20),)


# 12 ---------------------------------------------------------------------------------------------
class DenseLayer(nn.Module):
    def __init__(self, cin, growth):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv(torch.relu(self.norm(x)))


class DenseBlock(nn.Module):
    def __init__(self, fixed=False, cin=16, growth=8, n=3):
        super().__init__()
        # unfixed: cin + growth for every layer (forgot the i)
        self.layers = nn.ModuleList(DenseLayer(cin + (i if fixed else min(i, 1)) * growth, growth)
                                    for i in range(n))

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, dim=1)))  # raises at layers.2.norm: 32 channels vs 24
        return torch.cat(feats, dim=1)


def densenet(fixed=False):
    torch.manual_seed(0)
    return DenseBlock(fixed), (torch.randn(2, 16, 8, 8),)


# 13 ---------------------------------------------------------------------------------------------
class CausalMHA(nn.Module):
    """nn.MultiheadAttention left at batch_first=False and fed (B, T, E) with a (T, T) causal mask."""

    def __init__(self, fixed=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=fixed)
        self.ff = nn.Linear(16, 16)

    def forward(self, x):  # (B, T, E)
        T = x.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        y, _ = self.attn(x, x, x, attn_mask=mask)  # raises: mask should be (B, B) for seq-first
        return self.ff(y)


def mha_batch_first(fixed=False):
    torch.manual_seed(0)
    return CausalMHA(fixed), (torch.randn(3, 5, 16),)


# 14 ---------------------------------------------------------------------------------------------
class MultiLabel(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.net = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x, y):  # y multi-hot int64 (B, K), from a dataset of 0/1 labels
        logits = self.net(x)
        return F.binary_cross_entropy_with_logits(logits, y.float() if self.fixed else y)  # raises: Long


def bce_long(fixed=False):
    torch.manual_seed(0)
    y = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 0, 0]])
    return MultiLabel(fixed), (torch.randn(3, 10), y)


# 15 ---------------------------------------------------------------------------------------------
class TextCNN(nn.Module):
    """Kim-style CNN, kernels 3/4/5, fed a batch of 4-token sentences."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(100, 16, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(16, 8, k) for k in (3, 4, 5))
        self.fc = nn.Linear(24, 2)

    def forward(self, ids):
        if self.fixed:  # pad the batch to the widest kernel with the padding id
            ids = F.pad(ids, (0, max(0, 5 - ids.shape[1])), value=0)
        x = self.emb(ids).transpose(1, 2)  # (B, E, T)
        pooled = [torch.relu(conv(x)).amax(-1) for conv in self.convs]  # raises at convs.2: T=4 < 5
        return self.fc(torch.cat(pooled, 1))


def textcnn_short(fixed=False):
    torch.manual_seed(0)
    return TextCNN(fixed), (torch.tensor([[4, 9, 2, 7], [3, 3, 8, 0]]),)


# -- negative twins ---------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    """The main branch lost its stride (conv2 stride 1), the shortcut strides by 2: the larger operand
    ends in a 1×1 conv (conv3) that reads the branch, not the block's input — no shortcut-stride fix."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32)
        self.downsample = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + self.downsample(x))


class BiGRUClassifier(GRUClassifier):
    """Bidirectional: out[:, -1] holds only the first step of the backward direction — no last-step fix."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(12, 12, batch_first=True, bidirectional=True)


class TextCNNNoPad(TextCNN):
    """The Embedding has no padding_idx: the pad id is unknown, so the ids are not padded."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)


def negative(name):
    torch.manual_seed(0)
    if name == "bottleneck":
        return Bottleneck(), (torch.randn(2, 16, 8, 8),)
    if name == "bigru":
        return BiGRUClassifier(), gru_ce()[1]
    return TextCNNNoPad(), textcnn_short()[1]


CASES = {build.__name__: build for build in (
    unet, resnet_down, gru_ce, attn_view, pixelshuffle, audio_no_channel, single_image, cls_mask, embedding_oob,
    bert_mean_axis, vae_chunk, densenet, mha_batch_first, bce_long, textcnn_short)}
