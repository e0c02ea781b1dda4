"""layerlab.layers.recurrent against torch.nn.RNN / LSTM / GRU."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.recurrent import GRU, LSTM, RNN
from tests.layers._seq_helpers import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn

LAYERS = {"rnn": (RNN, nn.RNN), "lstm": (LSTM, nn.LSTM), "gru": (GRU, nn.GRU)}


def _inputs(kind, *, I, H, L, D, T, B, batch_first, with_h0, proj=0, seed=0):
    """``((input, hx), {})`` in the layout the layer expects; ``B=None`` is unbatched."""
    if B is None:
        x = randn(T, I, seed=seed)
    else:
        x = randn(*((B, T, I) if batch_first else (T, B, I)), seed=seed)
    if not with_h0:
        return (x,), {}
    lead = (L * D,) if B is None else (L * D, B)  # batch in dim 1 even with batch_first
    h0 = randn(*lead, proj or H, seed=seed + 1)
    if kind == "lstm":
        return (x, (h0, randn(*lead, H, seed=seed + 2))), {}
    return (x, h0), {}


@st.composite
def configs(draw):
    kind = draw(st.sampled_from(sorted(LAYERS)))
    H = draw(st.integers(2, 4))
    cfg = dict(
        kind=kind, I=draw(st.integers(1, 4)), H=H, L=draw(st.integers(1, 3)), bidirectional=draw(st.booleans()),
        batch_first=draw(st.booleans()), bias=draw(st.booleans()), T=draw(st.integers(1, 4)),
        B=draw(st.sampled_from([None, 1, 2])), with_h0=draw(st.booleans()), via_from=draw(st.booleans()),
        proj=draw(st.sampled_from([0, 0, 1])) if kind == "lstm" else 0,
        relu=kind == "rnn" and draw(st.booleans()),
        # dropout only matters in training; eval mode must ignore it (as torch does)
        dropout=draw(st.sampled_from([0.0, 0.5])), train=draw(st.booleans()),
    )
    if cfg["train"]:
        cfg["dropout"] = 0.0  # with dropout > 0 the random masks differ from torch's
    return cfg


def _build(cfg):
    ours_cls, torch_cls = LAYERS[cfg["kind"]]
    kw = dict(num_layers=cfg["L"], bias=cfg["bias"], batch_first=cfg["batch_first"], dropout=cfg["dropout"],
              bidirectional=cfg["bidirectional"], dtype=F64)
    if cfg["proj"]:
        kw["proj_size"] = cfg["proj"]
    if cfg["relu"]:
        kw["nonlinearity"] = "relu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # dropout with num_layers=1
        if cfg["via_from"]:
            ref = torch_cls(cfg["I"], cfg["H"], **kw)
            ours = ours_cls.from_torch(ref)
        else:
            ours = ours_cls(cfg["I"], cfg["H"], **kw)
            ref = ours.to_torch()
    ours.train(cfg["train"])
    ref.train(cfg["train"])
    return ours, ref


@settings(max_examples=45, deadline=None)
@given(cfg=configs())
def test_parity_forward_backward_float64(cfg):
    ours, ref = _build(cfg)
    D = 2 if cfg["bidirectional"] else 1
    inputs = _inputs(cfg["kind"], I=cfg["I"], H=cfg["H"], L=cfg["L"], D=D, T=cfg["T"], B=cfg["B"],
                     batch_first=cfg["batch_first"], with_h0=cfg["with_h0"], proj=cfg["proj"])
    assert_parity(ours, ref, inputs)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_parameter_names_order_shapes_and_init_match_torch(kind):
    ours_cls, torch_cls = LAYERS[kind]
    ours, ref = ours_cls(3, 40, num_layers=2, bidirectional=True), torch_cls(3, 40, num_layers=2, bidirectional=True)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    assert "weight_hh_l1_reverse" in dict(ours.named_parameters())
    bound = 1 / math.sqrt(40)
    for p in ours.parameters():
        assert p.abs().max() <= bound and p.abs().max() > 0.8 * bound


def test_lstm_proj_size_names_and_shapes():
    ours, ref = LSTM(3, 6, num_layers=2, proj_size=2), nn.LSTM(3, 6, num_layers=2, proj_size=2)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]


def test_state_layout_is_batch_in_dim1_even_with_batch_first():
    lstm = LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True, dtype=F64)
    out, (h_n, c_n) = lstm(torch.randn(3, 4, 5, dtype=F64))  # (B, T, I)
    assert out.shape == (3, 4, 14) and h_n.shape == (4, 3, 7) and c_n.shape == (4, 3, 7)
    # index l·D + d: the last layer's forward state is out[:, -1, :H]; its reverse state is out[:, 0, H:]
    torch.testing.assert_close(h_n[2], out[:, -1, :7])
    torch.testing.assert_close(h_n[3], out[:, 0, 7:])


def test_dropout_acts_between_layers_not_after_the_last():
    torch.manual_seed(0)
    x = torch.randn(6, 2, 3, dtype=F64)
    # one layer: dropout has nothing to act on, so training output equals eval output (and torch's)
    with pytest.warns(UserWarning, match="no effect with num_layers=1"):
        single = GRU(3, 4, dropout=0.5, dtype=F64)
    torch.testing.assert_close(single.train()(x)[0], single.eval()(x)[0])
    # two layers: layer 0's final state is untouched by dropout, layer 1's output is not
    two = GRU(3, 4, num_layers=2, dropout=0.5, dtype=F64)
    (out_t, h_t), (out_e, h_e) = two.train()(x), two.eval()(x)
    torch.testing.assert_close(h_t[0], h_e[0])
    assert not torch.allclose(out_t, out_e)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_gradcheck(kind):
    ours_cls, _ = LAYERS[kind]
    layer = ours_cls(2, 3, num_layers=2, bidirectional=True, dtype=F64)
    assert_gradcheck(layer, _inputs(kind, I=2, H=3, L=2, D=2, T=3, B=2, batch_first=False, with_h0=True))


def test_gradcheck_lstm_projection_batch_first():
    layer = LSTM(2, 3, proj_size=2, batch_first=True, dtype=F64)
    assert_gradcheck(layer, _inputs("lstm", I=2, H=3, L=1, D=1, T=3, B=2, batch_first=True, with_h0=True, proj=2))


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_trace_matches_eager_on_new_values(kind):
    """jit.trace unrolls the time loop: valid for the traced length, with any values."""
    ours_cls, _ = LAYERS[kind]
    layer = ours_cls(3, 4, num_layers=2, bidirectional=True, batch_first=True, dtype=F64)
    kw = dict(I=3, H=4, L=2, D=2, T=5, B=2, batch_first=True, with_h0=True)
    assert_traces(layer, _inputs(kind, **kw, seed=0), _inputs(kind, **kw, seed=7))


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_compile_fullgraph_short_sequence(kind):
    """torch.compile also works (the loop unrolls into the graph; one compile per length).
    aot_eager: full-graph capture and AOTAutograd, without minutes of C++ compilation."""
    layer = LAYERS[kind][0](3, 4, num_layers=2, bidirectional=kind == "gru", batch_first=True, dtype=F64)
    D = 2 if kind == "gru" else 1
    assert_compiles(layer, _inputs(kind, I=3, H=4, L=2, D=D, T=3, B=2, batch_first=True, with_h0=True))


def test_input_size_error():
    with pytest.raises(ValueError, match=r"LSTM: input_size: expected 10, got 12 \(input shape \[5, 3, 12\]\) → "
                                         r"give the input 10 features .* or build LSTM\(input_size=12"):
        LSTM(10, 20)(torch.randn(5, 3, 12))


def test_h0_shape_error_explains_layout():
    lstm = LSTM(10, 20, num_layers=2, batch_first=True)
    with pytest.raises(ValueError, match=r"LSTM: h0 shape: expected \[2, 4, 20\] = \[num_layers·D, B, H\], "
                                         r"got \[4, 2, 20\] .*batch in dim 1 even with batch_first=True"):
        lstm(torch.randn(4, 7, 10), (torch.randn(4, 2, 20), torch.randn(2, 4, 20)))
    with pytest.raises(ValueError, match=r"LSTM: c0 shape: expected \[2, 4, 20\]"):
        lstm(torch.randn(4, 7, 10), (torch.randn(2, 4, 20), torch.randn(2, 4, 21)))
    with pytest.raises(ValueError, match=r"GRU: h0 shape: expected \[2, 20\] = \[num_layers·D, H\] "
                                         r"\(the input is unbatched\), got \[2, 1, 20\]"):
        GRU(10, 20, bidirectional=True)(torch.randn(7, 10), torch.randn(2, 1, 20))
    with pytest.raises(ValueError, match=r"h0 shape: expected \[1, 4, 2\] = \[num_layers·D, B, proj_size\]"):
        LSTM(10, 20, proj_size=2)(torch.randn(3, 4, 10), (torch.randn(1, 4, 20), torch.randn(1, 4, 20)))


def test_other_input_errors():
    with pytest.raises(ValueError, match=r"RNN: input rank: expected 3-D \[T, B, I\] \(batch_first=False\) or "
                                         r"2-D \[T, I\] \(unbatched\), got 4-D"):
        RNN(10, 20)(torch.randn(1, 2, 3, 10))
    with pytest.raises(ValueError, match=r"GRU: input dtype: expected torch.float32 .*got torch.float64 → "
                                         r"convert the input with input.to\(torch.float32\)"):
        GRU(10, 20)(torch.randn(3, 2, 10, dtype=F64))
    with pytest.raises(ValueError, match=r"sequence length T: expected ≥ 1, got 0"):
        GRU(10, 20, batch_first=True)(torch.randn(3, 0, 10))
    packed = nn.utils.rnn.pack_sequence([torch.randn(3, 10), torch.randn(2, 10)])
    with pytest.raises(ValueError, match=r"input: expected a torch.Tensor, got PackedSequence → "
                                         r".*pad_packed_sequence"):
        LSTM(10, 20)(packed)
    with pytest.raises(ValueError, match=r"LSTM: hx: expected a tuple \(h0, c0\)"):
        LSTM(10, 20)(torch.randn(3, 2, 10), torch.randn(1, 2, 20))


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"RNN: nonlinearity: expected 'tanh' or 'relu', got 'sigmoid'"):
        RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match=r"LSTM: dropout: expected a probability in \[0, 1\], got 1.5"):
        LSTM(3, 4, num_layers=2, dropout=1.5)
    with pytest.raises(ValueError, match=r"LSTM: proj_size: expected 0 \(off\) or an int in \[1, hidden_size=4\)"):
        LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match=r"GRU: num_layers: expected a positive int, got 0"):
        GRU(3, 4, num_layers=0)
    with pytest.raises(TypeError, match=r"LSTM.from_torch: expected a torch.nn.LSTM, got GRU"):
        LSTM.from_torch(nn.GRU(3, 4))
