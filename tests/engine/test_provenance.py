"""Axis provenance: labels follow axes through moves, views, reductions, layers; the table is data."""

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.engine import op_semantics
from layerlab.engine.provenance import ProvenanceMode, provenance_of


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(12, 36)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, 3, 4).transpose(1, 2)  # (B, h, T, d)
        k = k.view(B, T, 3, 4).permute(0, 2, 3, 1)  # (B, h, d, T)
        return (q @ k).softmax(-1).sum(1)  # (B, T, T)


def _roles(p, labels):
    return [o.role for o in p.origins(labels)]


def test_axes_are_followed_through_split_view_transpose_and_matmul_on_meta():
    p = provenance_of(Attention(), torch.randn(2, 5, 12))
    assert p.failed is None and p.errors == []
    view = next(r for r in p.records if r.op == "view")
    # the features of qkv are cut into 3 heads × 4: pieces of one atom
    pieces = [p.atoms[lab[0][0]] for lab in view.outputs[0][2:]]
    assert [a.kind for a in pieces] == ["piece", "piece"] and pieces[0].parent == pieces[1].parent
    out = p.outputs[0]
    assert [o.source for o in p.origins(out)] == ["x axis 0", "x axis 1", "x axis 1"]
    assert _roles(p, out) == ["batch", "seq", "seq"]


def test_first_departure_names_the_move_that_put_an_axis_where_its_consumer_reads_it():
    p = provenance_of(Attention(), torch.randn(2, 5, 12))
    matmul = next(r for r in p.records if r.op == "matmul")
    moved = p.first_departure(matmul.index, 1, 3)  # k's last axis: T, put there by the permute
    assert moved is not None and moved.op == "permute"
    assert p.chain(matmul.index, 1, 3)[0].startswith("permute at ")


def test_sizes_and_roles_from_the_layers_that_consume_the_inputs():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(4))
    model(torch.randn(1, 3, 7, 9))  # materialise the lazy layer
    p = provenance_of(model, torch.randn(2, 3, 7, 9))
    roles = {a.axis: p.role(a.id) for a in p.atoms if a.kind == "input"}
    assert roles == {0: "batch", 1: "feature", 2: "spatial", 3: "spatial"}


def test_seq_first_rnn_says_which_axis_is_the_batch():
    p = provenance_of(nn.GRU(4, 6), torch.randn(7, 3, 4))
    roles = {a.axis: p.role(a.id) for a in p.atoms if a.kind == "input"}
    assert roles == {0: "seq", 1: "batch", 2: "feature"}


def test_an_op_missing_from_the_table_gives_unknown_labels_not_a_guess():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real  # not in the table

    p = provenance_of(Odd(), torch.randn(2, 5))
    fft = next(r for r in p.records if r.op == "fft_fft")
    assert fft.kind == "unknown" and fft.outputs[0] == (None, None)


def test_the_table_is_keyed_by_callables_and_refuses_a_second_entry():
    assert torch.Tensor.transpose in op_semantics.TABLE and "transpose" not in op_semantics.TABLE
    assert op_semantics.TABLE[torch.Tensor.add_][0] == "elementwise"  # from torch's pointwise tag
    with pytest.raises(ValueError, match="registered twice"):
        op_semantics.semantics("move", torch.Tensor.transpose)(lambda ctx: None)


def test_an_error_inside_the_engine_never_breaks_inspect(monkeypatch):
    def broken(self, *a, **k):
        raise RuntimeError("engine bug")

    monkeypatch.setattr(ProvenanceMode, "_record", broken)
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)
    report = layerlab.inspect(Attention(), torch.randn(2, 5, 12))
    assert report.ok and not [p for p in report.problems if p.code.startswith("silent/")]


def test_an_error_inside_the_findings_is_raised_under_layerlab_debug(monkeypatch):
    from layerlab.engine import silent

    def broken(p):
        raise RuntimeError("finder bug")

    monkeypatch.setattr(silent, "FINDERS", (broken,))
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)
    assert layerlab.inspect(Attention(), torch.randn(2, 5, 12)).ok
    monkeypatch.setenv("LAYERLAB_DEBUG", "1")
    with pytest.raises(RuntimeError, match="finder bug"):
        layerlab.inspect(Attention(), torch.randn(2, 5, 12))


def test_the_mode_wraps_any_forward_and_keeps_no_tensor():
    import weakref

    x = torch.randn(2, 5, 12)
    mode = ProvenanceMode(None, [("x", x)])
    model = Attention()
    with mode:
        out = model(x)
    ref = weakref.ref(out)
    p = mode.result(out)
    del out
    assert ref() is None and len(p.records) > 5
