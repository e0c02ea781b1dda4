r"""Positional encodings: fixed sinusoidal (Vaswani et al., 2017) and a learned table.

Both add a position-dependent vector to every token: ``out[t] = x[t] + P[offset + t]``.

The sinusoidal table, for position ``pos`` and feature pair ``i`` (``0 ≤ 2i < D``)::

    P[pos, 2i]     = sin(pos / base^(2i / D))
    P[pos, 2i + 1] = cos(pos / base^(2i / D))

so each pair of features is a rotation at its own frequency, from 1 rad/position (i = 0) down to
1/base rad/position, and ``P[0] = [0, 1, 0, 1, …]``. With an odd D the last feature is a lone
sine. No torch.nn class implements it; the tests compare against an independent loop.

Dimension letters used in this module:

    B   batch size (absent for unbatched input)
    T   sequence length
    D   embed_dim, features per token
    M   max_len, rows of the table
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._seq_checks import (
    check_dim,
    check_float_dtype,
    check_tensor,
    input_error,
    non_defaults,
    positive_int,
    probability,
    quiet_when_tracing,
    shape_str,
)

__all__ = ["sinusoidal_encoding", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding"]


def sinusoidal_encoding(length: int, dim: int, *, base: float = 10000.0, offset: int = 0,
                        dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    r"""The sinusoidal table :math:`(T, D)` for positions ``offset … offset + length − 1``.

    Computed in float64 and then cast, so float32 tables are correctly rounded even at
    positions in the tens of thousands.

    Args:
        length (int): T, number of positions.
        dim (int): D, features per position.
        base (float, optional): the wavelength base. Default: 10000
        offset (int, optional): the first position. Default: 0
        dtype, device: of the returned table. Default: float32, CPU

    Example::

        >>> sinusoidal_encoding(2, 4)
        tensor([[0.0000, 1.0000, 0.0000, 1.0000],
                [0.8415, 0.5403, 0.0100, 0.9999]])
    """
    pos = torch.arange(offset, offset + length, dtype=torch.float64, device=device).unsqueeze(1)  # (T, 1)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64, device=device)  # (⌈D/2⌉,) = 0, 2, 4, …
    angle = pos * base ** (-two_i / dim)  # (T, ⌈D/2⌉): pos / base^(2i/D)
    table = torch.empty(length, dim, dtype=torch.float64, device=device)  # (T, D)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])  # an odd D has no cosine partner for the last sine
    return table.to(dtype)


class _PositionalBase(nn.Module):
    """Layout handling and checks shared by both encodings."""

    def __init__(self, embed_dim: int, max_len: int, dropout: float, batch_first: bool) -> None:
        super().__init__()
        name = type(self).__name__
        self.embed_dim = positive_int(name, "embed_dim", embed_dim)
        positive_int(name, "max_len", max_len)
        self.batch_first = batch_first
        self.dropout = probability(name, "dropout", dropout)

    @quiet_when_tracing
    def _check(self, x: Tensor, offset: int) -> int:
        """Validate ``x``; return T."""
        name = type(self).__name__
        check_tensor(name, "input", x)
        layout = "[B, T, D] (batch_first=True)" if self.batch_first else "[T, B, D] (batch_first=False)"
        check_dim(name, "input", x, (2, 3), f"3-D {layout} or 2-D [T, D] (unbatched)")
        if x.shape[-1] != self.embed_dim:
            raise input_error(name, "embed_dim", self.embed_dim, x.shape[-1],
                              f"give the input {self.embed_dim} features in its last dim, "
                              f"or build {name} with embed_dim={x.shape[-1]}",
                              context=f"input shape {shape_str(x.shape)}")
        if not x.dtype.is_floating_point:
            raise input_error(name, "input dtype", "a floating dtype", x.dtype,
                              "embed token ids first (e.g. nn.Embedding), then add positions")
        if not isinstance(offset, int) or offset < 0:
            raise input_error(name, "offset", "an int ≥ 0", offset, "pass the position of the first token")
        return x.shape[1] if (x.dim() == 3 and self.batch_first) else x.shape[0]

    def _add(self, x: Tensor, table: Tensor) -> Tensor:
        """``x + table`` with the (T, D) table broadcast over the batch dim, then dropout."""
        if x.dim() == 3 and not self.batch_first:
            table = table.unsqueeze(1)  # (T, 1, D) against (T, B, D)
        out = x + table  # (…, T, …, D)
        return F.dropout(out, self.dropout, self.training) if self.dropout > 0 else out


class SinusoidalPositionalEncoding(_PositionalBase):
    r"""Adds the fixed sinusoidal positional encoding (module docstring has the formula).

    The table lives in a non-persistent buffer ``pe`` of ``max_len`` rows (not in the
    state_dict: it is a pure function of the settings). A longer sequence either extends the
    buffer (``extend=True``: recomputed for the new length, on the input's device) or raises a
    ``ValueError`` naming the lengths.

    Args:
        embed_dim (int): D, features per token.
        max_len (int, optional): M, initial rows of the table. Default: 1024
        dropout (float, optional): dropout on the sum (training mode only). Default: 0.0
        batch_first (bool, optional): input is :math:`(B, T, D)` instead of :math:`(T, B, D)`. Default: ``False``
        base (float, optional): the wavelength base. Default: 10000
        extend (bool, optional): grow the table for longer sequences instead of raising. Default: ``True``

    Forward args:
        input (Tensor): the token embeddings, see Shape.
        offset (int, optional): position of the first token (e.g. when decoding step by step). Default: 0

    Shape:
        - input: :math:`(T, B, D)`, :math:`(B, T, D)` with ``batch_first``, or :math:`(T, D)` (unbatched)
        - output: shaped like input

        where:
            T = sequence length, B = batch size, D = embed_dim

    Attributes:
        pe: buffer :math:`(M, D)`, the table (no parameters).

    Note: many models scale the embeddings by :math:`\sqrt{D}` before adding; do that before
    calling this module if you want it. Extending the buffer also works under ``torch.compile``
    (the new buffer triggers one recompile); a ``torch.jit.trace`` records the table rows it
    used, like any trace.
    """

    def __init__(self, embed_dim: int, max_len: int = 1024, dropout: float = 0.0, batch_first: bool = False,
                 base: float = 10000.0, extend: bool = True, device=None, dtype=None) -> None:
        super().__init__(embed_dim, max_len, dropout, batch_first)
        self.base = float(base)
        self.extend = extend
        table = sinusoidal_encoding(max_len, embed_dim, base=self.base, dtype=dtype or torch.get_default_dtype(),
                                    device=device)
        self.register_buffer("pe", table, persistent=False)  # (M, D)

    @property
    def max_len(self) -> int:
        return self.pe.shape[0]

    def forward(self, input: Tensor, offset: int = 0) -> Tensor:
        T = self._check(input, offset)
        self._ensure_rows(offset + T)
        return self._add(input, self.pe[offset:offset + T].to(input.dtype))  # table (T, D)

    @quiet_when_tracing
    def _ensure_rows(self, needed: int) -> None:
        """Grow the table to ``needed`` rows (or raise with ``extend=False``)."""
        if needed <= self.max_len:
            return
        if not self.extend:
            raise input_error(type(self).__name__, "positions", f"offset + T ≤ max_len = {self.max_len}",
                              f"offset + T = {needed}", f"build it with max_len ≥ {needed}, or with extend=True")
        new_len = max(needed, 2 * self.max_len)  # grow geometrically: few recomputations
        self.pe = sinusoidal_encoding(new_len, self.embed_dim, base=self.base, dtype=self.pe.dtype,
                                      device=self.pe.device)

    @classmethod
    def from_torch(cls, module: nn.Module) -> "SinusoidalPositionalEncoding":
        """Not available: torch.nn has no sinusoidal encoding (raises ``NotImplementedError``)."""
        raise NotImplementedError("SinusoidalPositionalEncoding has no torch.nn counterpart to copy from; "
                                  "build it directly: SinusoidalPositionalEncoding(embed_dim, max_len)")

    def to_torch(self) -> nn.Module:
        """Not available: torch.nn has no sinusoidal encoding (raises ``NotImplementedError``)."""
        raise NotImplementedError("SinusoidalPositionalEncoding has no torch.nn counterpart; "
                                  "it has no weights either: the table is sinusoidal_encoding(T, D)")

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, max_len={self.max_len}" + non_defaults(
            self, {"dropout": 0.0, "batch_first": False, "base": 10000.0, "extend": True})


class LearnedPositionalEmbedding(_PositionalBase):
    r"""Adds a learned vector per position: ``out[t] = x[t] + weight[offset + t]`` (BERT, GPT-2).

    Equal to ``x + nn.Embedding(max_len, D)(torch.arange(offset, offset + T))``; the table is
    called ``weight`` like nn.Embedding's, so :meth:`from_torch` / :meth:`to_torch` copy it
    from / into an :class:`torch.nn.Embedding`. Unlike the sinusoidal table it cannot grow:
    positions beyond ``max_len`` raise.

    Args:
        max_len (int): M, number of positions with a learned vector.
        embed_dim (int): D, features per token.
        dropout (float, optional): dropout on the sum (training mode only). Default: 0.0
        batch_first (bool, optional): input is :math:`(B, T, D)` instead of :math:`(T, B, D)`. Default: ``False``

    Shape:
        - input: :math:`(T, B, D)`, :math:`(B, T, D)` with ``batch_first``, or :math:`(T, D)` (unbatched)
        - output: shaped like input

        where:
            T = sequence length (≤ M − offset), B = batch size, D = embed_dim, M = max_len

    Attributes:
        weight: :math:`(M, D)`, ~ :math:`\mathcal{N}(0, 1)` (nn.Embedding's initialisation)
    """

    def __init__(self, max_len: int, embed_dim: int, dropout: float = 0.0, batch_first: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__(embed_dim, max_len, dropout, batch_first)
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, embed_dim, device=device, dtype=dtype))  # (M, D)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)

    def forward(self, input: Tensor, offset: int = 0) -> Tensor:
        T = self._check(input, offset)
        check_float_dtype(type(self).__name__, "input", input, self.weight.dtype)
        if not torch.jit.is_tracing() and offset + T > self.max_len:  # a trace records no raise
            raise input_error(type(self).__name__, "positions", f"offset + T ≤ max_len = {self.max_len}",
                              f"offset + T = {offset} + {T} = {offset + T}",
                              f"build it with max_len ≥ {offset + T} (a learned table cannot extend), "
                              "or use SinusoidalPositionalEncoding")
        return self._add(input, self.weight[offset:offset + T])  # table (T, D)

    def extra_repr(self) -> str:
        return f"{self.max_len}, {self.embed_dim}" + non_defaults(self, {"dropout": 0.0, "batch_first": False})

    @classmethod
    def from_torch(cls, module: nn.Embedding, *, dropout: float = 0.0, batch_first: bool = False,
                   ) -> "LearnedPositionalEmbedding":
        """Use an :class:`torch.nn.Embedding`'s table (row p = position p) as the learned table."""
        if not isinstance(module, nn.Embedding):
            raise TypeError(f"LearnedPositionalEmbedding.from_torch: expected a torch.nn.Embedding, "
                            f"got {type(module).__name__}")
        if module.padding_idx is not None or module.max_norm is not None:
            raise input_error("LearnedPositionalEmbedding.from_torch", "module",
                              "an Embedding without padding_idx and max_norm",
                              f"padding_idx={module.padding_idx}, max_norm={module.max_norm}",
                              "positions have no padding row and are not renormalised; build a plain Embedding")
        w = module.weight
        layer = cls(module.num_embeddings, module.embedding_dim, dropout, batch_first, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            layer.weight.copy_(w)
        return layer.train(module.training)

    def to_torch(self) -> nn.Embedding:
        """An :class:`torch.nn.Embedding` holding a copy of the table (index it with positions)."""
        emb = nn.Embedding(self.max_len, self.embed_dim, device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            emb.weight.copy_(self.weight)
        return emb.train(self.training)

