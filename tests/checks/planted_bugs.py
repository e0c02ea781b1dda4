"""A gallery of layers with one planted bug each, next to the correct layer they should equal.

Each bug is one a person writing a layer by hand really makes. Every factory returns
``(buggy_module, inputs, verify_kwargs)`` so a test can call ``verify(module, *inputs, **kwargs)``;
``test_planted_bugs.py`` asserts which check catches each bug and where it points.

Letters: B batch · T time · E embedding · H hidden · I input features.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


# -- 1. LSTM with the gate order swapped -------------------------------------------------------------

class SwappedGateLSTM(nn.Module):
    """One-layer LSTM written out, torch's parameter names. BUG: the stacked gates are read as
    (i, f, o, g) instead of torch's (i, f, g, o)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers, self.batch_first = input_size, hidden_size, 1, True
        H = hidden_size
        k = 1 / math.sqrt(H)
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * H, input_size).uniform_(-k, k))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * H, H).uniform_(-k, k))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * H).uniform_(-k, k))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * H).uniform_(-k, k))

    def forward(self, input: Tensor, hx=None):
        B, T, _ = input.shape
        H = self.hidden_size
        if hx is None:
            h = input.new_zeros(B, H)
            c = input.new_zeros(B, H)
        else:
            h, c = hx[0][0], hx[1][0]
        outs = []
        for t in range(T):
            gates = F.linear(input[:, t], self.weight_ih_l0, self.bias_ih_l0) + F.linear(h, self.weight_hh_l0,
                                                                                       self.bias_hh_l0)
            i, f, o, g = gates.chunk(4, dim=1)  # BUG: torch stacks (i, f, g, o)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, 1), (h.unsqueeze(0), c.unsqueeze(0))


def swapped_gate_lstm():
    torch.manual_seed(0)
    layer = SwappedGateLSTM(5, 6)
    return layer, (torch.randn(3, 4, 5),), {"reference": nn.LSTM(5, 6, batch_first=True)}


# -- 2. Linear with the weight transposed ---------------------------------------------------------------

class TransposedLinear(nn.Module):
    """``nn.Linear``'s parameters. BUG: computes ``x @ W`` instead of ``x @ W.T`` (square, so it runs)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.in_features = self.out_features = features
        ref = nn.Linear(features, features)
        self.weight = nn.Parameter(ref.weight.detach().clone())
        self.bias = nn.Parameter(ref.bias.detach().clone())

    def forward(self, input: Tensor) -> Tensor:
        return input @ self.weight + self.bias  # BUG: should be input @ self.weight.T


def transposed_linear():
    torch.manual_seed(0)
    return TransposedLinear(6), (torch.randn(4, 6),), {"reference": nn.Linear(6, 6)}


# -- 3. causal self-attention whose mask is off by one ------------------------------------------------

class OffByOneCausalAttention(nn.Module):
    """Single-head causal self-attention over (B, T, E). BUG: ``triu(diagonal=2)`` lets position t
    see t + 1."""

    causal = True

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        B, T, E = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, T, E) each
        scores = q @ k.transpose(-2, -1) / math.sqrt(E)  # (B, T, T)
        blocked = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=2)  # BUG: diagonal=1
        scores = scores.masked_fill(blocked, float("-inf"))
        return self.proj(scores.softmax(-1) @ v)


def off_by_one_causal():
    torch.manual_seed(0)
    return OffByOneCausalAttention(8), (torch.randn(2, 6, 8),), {}


# -- 4. a block whose "LayerNorm" normalises over the batch ----------------------------------------------

class BatchStatNorm(nn.Module):
    """LayerNorm's parameters. BUG: mean and variance over dim 0 (the batch), not the features."""

    def __init__(self, features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(0, keepdim=True)  # BUG: should be x.mean(-1, keepdim=True)
        var = x.var(0, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class NormBlock(nn.Module):
    """proj → norm → GELU; with the bug inside ``norm``."""

    def __init__(self, features: int, norm: nn.Module) -> None:
        super().__init__()
        self.proj = nn.Linear(features, features)
        self.norm = norm
        self.act = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.proj(x)))


