"""Round-4 audit corpus of ``layerlab inspect``'s failure blame: 26 broken models of kinds posted on
forums (written before the rules that now explain them), each with a hand-fixed twin.

``CASES[name](fixed)`` returns ``(model, args, kwargs)``: the broken model (``fixed=False``) or the one
a senior engineer would write (``fixed=True``; the same seed, so the same weights wherever the fix
resizes nothing). ``TRUTH[name]`` records, as written before layerlab ran: where it fails, the cause,
the right first fix and the tempting wrong ones. Used by ``test_audit_round4.py``.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TRUTH = {}
CASES = {}


def case(name, where, cause, fix, wrong):
    def deco(fn):
        CASES[name] = fn
        TRUTH[name] = dict(where=where, cause=cause, fix=fix, wrong=wrong)
        return fn
    return deco


# 1 ---------------------------------------------------------------- U-Net odd size
class TinyUNet(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.mid = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Conv2d(16, 8, 3, padding=1)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        s = F.relu(self.enc(x))
        m = F.relu(self.mid(self.pool(s)))
        if self.fixed:
            u = self.up(m, output_size=s.shape[-2:])
        else:
            u = self.up(m)
        y = torch.cat([u, s], dim=1)
        return self.out(F.relu(self.dec(y)))


@case("unet_odd", where="torch.cat in TinyUNet.forward (skip concat)",
      cause="33x33 input: pool floors to 16, ConvTranspose gives 32 ≠ skip 33",
      fix="up(m, output_size=s.shape[-2:]) (or pad u / crop s)",
      wrong="cat on another dim; change kernel sizes")
def unet_odd(fixed=False):
    torch.manual_seed(0)
    return TinyUNet(fixed), (torch.randn(2, 3, 33, 33),), {}


# 2 ---------------------------------------------------------------- VAE flatten size
class VAE(nn.Module):
    def __init__(self, img=28):
        super().__init__()
        s = img // 4
        self.enc = nn.Sequential(nn.Conv2d(1, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.ReLU(), nn.Flatten())
        self.mu = nn.Linear(64 * s * s, 16)
        self.logvar = nn.Linear(64 * s * s, 16)
        self.dec_fc = nn.Linear(16, 64 * s * s)
        self.dec = nn.Sequential(nn.Unflatten(1, (64, s, s)), nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(32, 1, 4, 2, 1))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        recon = self.dec(self.dec_fc(z))
        return F.mse_loss(recon, x) - 0.5 * torch.mean(1 + logvar - mu ** 2 - logvar.exp())


@case("vae_size", where="mu (Linear) in VAE (flatten 64·8·8=4096 vs 64·7·7=3136)",
      cause="VAE built for 28x28, fed 32x32",
      fix="resize input to 28x28, or build for 32 (mu/logvar in=4096 AND decoder 64·8·8); in_features alone is incomplete",
      wrong="in_features=4096 only (decoder still 28x28 → recon ≠ x)")
def vae_size(fixed=False):
    torch.manual_seed(0)
    if fixed:
        return VAE(img=32), (torch.randn(4, 1, 32, 32),), {}
    return VAE(img=28), (torch.randn(4, 1, 32, 32),), {}


# 3 ---------------------------------------------------------------- seq2seq hidden mismatch
class Seq2Seq(nn.Module):
    def __init__(self, dec_hidden=64, bridge=False):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.encoder = nn.GRU(32, 128, batch_first=True)
        self.bridge = nn.Linear(128, dec_hidden) if bridge else None
        self.decoder = nn.GRU(32, dec_hidden, batch_first=True)
        self.out = nn.Linear(dec_hidden, 50)

    def forward(self, src, tgt):
        _, h = self.encoder(self.emb(src))
        if self.bridge is not None:
            h = torch.tanh(self.bridge(h))
        y, _ = self.decoder(self.emb(tgt), h)
        return self.out(y)


@case("seq2seq_hidden", where="decoder (GRU): hx (1, 4, 128) vs hidden_size 64",
      cause="encoder hidden 128 passed as decoder h0 (hidden 64)",
      fix="decoder hidden_size=128 (then out in_features=128), or a Linear bridge 128→64",
      wrong="slice h[..., :64]; encoder hidden_size=64 silently")
def seq2seq_hidden(fixed=False):
    torch.manual_seed(0)
    src, tgt = torch.randint(0, 50, (4, 9)), torch.randint(0, 50, (4, 7))
    return Seq2Seq(128 if fixed else 64), (src, tgt), {}


# 4 ---------------------------------------------------------------- GRU batch_first fed (T,B,C)
class GRUClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.fc = nn.Linear(32, 5)

    def forward(self, x, y):
        if self.fixed:
            x = x.transpose(0, 1)
        _, h = self.gru(x)
        return F.cross_entropy(self.fc(h[-1]), y)


@case("gru_tbc", where="F.cross_entropy (batch 12 vs 4); root: gru fed (T,B,C) with batch_first=True",
      cause="(T=12, B=4, C) input read as batch 12 by a batch_first GRU",
      fix="x.transpose(0, 1) before gru (or batch_first=False)",
      wrong="reshape/repeat targets; slice logits")
def gru_tbc(fixed=False):
    torch.manual_seed(0)
    return GRUClassifier(fixed), (torch.randn(12, 4, 16), torch.randint(0, 5, (4,))), {}


# 5 ---------------------------------------------------------------- MHA attn_mask (B,T)
class PadAttn(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x, pad):
        if self.fixed:
            return self.attn(x, x, x, key_padding_mask=pad)[0]
        return self.attn(x, x, x, attn_mask=pad)[0]


@case("mha_pad_as_attn_mask", where="attn (MultiheadAttention): attn_mask (2, 10)",
      cause="a (B, S) padding mask passed as attn_mask (wants (L,S) or (B·h,L,S))",
      fix="pass it as key_padding_mask=pad",
      wrong="expand/crop to (10,10); repeat over heads")
def mha_pad_as_attn_mask(fixed=False):
    torch.manual_seed(0)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[1, 7:] = True
    return PadAttn(fixed), (torch.randn(2, 10, 32), pad), {}


# 6 ---------------------------------------------------------------- float keep mask in masked_fill
class HandAttn(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32)

    def forward(self, x, attention_mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, 4, 8).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / 8 ** 0.5
        m = attention_mask[:, None, None, :]
        if self.fixed:
            m = m == 0
        scores = scores.masked_fill(m, float("-inf"))
        y = scores.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


@case("float_keep_mask_fill", where="scores.masked_fill in HandAttn.forward",
      cause="HF-style float mask (1 = keep, 0 = pad) given to masked_fill (needs bool, True = fill)",
      fix="masked_fill(attention_mask[...] == 0, -inf)",
      wrong=".bool() (inverts: masks the real tokens)")
def float_keep_mask_fill(fixed=False):
    torch.manual_seed(0)
    am = torch.ones(2, 6)
    am[1, 4:] = 0
    return HandAttn(fixed), (torch.randn(2, 6, 32), am), {}


# 7 ---------------------------------------------------------------- SDPA given a (B, S) key_padding_mask
class SDPAPad(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32)

    def forward(self, x, key_padding_mask):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 4, 8).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        mask = ~key_padding_mask[:, None, None, :] if self.fixed else key_padding_mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


@case("sdpa_kpm", where="F.scaled_dot_product_attention in SDPAPad.forward",
      cause="a (B, S) key_padding_mask (True = pad, nn.MultiheadAttention convention) given as SDPA attn_mask: wrong shape AND SDPA's bool means True = attend",
      fix="attn_mask=~key_padding_mask[:, None, None, :]",
      wrong="key_padding_mask[:, None, None, :] without ~ (runs, attends only to padding)")
def sdpa_kpm(fixed=False):
    torch.manual_seed(0)
    kpm = torch.zeros(2, 10, dtype=torch.bool)
    kpm[1, 6:] = True
    return SDPAPad(fixed), (torch.randn(2, 10, 32), kpm), {}


# 8 ---------------------------------------------------------------- view after permute
class ChannelsLastHead(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        B = x.shape[0]
        f = self.conv(x).permute(0, 2, 3, 1)
        f = f.reshape(B, -1) if self.fixed else f.view(B, -1)
        return self.fc(f)


@case("view_after_permute", where="f.view(B, -1) in ChannelsLastHead.forward",
      cause="view of a non-contiguous tensor made by permute",
      fix=".reshape(B, -1) (or .contiguous().view)", wrong="drop the permute (changes order vs trained weights)")
def view_after_permute(fixed=False):
    torch.manual_seed(0)
    return ChannelsLastHead(fixed), (torch.randn(2, 3, 6, 6),), {}


# 9 ---------------------------------------------------------------- stack vs cat
class TwoBranch(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Linear(10, 16)
        self.b = nn.Linear(10, 32)
        self.head = nn.Linear(48, 3)

    def forward(self, x):
        fa, fb = self.a(x), self.b(x)
        h = torch.cat([fa, fb], dim=1) if self.fixed else torch.stack([fa, fb], dim=1)
        return self.head(h)


@case("stack_vs_cat", where="torch.stack in TwoBranch.forward",
      cause="stack needs equal shapes; (4,16) and (4,32) are meant to be concatenated (head in=48)",
      fix="torch.cat([fa, fb], dim=1)", wrong="resize branch a to 32 out")
def stack_vs_cat(fixed=False):
    torch.manual_seed(0)
    return TwoBranch(fixed), (torch.randn(4, 10),), {}


# 10 --------------------------------------------------------------- squeeze with batch 1
class PoolMeta(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(20, 2)

    def forward(self, x, meta):
        f = self.pool(self.conv(x))
        f = f.flatten(1) if self.fixed else f.squeeze()
        return self.head(torch.cat([f, meta], dim=1))


@case("squeeze_batch1", where="torch.cat in PoolMeta.forward (f is 1-D)",
      cause="squeeze() also dropped the batch dim (batch size 1)",
      fix="f.flatten(1) (or squeeze(-1).squeeze(-1))", wrong="cat dim=0 / unsqueeze meta")
def squeeze_batch1(fixed=False):
    torch.manual_seed(0)
    return PoolMeta(fixed), (torch.randn(1, 3, 8, 8), torch.randn(1, 4)), {}


# 11 --------------------------------------------------------------- Embedding fed float ids
@case("emb_float_ids", where="0 (Embedding)", cause="float token ids", fix="ids.long()", wrong="none")
def emb_float_ids(fixed=False):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(40, 2))
    ids = torch.randint(0, 20, (3, 5))
    return m, ((ids if fixed else ids.float()),), {}


# 12 --------------------------------------------------------------- Embedding ids >= num_embeddings
class TokClassifier(nn.Module):
    def __init__(self, vocab=100):
        super().__init__()
        self.emb = nn.Embedding(vocab, 16)
        self.fc = nn.Linear(16, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


@case("emb_out_of_range", where="emb (Embedding)", cause="ids up to 119 ≥ num_embeddings 100",
      fix="num_embeddings ≥ 120 (the tokenizer's vocab size)", wrong="clamp / modulo ids")
def emb_out_of_range(fixed=False):
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (3, 8))
    ids[1, 2] = 119
    return TokClassifier(120 if fixed else 100), (ids,), {}


# 13 --------------------------------------------------------------- CE (B,T,C) logits
class Tagger(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(30, 16)
        self.fc = nn.Linear(16, 5)

    def forward(self, ids, tags):
        logits = self.fc(self.emb(ids))
        if self.fixed:
            logits = logits.transpose(1, 2)
        return F.cross_entropy(logits, tags)


@case("ce_btc", where="F.cross_entropy in Tagger.forward",
      cause="(B, T, C) logits; cross_entropy reads classes on dim 1",
      fix="logits.transpose(1, 2) (or flatten both)", wrong="change fc out to 7")
def ce_btc(fixed=False):
    torch.manual_seed(0)
    return Tagger(fixed), (torch.randint(0, 30, (4, 7)), torch.randint(0, 5, (4, 7))), {}


# 14 --------------------------------------------------------------- CE one-hot target wrong shape
class OneHotCE(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.fc = nn.Linear(12, 6)

    def forward(self, x, y):
        target = F.one_hot(y.unsqueeze(1), 6).float()          # (B, 1, 6): the unsqueeze is the bug
        if self.fixed:
            target = target.squeeze(1)
        return nn.CrossEntropyLoss()(self.fc(x), target)


@case("ce_onehot_shape", where="CrossEntropyLoss / F.cross_entropy in OneHotCE.forward",
      cause="one-hot target (B, 1, 6) vs logits (B, 6)",
      fix="target.squeeze(1) → (B, 6) (or pass y indices)", wrong="reshape logits to (B,1,6)/transposes")
def ce_onehot_shape(fixed=False):
    torch.manual_seed(0)
    return OneHotCE(fixed), (torch.randn(4, 12), torch.randint(0, 6, (4,))), {}


# 15 --------------------------------------------------------------- BCE with logits, int targets
class BinHead(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.fc = nn.Linear(8, 3)

    def forward(self, x, y):
        return F.binary_cross_entropy_with_logits(self.fc(x), y.float() if self.fixed else y)


@case("bce_int_target", where="F.binary_cross_entropy_with_logits", cause="int64 targets",
      fix="y.float()", wrong="logits.long()")
def bce_int_target(fixed=False):
    torch.manual_seed(0)
    return BinHead(fixed), (torch.randn(4, 8), torch.randint(0, 2, (4, 3))), {}


# 16 --------------------------------------------------------------- Conv2d fed (B, H, W)
@case("conv_gray_no_channel", where="0 (Conv2d)",
      cause="grayscale (B, H, W) without the channel dim: the batch 4 is read as 4 channels (unbatched)",
      fix="x.unsqueeze(1) → (4, 1, 28, 28)", wrong="in_channels=4 (mixes the batch)")
def conv_gray_no_channel(fixed=False):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    x = torch.randn(4, 28, 28)
    return m, ((x.unsqueeze(1) if fixed else x),), {}


# 17 --------------------------------------------------------------- Linear on NCHW
@case("linear_on_nchw", where="3 (Linear)", cause="Linear applied to (B, 16, 8, 8) without flattening",
      fix="nn.Flatten() before the Linear (flatten(1))", wrong="in_features=8")
def linear_on_nchw(fixed=False):
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
    if fixed:
        layers.append(nn.Flatten())
    layers.append(nn.Linear(16 * 8 * 8, 10))
    return nn.Sequential(*layers), (torch.randn(2, 3, 16, 16),), {}


# 18 --------------------------------------------------------------- GroupNorm channels vs groups
@case("groupnorm_36", where="1 (GroupNorm(8, 32)) fed 36 channels",
      cause="conv makes 36 channels; GroupNorm built for 32 (8 groups; 36 not divisible by 8)",
      fix="GroupNorm(num_groups dividing 36 (4/6/9…), num_channels=36), or conv out_channels=32",
      wrong="num_channels=36 with 8 groups (invalid)")
def groupnorm_36(fixed=False):
    torch.manual_seed(0)
    gn = nn.GroupNorm(6, 36) if fixed else nn.GroupNorm(8, 32)
    return nn.Sequential(nn.Conv2d(3, 36, 3, padding=1), gn, nn.ReLU()), (torch.randn(2, 3, 8, 8),), {}


# 19 --------------------------------------------------------------- ModuleList wrong index
class MLP(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.layers = nn.ModuleList([nn.Linear(64, 128), nn.Linear(128, 256), nn.Linear(256, 10)])

    def forward(self, x):
        for i in range(len(self.layers)):
            x = self.layers[i if self.fixed else i - 1](x)
            if i < 2:
                x = F.relu(x)
        return x


@case("modulelist_index", where="layers.2 (Linear 256→10) called first, on the 64-d model input",
      cause="wrong ModuleList index (layers[i-1]): the last layer runs first",
      fix="index layers[i] (can't be inferred mechanically; a good report says layers.2 ran first on the model input)",
      wrong="in_features=64 on layers.2 (chain of resizes → garbage)")
def modulelist_index(fixed=False):
    torch.manual_seed(0)
    return MLP(fixed), (torch.randn(3, 64),), {}


# 20 --------------------------------------------------------------- depthwise built for the wrong width
class InvRes(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.expand = nn.Conv2d(16, 96, 1)
        c = 96 if fixed else 16
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.project = nn.Conv2d(96, 24, 1)

    def forward(self, x):
        return self.project(F.relu6(self.dw(F.relu6(self.expand(x)))))


@case("depthwise_width", where="dw (Conv2d 16→16, groups=16) fed 96 channels",
      cause="depthwise conv built for the pre-expansion width 16; it gets 96",
      fix="dw = Conv2d(96, 96, 3, groups=96) (in=out=groups=96)",
      wrong="in_channels=96 alone (grouped 96→16 conv, then project in=16: runs, not depthwise)")
def depthwise_width(fixed=False):
    torch.manual_seed(0)
    return InvRes(fixed), (torch.randn(2, 16, 8, 8),), {}


# 21 --------------------------------------------------------------- pooling to 0x0
@case("pool_to_zero", where="the 4th MaxPool2d (6)? map 1x1 → 0x0",
      cause="8x8 input halved 4 times (8→4→2→1→0)",
      fix="input ≥ 16x16, or drop a pool / use AdaptiveAvgPool", wrong="padding on the pool")
def pool_to_zero(fixed=False):
    torch.manual_seed(0)
    layers = []
    for i in range(4):
        layers += [nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1), nn.MaxPool2d(2)]
    m = nn.Sequential(*layers, nn.Flatten(), nn.Linear(8, 5))
    return m, (torch.randn(2, 3, 16 if fixed else 8, 16 if fixed else 8),), {}


# 22 --------------------------------------------------------------- positional embedding too short
class TinyGPT(nn.Module):
    def __init__(self, max_len=16):
        super().__init__()
        self.tok = nn.Embedding(40, 32)
        self.pos = nn.Parameter(torch.zeros(1, max_len, 32))
        self.block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 40)

    def forward(self, ids):
        x = self.tok(ids) + self.pos[:, : ids.shape[1]]
        return self.head(self.block(x))


@case("pos_emb_short", where="tok(ids) + pos[:, :T] in TinyGPT.forward (broadcast 20 vs 16)",
      cause="sequence of 20 tokens, positional table of 16",
      fix="max_len ≥ 20 (pos (1, 20, 32)) or cut ids to 16", wrong="repeat/expand pos; pad")
def pos_emb_short(fixed=False):
    torch.manual_seed(0)
    return TinyGPT(20 if fixed else 16), (torch.randint(0, 40, (2, 20)),), {}


# 23-25 ------------------------------------------------------------ Hugging Face
def _vit():
    from transformers import ViTConfig, ViTModel
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=64)
    return ViTModel(cfg).eval()


@case("hf_vit_nhwc", where="ViT embeddings.patch_embeddings", cause="pixel_values NHWC (2,16,16,3)",
      fix="pixel_values.permute(0, 3, 1, 2)", wrong="num_channels=16")
def hf_vit_nhwc(fixed=False):
    m = _vit()
    x = torch.randn(2, 3, 16, 16)
    return m, (), {"pixel_values": x if fixed else x.permute(0, 2, 3, 1)}


@case("hf_vit_gray", where="ViT embeddings.patch_embeddings", cause="1-channel images for a 3-channel ViT",
      fix="repeat the gray channel to 3 (x.expand(-1, 3, -1, -1)) or num_channels=1 for a from-scratch model",
      wrong="permute (1 is not on another axis)")
def hf_vit_gray(fixed=False):
    m = _vit()
    x = torch.randn(2, 1, 16, 16)
    return m, (), {"pixel_values": x.expand(-1, 3, -1, -1) if fixed else x}


def _bert(type_vocab_size=2):
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, type_vocab_size=type_vocab_size)
    return BertModel(cfg).eval()


@case("hf_bert_token_type", where="embeddings.token_type_embeddings (Embedding(2, 32))",
      cause="token_type_ids contain 2 (3 segments) but type_vocab_size=2",
      fix="type_vocab_size=3 (or ids in {0,1})", wrong="clamp ids")
def hf_bert_token_type(fixed=False):
    m = _bert(3 if fixed else 2)
    torch.manual_seed(1)
    ids = torch.randint(0, 50, (2, 9))
    tt = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2, 2]] * 2)
    return m, (), {"input_ids": ids, "token_type_ids": tt}


def _bert_cls():
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, num_labels=3)
    return BertForSequenceClassification(cfg).eval()


@case("hf_onehot_labels", where="BertForSequenceClassification loss (cross_entropy: batch 2 vs 6)",
      cause="labels one-hot int64 (2, 3): HF flattens to 6 class indices",
      fix="labels.argmax(-1) (class indices (2,))", wrong="labels.float() (turns it into multi-label BCE: runs, another task)")
def hf_onehot_labels(fixed=False):
    m = _bert_cls()
    ids = torch.randint(0, 50, (2, 9))
    y = torch.tensor([2, 0])
    lab = F.one_hot(y, 3)
    return m, (), {"input_ids": ids, "labels": y if fixed else lab}
