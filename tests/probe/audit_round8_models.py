"""Round-8 audit models: 15 broken models from areas earlier rounds missed, and near misses.

Every builder returns ``(model, inputs)``; ``fixed=True`` gives the hand-fixed twin (the right first
fix applied by hand in its forward, same inputs). Speech, recommenders, time series, vision, NLP and
Hugging Face, generative and tabular models; the near misses at the end raise the same torch error
with another right fix."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# 1 speech: (B, n_mels, T) mel spectrogram into Conv2d without the channel axis
class MelCNN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 5)

    def forward(self, mel):
        x = mel.unsqueeze(1) if self.fixed else mel
        x = self.pool(torch.relu(self.conv(x))).flatten(1)
        return self.head(x)


def mel_cnn(fixed=False):
    return MelCNN(fixed), (torch.randn(4, 20, 30),)


# 2 speech: CTC loss fed (B, T, C) log-probs where it wants (T, B, C)
class CTCModel(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.rnn = nn.GRU(12, 16, batch_first=True)
        self.out = nn.Linear(16, 6)

    def forward(self, feats, targets, in_lens, tgt_lens):
        h, _ = self.rnn(feats)
        log_probs = self.out(h).log_softmax(-1)          # (B, T, C)
        if self.fixed:
            log_probs = log_probs.transpose(0, 1)        # (T, B, C)
        return F.ctc_loss(log_probs, targets, in_lens, tgt_lens)


def ctc_model(fixed=False):
    g = torch.Generator().manual_seed(0)
    B, T = 3, 25
    return CTCModel(fixed), (torch.randn(B, T, 12), torch.randint(1, 6, (B, 5), generator=g),
                             torch.full((B,), T, dtype=torch.long), torch.full((B,), 5, dtype=torch.long))


# 3 recsys: EmbeddingBag given bag lengths where it wants start offsets
class BagModel(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.bag = nn.EmbeddingBag(50, 8, mode="mean")
        self.head = nn.Linear(8, 1)

    def forward(self, ids, lengths):
        if self.fixed:
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
        else:
            offsets = lengths
        return self.head(self.bag(ids, offsets))


def bag_model(fixed=False):
    return BagModel(fixed), (torch.arange(9) % 50, torch.tensor([3, 2, 4]))


# 4 recsys: two-tower dot product with towers of different widths
class TwoTower(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.user = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.item = nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Linear(32, 16 if fixed else 8))

    def forward(self, u, i):
        return (self.user(u) * self.item(i)).sum(-1)


def two_tower(fixed=False):
    return TwoTower(fixed), (torch.randn(6, 10), torch.randn(6, 7))


# 5 time series: patching with unfold step 1 where non-overlapping patches (step = patch) were meant
class PatchForecaster(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.embed = nn.Linear(12, 16)
        self.head = nn.Linear(8 * 16, 4)     # 96 / 12 = 8 patches

    def forward(self, x):                    # (B, 96)
        patches = x.unfold(1, 12, 12 if self.fixed else 1)
        return self.head(self.embed(patches).flatten(1))


def patch_forecaster(fixed=False):
    return PatchForecaster(fixed), (torch.randn(5, 96),)


# 6 time series: LSTM forecaster whose target keeps a trailing feature axis
class LSTMForecaster(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.lstm = nn.LSTM(3, 16, batch_first=True)
        self.fc = nn.Linear(16, 12)

    def forward(self, x, y):                 # y (B, 12, 1)
        out, _ = self.lstm(x)
        pred = self.fc(out[:, -1])           # (B, 12)
        target = y.squeeze(-1) if self.fixed else y
        return F.mse_loss(pred, target)


def lstm_forecaster(fixed=False):
    return LSTMForecaster(fixed), (torch.randn(8, 20, 3), torch.randn(8, 12, 1))


# 7 vision: a backbone built for 224 px fed 32 px: the 5th pool sees a 1x1 map (0 out)
class Backbone(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        layers, c = [], 3
        for out in (8, 8, 16, 16, 16):
            layers += [nn.Conv2d(c, out, 3), nn.ReLU(), nn.MaxPool2d(2)]
            c = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        if self.fixed:
            x = F.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False)
        return self.head(self.features(x).flatten(1))


def backbone(fixed=False):
    return Backbone(fixed), (torch.randn(2, 3, 32, 32),)


# 8 vision: autoencoder decoder whose ConvTranspose2d lack output_padding=1 (7 -> 13 -> 25, not 28)
class ConvAE(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        op = 1 if fixed else 0
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 3, 2, 1, output_padding=op), nn.ReLU(),
                                 nn.ConvTranspose2d(8, 1, 3, 2, 1, output_padding=op))

    def forward(self, x):
        recon = self.dec(self.enc(x))
        return F.mse_loss(recon, x)


def conv_ae(fixed=False):
    return ConvAE(fixed), (torch.randn(2, 1, 28, 28),)


# 9 vision: FPN top-down path upsampling by 4 where the strides differ by 2
class TinyFPN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.c3 = nn.Conv2d(3, 16, 3, stride=8, padding=1)
        self.c4 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.lat3 = nn.Conv2d(16, 24, 1)
        self.lat4 = nn.Conv2d(32, 24, 1)

    def forward(self, x):
        c3 = self.c3(x)
        c4 = self.c4(c3)
        p4 = self.lat4(c4)
        up = F.interpolate(p4, scale_factor=2 if self.fixed else 4, mode="nearest")
        return self.lat3(c3) + up


def tiny_fpn(fixed=False):
    return TinyFPN(fixed), (torch.randn(2, 3, 64, 64),)


# 10 NLP (HF): BERT encoder + BiLSTM + CRF emission layer sized for one direction
class BertBiLSTMTagger(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        from transformers import BertConfig, BertModel
        cfg = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)
        torch.manual_seed(0)
        self.bert = BertModel(cfg, add_pooling_layer=False)
        self.lstm = nn.LSTM(16, 10, batch_first=True, bidirectional=True)
        self.emission = nn.Linear(20 if fixed else 10, 7)

    def forward(self, input_ids, attention_mask):
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        out, _ = self.lstm(h)
        return self.emission(out)


def bert_bilstm(fixed=False):
    return BertBiLSTMTagger(fixed), (torch.randint(0, 60, (2, 9)), torch.ones(2, 9, dtype=torch.long))


# 11 NLP (HF): tokenizer vocab (120) larger than the model's embedding table (100)
class BertClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification
        cfg = BertConfig(vocab_size=120 if fixed else 100, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                         num_labels=3)
        torch.manual_seed(0)
        self.model = BertForSequenceClassification(cfg)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


def bert_vocab(fixed=False):
    ids = torch.tensor([[101, 5, 17, 110, 102], [101, 44, 118, 9, 102]])
    return BertClassifier(fixed), (ids,)


# 12 generative: VAE whose logvar head is sized hidden, not latent: mu + eps * std cannot add
class VAE(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.enc = nn.Linear(20, 32)
        self.mu = nn.Linear(32, 4)
        self.logvar = nn.Linear(32, 4 if fixed else 32)
        self.dec = nn.Linear(4, 20)

    def forward(self, x):
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(mu)
        z = mu + eps * std
        return self.dec(z)


def vae(fixed=False):
    return VAE(fixed), (torch.randn(5, 20),)


# 13 generative: GAN conv discriminator fed the generator's flat (B, C*H*W) output
class GAN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.G = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1 * 16 * 16), nn.Tanh())
        self.D = nn.Sequential(nn.Conv2d(1, 8, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(8, 1, 8), nn.Flatten())

    def forward(self, z):
        fake = self.G(z)
        if self.fixed:
            fake = fake.view(-1, 1, 16, 16)
        return self.D(fake)


def gan(fixed=False):
    return GAN(fixed), (torch.randn(4, 8),)


# 14 tabular: categorical embeddings looked up by row (x_cat[i]) instead of column (x_cat[:, i])
class TabularNet(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.embs = nn.ModuleList([nn.Embedding(10, 3), nn.Embedding(6, 2), nn.Embedding(8, 4)])
        self.mlp = nn.Sequential(nn.Linear(3 + 2 + 4 + 5, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x_cat, x_num):
        cols = [e(x_cat[:, i] if self.fixed else x_cat[i]) for i, e in enumerate(self.embs)]
        return self.mlp(torch.cat(cols + [x_num], dim=1))


def tabular(fixed=False):
    g = torch.Generator().manual_seed(1)
    return TabularNet(fixed), (torch.randint(0, 6, (8, 3), generator=g), torch.randn(8, 5))


# 15 vision (HF): ViT built for 224 fed 32 x 32 images
class ViTClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification
        self.fixed = fixed
        cfg = ViTConfig(image_size=64, patch_size=16, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, num_labels=4)
        torch.manual_seed(0)
        self.vit = ViTForImageClassification(cfg)

    def forward(self, pixel_values):
        if self.fixed:
            pixel_values = F.interpolate(pixel_values, size=(64, 64), mode="bilinear", align_corners=False)
        return self.vit(pixel_values=pixel_values).logits


def vit_small(fixed=False):
    return ViTClassifier(fixed), (torch.randn(2, 3, 32, 32),)


CASES = {f.__name__: f for f in (mel_cnn, ctc_model, bag_model, two_tower, patch_forecaster, lstm_forecaster,
                                 backbone, conv_ae, tiny_fpn, bert_bilstm, bert_vocab, vae, gan, tabular, vit_small)}


# -- near misses: the same torch error, another right fix ------------------------------------------
class PatchForecasterWrongHead(nn.Module):
    """Non-overlapping patches already (step = 12: 8 patches) and a head built for 7: in_features=128."""

    def __init__(self, fixed=False):
        super().__init__()
        self.embed = nn.Linear(12, 16)
        self.head = nn.Linear((8 if fixed else 7) * 16, 4)

    def forward(self, x):
        return self.head(self.embed(x.unfold(1, 12, 12)).flatten(1))


def patch_wrong_head(fixed=False):
    return PatchForecasterWrongHead(fixed), (torch.randn(5, 96),)


class VAEWideLatent(nn.Module):
    """Latent 32 (the decoder takes 32): here the mu head is the one built too narrow."""

    def __init__(self, fixed=False):
        super().__init__()
        self.enc = nn.Linear(20, 32)
        self.mu = nn.Linear(32, 32 if fixed else 4)
        self.logvar = nn.Linear(32, 32)
        self.dec = nn.Linear(32, 20)

    def forward(self, x):
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z)


def vae_wide_latent(fixed=False):
    return VAEWideLatent(fixed), (torch.randn(5, 20),)


class Reparameterise(nn.Module):
    """The encoder half alone: nothing after the sum says which head is wrong."""

    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(32, 4)
        self.logvar = nn.Linear(32, 32)

    def forward(self, h):
        mu, logvar = self.mu(h), self.logvar(h)
        return mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)


def reparameterise(fixed=False):
    return Reparameterise(), (torch.randn(5, 32),)


class FlatRGB(nn.Module):
    """(N, 96) into Conv2d(3, …): 32 values per channel is no square map, so H × W is unknown."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)