def norm_over_batch():
    torch.manual_seed(0)
    return NormBlock(8, BatchStatNorm(8)), (torch.randn(4, 8),), {}


# -- 5. a custom autograd.Function whose backward drops a factor -----------------------------------------

class _TwiceProduct(torch.autograd.Function):
    """y = 2·x·w. BUG: the gradient for w drops the factor 2."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return 2 * x * w

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w = ctx.saved_tensors
        grad_x = grad * 2 * w
        grad_w = (grad * x).sum(0)  # BUG: should be (grad * 2 * x).sum(0)
        return grad_x, grad_w


class DoubleScale(nn.Module):
    """A learnable per-feature scale, times two, through the custom Function."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x: Tensor) -> Tensor:
        return _TwiceProduct.apply(x, self.weight)


def dropped_factor_function():
    torch.manual_seed(0)
    return DoubleScale(5), (torch.randn(3, 5),), {}


# -- 6. multi-head attention without the 1/√d scale ----------------------------------------------------

class UnscaledMultiheadAttention(nn.Module):
    """``nn.MultiheadAttention``'s parameters and call (batch_first). BUG: no ``1/√d_head``."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, True
        ref = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.in_proj_weight = nn.Parameter(ref.in_proj_weight.detach().clone())
        self.in_proj_bias = nn.Parameter(ref.in_proj_bias.detach().clone())
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj.load_state_dict(ref.out_proj.state_dict())

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        B, T, E = query.shape
        S = key.shape[1]
        h, d = self.num_heads, E // self.num_heads
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)
        q = F.linear(query, wq, bq).view(B, T, h, d).transpose(1, 2)  # (B, h, T, d)
        k = F.linear(key, wk, bk).view(B, S, h, d).transpose(1, 2)  # (B, h, S, d)
        v = F.linear(value, wv, bv).view(B, S, h, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1)  # BUG: missing / math.sqrt(d)
        if attn_mask is not None:
            scores = scores + attn_mask if attn_mask.is_floating_point() else scores.masked_fill(attn_mask, float("-inf"))
        weights = scores.softmax(-1)  # (B, h, T, S)
        out = (weights @ v).transpose(1, 2).reshape(B, T, E)
        return self.out_proj(out), (weights.mean(1) if need_weights else None)


def unscaled_attention():
    torch.manual_seed(0)
    layer = UnscaledMultiheadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    return layer, (x, x, x), {"reference": nn.MultiheadAttention(8, 2, batch_first=True)}


# -- 7. a residual block whose branch input is detached ------------------------------------------------

class PreNormResidual(nn.Module):
    """``x + proj(norm(x))``."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.proj = nn.Linear(features, features)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.proj(self.norm(x))


class DetachedResidual(PreNormResidual):
    """BUG: the residual branch's normalised input is detached, so ``norm`` never learns."""

    def forward(self, x: Tensor) -> Tensor:
        return x + self.proj(self.norm(x).detach())  # BUG: .detach() cuts norm off the graph


def detached_residual():
    torch.manual_seed(0)
    return DetachedResidual(8), (torch.randn(3, 8),), {"reference": PreNormResidual(8)}


# -- extras: the recurrent-state contract and the mask convention ----------------------------------------

