"""Broken models and their hand-fixed twins: hypernetworks, ColBERT, multi-task heads,
grouped-query attention, padding, unbatched inputs, id dtypes, pooling and TCNs.

Twin first (what the author meant, plain torch), then the broken class (a subclass wherever the
same state_dict can load into both). The wrong line carries ``# BUG(case-name)`` (``# ALSO(case-name)``
for a second line that is part of the same fix). Sizes are tiny: the whole corpus runs in seconds.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- hypernetworks / retrieval / multi-task ---------------------------------------------------

class HyperLinearTwin(nn.Module):
    """A hypernetwork emits a per-sample (4 x 5) weight and bias from a code z."""

    def __init__(self):
        super().__init__()
        self.hyper = nn.Linear(3, 5 * 4 + 4)

    def params(self, z):
        p = self.hyper(z)
        return p[:, :20].view(-1, 4, 5), p[:, 20:]

    def forward(self, x, z):
        W, b = self.params(z)
        return torch.bmm(W, x.unsqueeze(-1)).squeeze(-1) + b


class HyperLinearBroken(HyperLinearTwin):
    def forward(self, x, z):
        W, b = self.params(z)
        return torch.bmm(W, x).squeeze(-1) + b  # BUG(hypernet_bmm_unsqueeze)


class ColBERTTwin(nn.Module):
    """Late interaction: MaxSim over document tokens (padding masked), summed over query tokens."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(8, 6)
        self.d_proj = nn.Linear(8, 6)

    def embed(self, q, d):
        return F.normalize(self.q_proj(q), dim=-1), F.normalize(self.d_proj(d), dim=-1)

    def forward(self, q, d, dmask):
        qe, de = self.embed(q, d)
        sim = qe @ de.transpose(1, 2)                                    # (B, Lq, Ld)
        sim = sim.masked_fill(~dmask[:, None, :], -1e4)
        return sim.max(dim=-1).values.sum(-1)


class ColBERTMaskBroken(ColBERTTwin):
    def forward(self, q, d, dmask):
        qe, de = self.embed(q, d)
        sim = qe @ de.transpose(1, 2)
        sim = sim.masked_fill(~dmask, -1e4)  # BUG(colbert_doc_mask_broadcast)
        return sim.max(dim=-1).values.sum(-1)


class ColBERTMatmulBroken(ColBERTTwin):
    def forward(self, q, d, dmask):
        qe, de = self.embed(q, d)
        sim = qe @ de  # BUG(colbert_matmul_transpose)
        sim = sim.masked_fill(~dmask[:, None, :], -1e4)
        return sim.max(dim=-1).values.sum(-1)


class MultiTaskTwin(nn.Module):
    """Shared trunk, a binary logit head and a 2-d regression head."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(10, 16)
        self.cls = nn.Linear(16, 1)
        self.reg = nn.Linear(16, 2)

    def forward(self, x):
        h = F.relu(self.trunk(x))
        return self.cls(h), self.reg(h)


def multitask_loss_twin(out, y_bin, y_reg):
    return F.binary_cross_entropy_with_logits(out[0].squeeze(1), y_bin) + F.mse_loss(out[1], y_reg)


def multitask_loss_broken(out, y_bin, y_reg):
    return F.binary_cross_entropy_with_logits(out[0], y_bin) + F.mse_loss(out[1], y_reg)  # BUG(multitask_bce_target_shape)


# --- grouped-query attention ------------------------------------------------------------------

class GQATwin(nn.Module):
    """4 query heads share 2 key/value heads (head dim 4): each kv head serves 2 adjacent heads."""

    def __init__(self, kv_out=8):
        super().__init__()
        self.h, self.hkv, self.hd = 4, 2, 4
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, kv_out)
        self.v = nn.Linear(16, kv_out)
        self.o = nn.Linear(16, 16)

    def heads(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(B, T, self.hkv, self.hd).transpose(1, 2)
        v = self.v(x).view(B, T, self.hkv, self.hd).transpose(1, 2)
        return q, k, v

    def attend(self, q, k, v):
        B, _, T, _ = q.shape
        a = (q @ k.transpose(-2, -1) / self.hd ** 0.5).softmax(-1) @ v
        return self.o(a.transpose(1, 2).reshape(B, T, -1))

    def forward(self, x):
        q, k, v = self.heads(x)
        g = self.h // self.hkv
        return self.attend(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1))


class GQARepeatDimBroken(GQATwin):
    def forward(self, x):
        q, k, v = self.heads(x)
        g = self.h // self.hkv
        k = k.repeat_interleave(g, dim=2)  # BUG(gqa_repeat_interleave_dim)
        v = v.repeat_interleave(g, dim=2)  # ALSO(gqa_repeat_interleave_dim)
        return self.attend(q, k, v)


class GQAProjSizeBroken(GQATwin):
    def __init__(self):
        super().__init__(kv_out=16)  # BUG(gqa_kv_proj_size)


# --- padding, unbatched inputs, ids -----------------------------------------------------------

class SameConvBlockTwin(nn.Module):
    """'same' padding for an even kernel (4): 1 left, 2 right, as torch's padding='same' does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 4)

    def forward(self, x):
        return x + F.relu(self.conv(F.pad(x, (1, 2))))


