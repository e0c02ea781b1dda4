"""Round-7 audit cases of ``layerlab inspect``'s failure blame: 15 broken models of the kind people post
about (written from the README alone, and graded before any rule was read), each ``build(fixed)``
returning ``(model, inputs)``; ``fixed=True`` is the hand-fixed twin with the same parameter names
(``load_state_dict`` carries the weights). The ``near_*`` builders at the end are near misses where a
rule must *not* give its fix. The rotary and BERT cases need ``transformers``.
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence


# 1. diffusion U-Net res block: time embedding (B, C) added to (B, C, H, W)
class TimeResBlock(nn.Module):
    def __init__(self, ch=32, tdim=16, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.time_mlp = nn.Sequential(nn.SiLU(), nn.Linear(tdim, ch))
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x, t_emb):
        h = self.conv1(F.silu(x))
        t = self.time_mlp(t_emb)
        if self.fixed:
            t = t[:, :, None, None]
        h = h + t
        return x + self.conv2(F.silu(h))


def case_unet_time(fixed=False):
    torch.manual_seed(0)
    return TimeResBlock(fixed=fixed), (torch.randn(2, 32, 8, 8), torch.randn(2, 16))


# 2. rotary table built for d_model, applied to (B, H, T, d) heads (HF apply_rotary_pos_emb)
class RotaryAttention(nn.Module):
    def __init__(self, d_model=64, n_heads=4, fixed=False):
        super().__init__()
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        self.apply_rope = apply_rotary_pos_emb
        self.h, self.d = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        dim = self.d if fixed else d_model
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.h, self.d).transpose(1, 2)
        k = k.view(B, T, self.h, self.d).transpose(1, 2)
        v = v.view(B, T, self.h, self.d).transpose(1, 2)
        freqs = torch.outer(torch.arange(T, dtype=torch.float32), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)            # (T, dim)
        cos, sin = emb.cos()[None], emb.sin()[None]         # (1, T, dim)
        q, k = self.apply_rope(q, k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def case_rotary(fixed=False):
    torch.manual_seed(0)
    return RotaryAttention(fixed=fixed), (torch.randn(2, 10, 64),)


# 3. GNN message passing with edge_index given as (E, 2) instead of (2, E)
class WeightedGCNLayer(nn.Module):
    def __init__(self, fin=8, fout=16, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.lin = nn.Linear(fin, fout)

    def forward(self, x, edge_index, edge_weight):
        if self.fixed:
            edge_index = edge_index.t()
        src, dst = edge_index[0], edge_index[1]
        h = self.lin(x)
        msg = h[src] * edge_weight[:, None]
        out = torch.zeros_like(h).index_add_(0, dst, msg)
        return F.relu(out)


def case_gnn_edge_index(fixed=False):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 6, (12, 2), generator=g)      # (E, 2): the bug
    return WeightedGCNLayer(fixed=fixed), (torch.randn(6, 8), edge_index, torch.rand(12))


# 4. YOLO-style head: class logits reshaped with anchors last instead of classes
class AnchorHead(nn.Module):
    def __init__(self, ch=16, num_anchors=3, num_classes=5, fixed=False):
        super().__init__()
        self.A, self.K, self.fixed = num_anchors, num_classes, fixed
        self.cls = nn.Conv2d(ch, num_anchors * num_classes, 1)
        self.box = nn.Conv2d(ch, num_anchors * 4, 1)

    def forward(self, feat):
        B = feat.shape[0]
        box = self.box(feat).permute(0, 2, 3, 1).reshape(B, -1, 4)
        last = self.K if self.fixed else self.A
        cls = self.cls(feat).permute(0, 2, 3, 1).reshape(B, -1, last)
        return torch.cat([box, cls], dim=-1)


def case_anchor_head(fixed=False):
    torch.manual_seed(0)
    return AnchorHead(fixed=fixed), (torch.randn(2, 16, 8, 8),)


# 5. Siamese BERT: cosine similarity over the batch (dim=0), BCE loss inside forward
class SiameseBert(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        from transformers import BertConfig, BertModel
        cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=37, max_position_embeddings=16)
        self.encoder = BertModel(cfg)
        self.scale = nn.Parameter(torch.tensor(5.0))
        self.dim = 1 if fixed else 0

    def embed(self, ids):
        return self.encoder(input_ids=ids).last_hidden_state.mean(dim=1)

    def forward(self, ids_a, ids_b, labels):
        sim = F.cosine_similarity(self.embed(ids_a), self.embed(ids_b), dim=self.dim)
        return F.binary_cross_entropy_with_logits(self.scale * sim, labels)


def case_siamese(fixed=False):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return SiameseBert(fixed=fixed), (torch.randint(0, 50, (4, 7), generator=g),
                                      torch.randint(0, 50, (4, 7), generator=g),
                                      torch.tensor([1.0, 0.0, 1.0, 0.0]))


# 6. image + tabular: concatenated before flattening the image features
class ImageTabular(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.tab = nn.Sequential(nn.Linear(5, 16), nn.ReLU())
        self.head = nn.Linear(8 * 8 * 8 + 16, 2)

    def forward(self, img, tab):
        f = self.cnn(img)
        if self.fixed:
            f = f.flatten(1)
        z = torch.cat([f, self.tab(tab)], dim=1)
        return self.head(z)


def case_image_tabular(fixed=False):
    torch.manual_seed(0)
    return ImageTabular(fixed=fixed), (torch.randn(2, 3, 16, 16), torch.randn(2, 5))


# 7. depthwise-separable block: pointwise conv built out_ch -> out_ch (64x64 maps: 64 on H and W)
class DWSeparable(nn.Module):
    def __init__(self, cin, cout, fixed=False):
        super().__init__()
        self.dw = nn.Conv2d(cin, cin, 3, padding=1, groups=cin)
        self.bn = nn.BatchNorm2d(cin)
        self.pw = nn.Conv2d(cin if fixed else cout, cout, 1)

    def forward(self, x):
        return F.relu(self.pw(F.relu(self.bn(self.dw(x)))))


def case_depthwise(fixed=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), DWSeparable(32, 64, fixed),
                          DWSeparable(64, 128, fixed), nn.AdaptiveAvgPool2d(1))
    # the inputs from their own generator: the broken twin's wider pointwise convs draw more numbers
    return model, (torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1)),)


# 8. cross-attention einsum: value subscripted with the query letter
class EinsumCrossAttention(nn.Module):
    def __init__(self, d=32, heads=4, fixed=False):
        super().__init__()
        self.h, self.fixed = heads, fixed
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.o = nn.Linear(d, d)

    def forward(self, x, ctx):
        B, Tq, D = x.shape
        Tk = ctx.shape[1]
        q = self.q(x).view(B, Tq, self.h, -1).transpose(1, 2)
        k, v = self.kv(ctx).view(B, Tk, 2, self.h, -1).permute(2, 0, 3, 1, 4)
        attn = torch.einsum("bhqd,bhkd->bhqk", q, k).div(math.sqrt(q.shape[-1])).softmax(-1)
        eq = "bhqk,bhkd->bhqd" if self.fixed else "bhqk,bhqd->bhqd"
        out = torch.einsum(eq, attn, v)
        return self.o(out.transpose(1, 2).reshape(B, Tq, D))


def case_einsum(fixed=False):
    torch.manual_seed(0)
    return EinsumCrossAttention(fixed=fixed), (torch.randn(2, 5, 32), torch.randn(2, 7, 32))


# 9. MNIST CNN fed grayscale (B, H, W) without the channel axis
class MnistCNN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(8 * 13 * 13, 10)

    def forward(self, x):
        if self.fixed:
            x = x.unsqueeze(1)
        return self.fc(self.features(x).flatten(1))


def case_grayscale(fixed=False):
    torch.manual_seed(0)
    return MnistCNN(fixed=fixed), (torch.randn(4, 28, 28),)


# 10. Unfold patches (ViT-style) into a Linear sized p*p (forgot the channels); L == p*p
class UnfoldPatchEmbed(nn.Module):
    def __init__(self, p=8, c=3, d=32, fixed=False):
        super().__init__()
        self.unfold = nn.Unfold(kernel_size=p, stride=p)
        self.proj = nn.Linear(c * p * p if fixed else p * p, d)

    def forward(self, img):
        patches = self.unfold(img).transpose(1, 2)     # (B, L, C*p*p)
        return self.proj(patches)


def case_unfold(fixed=False):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))  # the twins' projections differ in size
    return UnfoldPatchEmbed(fixed=fixed), (x,)


# 11. greedy decoder with a KV cache grown on the heads axis
class CachedDecoder(nn.Module):
    def __init__(self, vocab=20, d=32, heads=4, fixed=False):
        super().__init__()
        self.h, self.d, self.cat_dim = heads, d // heads, 2 if fixed else 1
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.lm_head = nn.Linear(d, vocab)

    def step(self, tok, cache):
        x = self.emb(tok)                                   # (B, 1, D)
        B = x.shape[0]
        q, k, v = [t.view(B, 1, self.h, self.d).transpose(1, 2) for t in self.qkv(x).chunk(3, -1)]
        if cache is not None:
            k = torch.cat([cache[0], k], dim=self.cat_dim)
            v = torch.cat([cache[1], v], dim=self.cat_dim)
        att = (q @ k.transpose(-2, -1) / math.sqrt(self.d)).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, 1, -1)
        return self.lm_head(y), (k, v)

    def forward(self, bos, steps: int = 3):
        tok, cache, outs = bos, None, []
        for _ in range(steps):
            logits, cache = self.step(tok, cache)
            tok = logits.argmax(-1)
            outs.append(logits)
        return torch.cat(outs, dim=1)


def case_kv_cache(fixed=False):
    torch.manual_seed(0)
    return CachedDecoder(fixed=fixed), (torch.zeros(2, 1, dtype=torch.long),)


# 12. LayerNorm meant over (C, H, W), built with C only
class ConvLNBlock(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1, stride=2)
        self.norm = nn.LayerNorm([32, 8, 8] if fixed else 32)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, 10))

    def forward(self, x):
        return self.head(F.gelu(self.norm(self.conv(x))))


def case_layernorm(fixed=False):
    torch.manual_seed(0)
    return ConvLNBlock(fixed=fixed), (torch.randn(2, 3, 16, 16),)


# 13. Hugging Face BERT fed float input_ids (built from a float DataFrame)
def case_bert_float_ids(fixed=False):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=37, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg)
    ids = torch.randint(0, 50, (2, 9)).float()
    if fixed:
        ids = ids.long()
    return model, (ids,)


# 14. flow warp: grid_sample with a (B, 2, H, W) flow as the grid
class FlowWarp(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.flow = nn.Conv2d(6, 2, 3, padding=1)

    def forward(self, img, ref):
        grid = torch.tanh(self.flow(torch.cat([img, ref], dim=1)))     # (B, 2, H, W)
        if self.fixed:
            grid = grid.permute(0, 2, 3, 1)
        return F.grid_sample(img, grid, align_corners=False)


def case_grid_sample(fixed=False):
    torch.manual_seed(0)
    return FlowWarp(fixed=fixed), (torch.randn(2, 3, 16, 16), torch.randn(2, 3, 16, 16))


# 15. packed LSTM with unsorted lengths and the default enforce_sorted=True
class PackedLSTMClassifier(nn.Module):
    def __init__(self, vocab=30, d=16, hidden=24, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 2)

    def forward(self, ids):
        lengths = (ids != 0).sum(dim=1)
        packed = pack_padded_sequence(self.emb(ids), lengths, batch_first=True,
                                      enforce_sorted=not self.fixed)
        _, (h, _) = self.lstm(packed)
        return self.fc(h[-1])


def case_packed(fixed=False):
    torch.manual_seed(0)
    ids = torch.tensor([[3, 4, 5, 0, 0], [6, 7, 8, 9, 2], [1, 2, 0, 0, 0], [5, 5, 5, 5, 0]])
    return PackedLSTMClassifier(fixed=fixed), (ids,)


CASES = {
    "unet_time": case_unet_time, "rotary": case_rotary, "gnn_edge_index": case_gnn_edge_index,
    "anchor_head": case_anchor_head, "siamese": case_siamese, "image_tabular": case_image_tabular,
    "depthwise": case_depthwise, "einsum": case_einsum, "grayscale": case_grayscale,
    "unfold": case_unfold, "kv_cache": case_kv_cache, "layernorm": case_layernorm,
    "bert_float_ids": case_bert_float_ids, "grid_sample": case_grid_sample, "packed": case_packed,
}


# -- near misses: the rule must not give its fix --------------------------------------------------
def near_time_per_column(fixed=False):
    """(B, C) with C == W: the embedding may be meant along the last axis, so no [:, :, None, None]."""
    torch.manual_seed(0)
    return TimeResBlock(ch=8, tdim=16), (torch.randn(2, 8, 8, 8), torch.randn(2, 16))


def near_grid_two_rows(fixed=False):
    """A flow on a map 2 pixels high: the pair size sits on dims 1 and 2, no permute can be told."""
    torch.manual_seed(0)
    return FlowWarp(), (torch.randn(2, 3, 2, 16), torch.randn(2, 3, 2, 16))


class ImageTabularPooled(ImageTabular):
    """The head takes pooled channels (8 + 16): flattening would not fit, pooling would."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8 + 16, 2)


def near_image_tabular_pooled(fixed=False):
    torch.manual_seed(0)
    return ImageTabularPooled(), (torch.randn(2, 3, 16, 16), torch.randn(2, 5))