class BatchFirstStateRNN(nn.Module):
    """Elman RNN (tanh), ``batch_first``, torch's names. BUG: returns ``h_n`` as (B, 1, H)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers, self.batch_first = input_size, hidden_size, 1, True
        self.nonlinearity = "tanh"
        self.cell = nn.RNNCell(input_size, hidden_size)

    def forward(self, input: Tensor, hx=None):
        B, T, _ = input.shape
        h = input.new_zeros(B, self.hidden_size) if hx is None else hx[0]
        outs = []
        for t in range(T):
            h = self.cell(input[:, t], h)
            outs.append(h)
        return torch.stack(outs, 1), h.unsqueeze(1)  # BUG: torch's h_n is (num_layers, B, H): unsqueeze(0)


def batch_first_state_rnn():
    torch.manual_seed(0)
    return BatchFirstStateRNN(4, 5), (torch.randn(3, 6, 4),), {}


class TruncatedRNN(BatchFirstStateRNN):
    """BUG: the hidden state is detached between steps (truncated backprop through time)."""

    def forward(self, input: Tensor, hx=None):
        B, T, _ = input.shape
        h = input.new_zeros(1, B, self.hidden_size) if hx is None else hx
        h = h[0]
        outs = []
        for t in range(T):
            h = self.cell(input[:, t], h.detach() if t < T - 1 and t > 0 else h)  # BUG: .detach()
            outs.append(h)
        return torch.stack(outs, 1), h.unsqueeze(0)


def truncated_rnn():
    torch.manual_seed(0)
    return TruncatedRNN(4, 5), (torch.randn(3, 6, 4),), {}


class InvertedMaskAttention(UnscaledMultiheadAttention):
    """Scaled correctly, but BUG: a bool ``attn_mask`` is read as SDPA's True = attend."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        B, T, E = query.shape
        S = key.shape[1]
        h, d = self.num_heads, E // self.num_heads
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)
        q = F.linear(query, wq, bq).view(B, T, h, d).transpose(1, 2)
        k = F.linear(key, wk, bk).view(B, S, h, d).transpose(1, 2)
        v = F.linear(value, wv, bv).view(B, S, h, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))  # BUG: nn.MultiheadAttention blocks True
            else:
                scores = scores + attn_mask
        weights = scores.softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(B, T, E)
        return self.out_proj(out), (weights.mean(1) if need_weights else None)


def inverted_mask_attention():
    torch.manual_seed(0)
    layer = InvertedMaskAttention(8, 2)
    x = torch.randn(2, 5, 8)
    return layer, (x, x, x), {"reference": nn.MultiheadAttention(8, 2, batch_first=True)}


# -- 8. a GRU cell with the reset and update gates swapped, called as forward(x, h) -------------------

class SwappedGateGRUCell(nn.Module):
    """``nn.GRUCell``'s parameters and attributes; ``forward(x, h)``. BUG: reads the stacked gates
    as (z, r, n) instead of torch's (r, z, n)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        ref = nn.GRUCell(input_size, hidden_size)
        for name, p in ref.named_parameters():
            self.register_parameter(name, nn.Parameter(p.detach().clone()))

    def forward(self, x: Tensor, h: Tensor) -> Tensor:
        gi = F.linear(x, self.weight_ih, self.bias_ih)  # (B, 3H)
        gh = F.linear(h, self.weight_hh, self.bias_hh)
        i_z, i_r, i_n = gi.chunk(3, 1)  # BUG: torch stacks (r, z, n)
        h_z, h_r, h_n = gh.chunk(3, 1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * h


def swapped_gate_gru_cell():
    torch.manual_seed(0)
    layer = SwappedGateGRUCell(4, 5)
    inputs = {"x": torch.randn(3, 4), "h": torch.randn(3, 5)}  # passed by keyword, as a spec would
    return layer, (), {"reference": nn.GRUCell(4, 5), **inputs}


# -- 9. LayerNorm with the unbiased variance -------------------------------------------------------------

class UnbiasedLayerNorm(nn.Module):
    """``nn.LayerNorm``'s attributes and parameters. BUG: ``x.var(-1)`` is unbiased (÷(N−1)); torch's
    LayerNorm divides by N."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.normalized_shape, self.eps = (normalized_shape,), eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True)  # BUG: unbiased=True by default
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def unbiased_layernorm():
    torch.manual_seed(0)
    return UnbiasedLayerNorm(16), (torch.randn(4, 16),), {"reference": nn.LayerNorm(16)}


class NormInBlock(NormBlock):
    """proj → norm → GELU with the unbiased-variance norm inside (the reference: ``nn.LayerNorm``)."""


def unbiased_norm_in_block():
    torch.manual_seed(0)
    block = NormInBlock(16, UnbiasedLayerNorm(16))
    reference = NormBlock(16, nn.LayerNorm(16))
    return block, (torch.randn(4, 16),), {"reference": reference}


