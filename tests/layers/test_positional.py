"""layerlab.layers.positional: sinusoidal against an independent numpy loop, learned against nn.Embedding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, sinusoidal_encoding
from tests.layers._seq_helpers import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn


def numpy_table(T: int, D: int, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """The formula element by element, in numpy: feature j uses exponent 2⌊j/2⌋/D, sin if j even."""
    table = np.zeros((T, D))
    for t in range(T):
        pos = offset + t
        for j in range(D):
            angle = pos / np.power(base, (j - j % 2) / D)
            table[t, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return table


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 12), D=st.integers(1, 9), offset=st.integers(0, 300), base=st.sampled_from([10000.0, 100.0]))
def test_table_equals_independent_formula(T, D, offset, base):
    got = sinusoidal_encoding(T, D, base=base, offset=offset, dtype=F64)
    np.testing.assert_allclose(got.numpy(), numpy_table(T, D, base, offset), rtol=1e-12, atol=1e-12)


def test_known_values():
    table = sinusoidal_encoding(3, 6, dtype=F64)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]  # pos 0 → [0, 1, 0, 1, …]
    assert table[1, 0] == math.sin(1.0) and table[1, 1] == math.cos(1.0)  # i = 0: 1 rad per position
    torch.testing.assert_close(table[2, 4], torch.tensor(math.sin(2 / 10000 ** (4 / 6)), dtype=F64))
    assert sinusoidal_encoding(1, 5)[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]  # odd D ends with a sine
    far = sinusoidal_encoding(1, 2, offset=50000)  # computed in float64, then rounded once
    assert far[0, 0].item() == torch.tensor(math.sin(50000.0), dtype=torch.float32).item()


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 6), D=st.integers(1, 6), layout=st.sampled_from(["batch_first", "seq_first", "unbatched"]),
       offset=st.integers(0, 3))
def test_module_adds_the_table_in_every_layout(T, D, layout, offset):
    enc = SinusoidalPositionalEncoding(D, max_len=16, batch_first=layout == "batch_first", dtype=F64)
    table = torch.from_numpy(numpy_table(T, D, offset=offset))
    if layout == "batch_first":
        x, expected_add = randn(2, T, D), table.unsqueeze(0)
    elif layout == "seq_first":
        x, expected_add = randn(T, 2, D), table.unsqueeze(1)
    else:
        x, expected_add = randn(T, D), table
    torch.testing.assert_close(enc(x, offset=offset), x + expected_add)


def test_buffer_extends_or_errors_clearly():
    enc = SinusoidalPositionalEncoding(4, max_len=8, batch_first=True, dtype=F64)
    assert "pe" not in enc.state_dict()  # derived data, not a weight
    out = enc(torch.zeros(1, 20, 4, dtype=F64))
    assert enc.max_len == 20
    torch.testing.assert_close(out[0], torch.from_numpy(numpy_table(20, 4)))
    enc(torch.zeros(1, 21, 4, dtype=F64))
    assert enc.max_len == 40  # grows geometrically
    fixed = SinusoidalPositionalEncoding(4, max_len=8, extend=False, batch_first=True)
    with pytest.raises(ValueError, match=r"SinusoidalPositionalEncoding: positions: expected offset \+ T ≤ "
                                         r"max_len = 8, got offset \+ T = 9 → build it with max_len ≥ 9"):
        fixed(torch.zeros(1, 7, 4), offset=2)


def test_sinusoidal_has_no_torch_counterpart():
    with pytest.raises(NotImplementedError, match="no torch.nn counterpart"):
        SinusoidalPositionalEncoding(4).to_torch()
    with pytest.raises(NotImplementedError, match="no torch.nn counterpart"):
        SinusoidalPositionalEncoding.from_torch(nn.Embedding(3, 4))


class _EmbeddingReference(nn.Module):
    """``x + nn.Embedding(arange(T))``: the learned embedding written with torch's own layer."""

    def __init__(self, emb: nn.Embedding, batch_first: bool):
        super().__init__()
        self.emb, self.batch_first = emb, batch_first

    def forward(self, x, offset=0):
        T = x.shape[1] if (x.dim() == 3 and self.batch_first) else x.shape[0]
        table = self.emb(torch.arange(offset, offset + T))
        return x + (table.unsqueeze(1) if (x.dim() == 3 and not self.batch_first) else table)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 5), D=st.integers(1, 5), offset=st.integers(0, 2),
       layout=st.sampled_from(["batch_first", "seq_first", "unbatched"]), via_from=st.booleans())