class SameConvBlockBroken(SameConvBlockTwin):
    def forward(self, x):
        k = self.conv.kernel_size[0]
        return x + F.relu(self.conv(F.pad(x, (k // 2, k // 2))))  # BUG(pad_even_kernel_same)


class KeywordSpotter(nn.Module):
    """A batched model; the broken case feeds it one clip (2, 16) without a batch dim."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, stride=2)                          # 16 -> 7
        self.fc = nn.Linear(4 * 7, 3)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).flatten(1))


class TokPosTwin(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(20, 8)
        self.pos = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, ids):
        pos = torch.arange(ids.size(1))
        return self.head(self.tok(ids) + self.pos(pos))


class TokPosBroken(TokPosTwin):
    def forward(self, ids):
        pos = torch.arange(0, ids.size(1), 1.0)  # BUG(positions_float_embedding)
        return self.head(self.tok(ids) + self.pos(pos))


class SmallClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 5))

    def forward(self, x):
        return self.net(x)


def smoothed_ce_twin(logits, y, eps=0.1):
    soft = torch.full_like(logits, eps / (logits.size(1) - 1)).scatter_(1, y.unsqueeze(1), 1 - eps)
    return -(soft * logits.log_softmax(-1)).sum(-1).mean()


def smoothed_ce_broken(logits, y, eps=0.1):
    soft = torch.full_like(logits, eps / (logits.size(1) - 1)).scatter_(1, y, 1 - eps)  # BUG(label_smoothing_scatter_rank)
    return -(soft * logits.log_softmax(-1)).sum(-1).mean()


class MeanPoolEncoderTwin(nn.Module):
    """Sentence-transformers mean pooling over the non-padding tokens."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 8)
        self.proj = nn.Linear(8, 4)

    def forward(self, ids, mask):
        h = self.emb(ids) * mask.unsqueeze(-1).float()
        pooled = h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return F.normalize(self.proj(pooled), dim=-1)


class MeanPoolEncoderBroken(MeanPoolEncoderTwin):
    def forward(self, ids, mask):
        h = self.emb(ids) * mask.unsqueeze(-1).float()
        pooled = h.sum(1) / mask.sum(1).clamp(min=1)  # BUG(sentence_meanpool_keepdim)
        return F.normalize(self.proj(pooled), dim=-1)


class TCNTwin(nn.Module):
    """Causal TCN: pad (k-1)*d on both sides, crop the right; a 1x1 first layer needs no crop."""

    def __init__(self):
        super().__init__()
        self.pads = [0, 2, 4]
        self.convs = nn.ModuleList([nn.Conv1d(4, 4, 1), nn.Conv1d(4, 4, 3, padding=2),
                                    nn.Conv1d(4, 4, 3, padding=4, dilation=2)])

    def forward(self, x):
        for conv, p in zip(self.convs, self.pads):
            h = conv(x)
            h = h[..., :h.size(-1) - p]
            x = F.relu(h) + x
        return x


class TCNBroken(TCNTwin):
    def forward(self, x):
        for conv, p in zip(self.convs, self.pads):
            h = conv(x)[..., :-p]  # BUG(tcn_causal_crop_zero)
            x = F.relu(h) + x
        return x