# -- 10. a sinusoidal positional table built wrong, kept in a buffer ------------------------------------

class SinusoidalPositionalEncoding(nn.Module):
    """``x + pe[:T]`` with the table of "Attention is all you need", a persistent buffer."""

    def __init__(self, embed_dim: int, max_len: int = 64) -> None:
        super().__init__()
        self.register_buffer("pe", self.table(embed_dim, max_len))

    @staticmethod
    def table(embed_dim: int, max_len: int) -> Tensor:
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (T, 1)
        freq = torch.exp(torch.arange(0, embed_dim, 2, dtype=torch.float32) * (-math.log(10000.0) / embed_dim))
        pe = torch.zeros(max_len, embed_dim)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)
        return pe

    def forward(self, x: Tensor) -> Tensor:  # (B, T, E)
        return x + self.pe[: x.shape[1]]


class WrongFrequencyPositionalEncoding(SinusoidalPositionalEncoding):
    """BUG: the frequencies use ``log(10000) / (embed_dim / 2)``: every pair's wavelength is off."""

    @staticmethod
    def table(embed_dim: int, max_len: int) -> Tensor:
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, embed_dim, 2, dtype=torch.float32) * (-math.log(10000.0) / (embed_dim / 2)))
        pe = torch.zeros(max_len, embed_dim)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)
        return pe


def wrong_positional_table():
    torch.manual_seed(0)
    return (WrongFrequencyPositionalEncoding(8), (torch.randn(2, 6, 8),),
            {"reference": SinusoidalPositionalEncoding(8)})


# -- 11. a 1-D convolution that pads by replicating the edge ---------------------------------------------

class ReplicatePadConv1d(nn.Module):
    """``nn.Conv1d``'s attributes and parameters, ``padding=1, padding_mode="zeros"``. BUG: pads by
    replicating the edge value, so the first and last positions see the wrong neighbour."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, (3,)
        self.stride, self.padding, self.dilation, self.groups, self.padding_mode = (1,), (1,), (1,), 1, "zeros"
        ref = nn.Conv1d(in_channels, out_channels, 3)
        self.weight = nn.Parameter(ref.weight.detach().clone())  # (C_out, C_in, 3)
        self.bias = nn.Parameter(ref.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:  # (B, C, L)
        return F.conv1d(F.pad(x, (1, 1), mode="replicate"), self.weight, self.bias)  # BUG: zeros


def replicate_pad_conv1d():
    torch.manual_seed(0)
    return ReplicatePadConv1d(3, 4), (torch.randn(2, 3, 10),), {"reference": nn.Conv1d(3, 4, 3, padding=1)}


#: the issue's gallery: name → factory
GALLERY = {
    "swapped_gate_lstm": swapped_gate_lstm,
    "transposed_linear": transposed_linear,
    "off_by_one_causal": off_by_one_causal,
    "norm_over_batch": norm_over_batch,
    "dropped_factor_function": dropped_factor_function,
    "unscaled_attention": unscaled_attention,
    "detached_residual": detached_residual,
    "batch_first_state_rnn": batch_first_state_rnn,
    "truncated_rnn": truncated_rnn,
    "inverted_mask_attention": inverted_mask_attention,
    "swapped_gate_gru_cell": swapped_gate_gru_cell,
    "unbiased_layernorm": unbiased_layernorm,
    "unbiased_norm_in_block": unbiased_norm_in_block,
    "wrong_positional_table": wrong_positional_table,
    "replicate_pad_conv1d": replicate_pad_conv1d,
}

#: bugs in layers that plainly mirror a torch.nn layer: the auto-reference must catch them unaided
MIRRORS_TORCH = {
    "swapped_gate_lstm": "torch.nn.LSTM",
    "transposed_linear": "torch.nn.Linear",
    "unscaled_attention": "torch.nn.MultiheadAttention",
    "swapped_gate_gru_cell": "torch.nn.GRUCell",
    "unbiased_layernorm": "torch.nn.LayerNorm",
    "replicate_pad_conv1d": "torch.nn.Conv1d",
    "truncated_rnn": "torch.nn.RNN",
}
