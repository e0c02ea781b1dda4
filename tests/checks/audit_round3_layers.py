"""Audit round 3 layers: hand-written layers with one planted bug each, and correct layers that are hard
to verify (used by tests/checks/test_audit_round3.py).

Written independently of layerlab's own planted bugs, before reading the check code. Each buggy layer's
docstring or comment names its bug; the tests compute the truth about each with plain torch.

Legend: B batch · T positions · C channels · G groups · D features.
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

D = 6

# ---------------- buggy ----------------
class _SwishFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * s            # BUG: forgets the x*s*(1-s) term

class FusedSwish(nn.Module):
    def forward(self, x):
        return _SwishFn.apply(x)

class _BiasAddFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b):
        return x + b
    @staticmethod
    def backward(ctx, g):
        return g, g[0]          # BUG: grad of the broadcast bias = first sample only, not the sum

class BiasAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(D))
    def forward(self, x):
        return _BiasAddFn.apply(x, self.bias)

class _ScaleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * w).sum(0)   # BUG: grad of w uses w where x belongs

class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D) + 2.0)
    def forward(self, x):
        return _ScaleFn.apply(x, self.weight)

class _MatmulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[1]:      # BUG: index of w used to gate x's gradient
            gx = g @ w
        if ctx.needs_input_grad[1]:
            gw = g.t() @ x
        return gx, gw

class FrozenProj(nn.Module):
    """Projection whose weight is frozen (requires_grad False): x's gradient silently vanishes."""
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, D) / D ** 0.5, requires_grad=False)
    def forward(self, x):
        return _MatmulFn.apply(x, self.weight)

def rope_reference(x):
    """Correct rotate-half RoPE on (B, T, D)."""
    B, T, Dm = x.shape
    half = Dm // 2
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], -1)
    return x * cos + rot * sin

class Rope(nn.Module):
    def forward(self, x):
        B, T, Dm = x.shape
        half = Dm // 2
        inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        rot = torch.cat([x2, -x1], -1)          # BUG: rotation sign flipped
        return x * cos + rot * sin

class LeakyCausalAttention(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.is_causal = True
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, -1)
        att = q @ k.transpose(-1, -2) / math.sqrt(C)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=2)   # BUG: sees t+1
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return att @ v

class GRUCell(nn.Module):
    def __init__(self, input_size=5, hidden_size=4):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih = nn.Parameter(torch.randn(3 * hidden_size, input_size) * 0.3)
        self.weight_hh = nn.Parameter(torch.randn(3 * hidden_size, hidden_size) * 0.3)
        self.bias_ih = nn.Parameter(torch.randn(3 * hidden_size) * 0.3)
        self.bias_hh = nn.Parameter(torch.randn(3 * hidden_size) * 0.3)
    def forward(self, x, h):
        gi = F.linear(x, self.weight_ih, self.bias_ih)
        i_r, i_z, i_n = gi.chunk(3, -1)
        w_r, w_z, w_n = self.weight_hh.chunk(3, 0)
        b_r, b_z, b_n = self.bias_hh.chunk(3, 0)
        r = torch.sigmoid(i_r + h @ w_r.t() + b_r)
        z = torch.sigmoid(i_z + h @ w_z.t() + b_z)
        n = torch.tanh(i_n + r * (h @ w_n.t()) + b_n)   # BUG: torch has r * (W_hn h + b_hn)
        return (1 - z) * n + z * h

class GroupNorm(nn.Module):
    def __init__(self, num_groups=2, num_channels=6, eps=1e-5):
        super().__init__()
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = nn.Parameter(torch.ones(num_channels) + 0.1 * torch.randn(num_channels))
        self.bias = nn.Parameter(0.1 * torch.randn(num_channels))
    def forward(self, x):
        B, C, L = x.shape
        G = self.num_groups
        xg = x.view(B, C // G, G, L).transpose(1, 2)    # BUG: interleaved channels per group
        mu = xg.mean((2, 3), keepdim=True)
        var = xg.var((2, 3), unbiased=False, keepdim=True)
        y = ((xg - mu) / torch.sqrt(var + self.eps)).transpose(1, 2).reshape(B, C, L)
        return y * self.weight[None, :, None] + self.bias[None, :, None]

class Conv2d(nn.Module):
    def __init__(self, in_channels=2, out_channels=3, kernel_size=3, padding=1):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.padding, self.stride = (kernel_size, kernel_size), (padding, padding), (1, 1)
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size) * 0.3)
        self.bias = nn.Parameter(torch.randn(out_channels) * 0.1)
    def forward(self, x):
        B, C, H, W = x.shape
        k = self.kernel_size[0]
        cols = F.unfold(x, k, padding=self.padding[0])                  # (B, C*k*k, L)
        w = self.weight.flip(-1, -2).reshape(self.out_channels, -1)   # BUG: true convolution (flipped kernel)
        out = (w @ cols) + self.bias[:, None]
        return out.view(B, self.out_channels, H, W)

class GELU(nn.Module):
    def forward(self, x):   # BUG: tanh approximation, torch.nn.GELU() default is exact erf
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

class TanhHalf(nn.Module):
    """tanh written as 2·(tanh/2) with an in-place .data edit: autograd's saved tanh output is changed."""
    def forward(self, x):
        t = torch.tanh(x)
        t.data.mul_(0.5)        # BUG: tanh's backward uses its saved (now halved) output: 1 - t^2 is wrong
        return t * 2.0

class FeatureNorm(nn.Module):
    """Meant as a BatchNorm with running stats; uses the batch's statistics in eval mode too."""
    def __init__(self, n=D):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))
    def forward(self, x):
        mu = x.mean(0)                                  # BUG: batch statistics in eval too
        var = x.var(0, unbiased=False)
        return (x - mu) / torch.sqrt(var + 1e-5) * self.weight + self.bias

class NoisyProj(nn.Module):
    """A projection that adds noise always (no dropout, not gated on training)."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
    def forward(self, x):
        return self.lin(x) + 0.01 * torch.randn_like(x)     # BUG: nondeterministic in eval

# ---------------- correct ----------------
def conv_odd():
    return nn.Conv2d(4, 6, kernel_size=(3, 2), padding="same", dilation=(2, 1), groups=2, padding_mode="reflect")

def mha_kdim():
    return nn.MultiheadAttention(8, 2, kdim=5, vdim=3, batch_first=True)

class RMSNorm(nn.Module):
    def __init__(self, dim=16, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.normalized_shape = (dim,)
        self.weight = nn.Parameter(torch.ones(dim))
    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)

class KinkLayer(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 0.5 * x.abs()

def llama_attention():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    cfg = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
                      vocab_size=10, num_hidden_layers=1)
    cfg._attn_implementation = "eager"
    return LlamaAttention(cfg, layer_idx=0), LlamaRotaryEmbedding(cfg)

class PermutedLinear(nn.Module):
    """Correct: permutes features with an int64 index buffer, counts calls in an int buffer."""
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("perm", torch.randperm(D, generator=g))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.lin = nn.Linear(D, D)
    def forward(self, x):
        self.calls += 1
        return self.lin(x.index_select(-1, self.perm))

class SafeLog(nn.Module):
    """log for positives, identity otherwise: x.log() is NaN in the unused branch."""
    def forward(self, x):
        return torch.where(x > 0, x.log(), x)

def lstm_proj():
    return nn.LSTM(5, 6, num_layers=2, bidirectional=True, proj_size=3)