def test_learned_parity_with_embedding_forward_backward(T, D, offset, layout, via_from):
    bf = layout == "batch_first"
    if via_from:
        emb = nn.Embedding(8, D, dtype=F64)
        ours = LearnedPositionalEmbedding.from_torch(emb, batch_first=bf)
    else:
        ours = LearnedPositionalEmbedding(8, D, batch_first=bf, dtype=F64)
        emb = ours.to_torch()
    x = randn(2, T, D) if bf else (randn(T, 2, D) if layout == "seq_first" else randn(T, D))
    ref = _EmbeddingReference(emb, bf)
    assert_parity(ours, ref, ((x,), {"offset": offset}), ref_params={"weight": emb.weight})


def test_learned_errors_and_init():
    pos = LearnedPositionalEmbedding(4, 3, batch_first=True)
    assert abs(pos.weight.std().item() - 1) < 0.8  # N(0, 1) like nn.Embedding
    with pytest.raises(ValueError, match=r"LearnedPositionalEmbedding: positions: expected offset \+ T ≤ max_len = 4,"
                                         r" got offset \+ T = 0 \+ 5 = 5 → .*cannot extend"):
        pos(torch.zeros(1, 5, 3))
    with pytest.raises(ValueError, match=r"embed_dim: expected 3, got 2 \(input shape \[1, 2, 2\]\)"):
        pos(torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match=r"input rank: expected 3-D \[B, T, D\] \(batch_first=True\)"):
        pos(torch.zeros(3))
    with pytest.raises(ValueError, match=r"expected an Embedding without padding_idx and max_norm"):
        LearnedPositionalEmbedding.from_torch(nn.Embedding(4, 3, padding_idx=0))
    with pytest.raises(ValueError, match=r"SinusoidalPositionalEncoding: input dtype: expected a floating dtype"):
        SinusoidalPositionalEncoding(3)(torch.zeros(2, 3, dtype=torch.long))


def test_gradcheck():
    assert_gradcheck(LearnedPositionalEmbedding(6, 3, dropout=0.0, batch_first=True), ((randn(2, 4, 3),), {}))
    assert_gradcheck(SinusoidalPositionalEncoding(3, batch_first=True, dtype=F64), ((randn(2, 4, 3),), {}))


def test_trace_and_compile():
    """aot_eager: full-graph capture + AOTAutograd without minutes of C++ compilation."""
    for layer in (SinusoidalPositionalEncoding(4, max_len=16, batch_first=True, dtype=F64),
                  LearnedPositionalEmbedding(16, 4, batch_first=True, dtype=F64)):
        assert_traces(layer, ((randn(2, 5, 4),), {}), ((randn(2, 5, 4, seed=3),), {}))
        assert_compiles(layer, ((randn(2, 5, 4),), {}))


def test_compiled_encoding_extends_its_buffer():
    torch._dynamo.reset()
    enc = SinusoidalPositionalEncoding(4, max_len=4, batch_first=True, dtype=F64)
    compiled = torch.compile(enc, fullgraph=True, backend="aot_eager")  # aot_eager: no C++ build
    out = compiled(torch.zeros(1, 6, 4, dtype=F64))
    assert enc.max_len == 8
    torch.testing.assert_close(out[0], torch.from_numpy(numpy_table(6, 4)))