def flat_rgb(fixed=False):
    return FlatRGB(), (torch.randn(4, 96),)


class CTCShortLengths(nn.Module):
    """(T, N, C) log-probs already; input_lengths built for another batch: no transpose."""

    def forward(self, log_probs, targets, in_lens, tgt_lens):
        return F.ctc_loss(log_probs, targets, in_lens, tgt_lens)


def ctc_short_lengths(fixed=False):
    lp = torch.randn(25, 3, 6).log_softmax(-1)
    return CTCShortLengths(), (lp, torch.randint(1, 6, (3, 5)), torch.full((2,), 25, dtype=torch.long),
                               torch.full((3,), 5, dtype=torch.long))


class OtherHorizon(nn.Module):
    """A target for 5 steps ahead against a 12-step prediction: squeezing would not make them agree."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 12)

    def forward(self, x, y):
        return F.mse_loss(self.fc(x), y)


def other_horizon(fixed=False):
    return OtherHorizon(), (torch.randn(8, 3), torch.randn(8, 5, 1))


class BagBadOffsets(nn.Module):
    """Offsets that are neither starts nor lengths (they do not add up to the ids)."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 8, mode="mean")

    def forward(self, ids, offsets):
        return self.bag(ids, offsets)


def bag_bad_offsets(fixed=False):
    return BagBadOffsets(), (torch.arange(9), torch.tensor([1, 4, 6]))


NEAR_MISSES = {f.__name__: f for f in (patch_wrong_head, vae_wide_latent, reparameterise, flat_rgb,
                                       ctc_short_lengths, other_horizon, bag_bad_offsets)}
