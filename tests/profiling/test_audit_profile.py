"""An independent audit of ``layerlab profile``: every number checked against plain torch.

FLOPs against ``torch.utils.flop_counter.FlopCounterMode`` run on the model by itself (forward and
backward separately, per module path, with SDPA forced onto its math backend where torch's registry
lacks the fused CPU kernel); parameters against ``model.parameters()``; activation bytes against a
plain ``saved_tensors_hooks``; rankings only where the gap is hundreds of times. Each case is a bug
the audit found or a trap a naive profiler falls into (a module called twice, matmuls in plain
functions, a submodule used through ``F.linear``, tied weights, activation checkpointing).
"""

from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from layerlab.errors import UsageError
from layerlab.profiling.run import profile

pytestmark = pytest.mark.usefixtures("one_thread")


# -- truth with plain torch ----------------------------------------------------------------------
def _outputs(out):
    if isinstance(out, torch.Tensor):
        return [out] if out.requires_grad and out.is_floating_point() else []
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        out = list(out.values()) if isinstance(out, dict) else list(out.to_tuple())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _outputs(o)]
    return []


def _flop_truth(model, *inputs):
    """``(forward per module path, forward total, backward total)`` from FlopCounterMode: forward
    counts are inclusive (a path holds its children and all its calls)."""
    root = type(model).__name__
    with FlopCounterMode(display=False) as counter:
        out = model(*inputs)
    forward = {("" if k == root else k[len(root) + 1:]): sum(v.values())
               for k, v in counter.get_flop_counts().items() if k != "Global"}
    outs = _outputs(out)
    with FlopCounterMode(display=False) as counter:
        torch.autograd.backward(outs, [torch.randn_like(t) for t in outs])
    model.zero_grad(set_to_none=True)
    return forward, counter.get_total_flops()


def _inclusive(report, field):
    """layerlab's self FLOPs summed up the call tree and over calls: FlopCounterMode's per-path view."""
    rows = report.rows
    total = defaultdict(int)
    for row in rows:
        i, seen = row.index, set()
        while i is not None:
            if rows[i].path not in seen:
                seen.add(rows[i].path)
                total[rows[i].path] += getattr(row, field)
            i = rows[i].parent
    return dict(total)


def _assert_flops_match(model, *inputs):
    truth_fwd, truth_bwd = _flop_truth(model, *inputs)
    report = profile(model, *inputs, repeats=1, warmup=0)
    ours = _inclusive(report, "flops_forward")
    assert {p: f for p, f in ours.items() if f} == {p: f for p, f in truth_fwd.items() if f}
    assert sum(r.flops_forward for r in report.rows) == truth_fwd.get("", 0)
    assert sum(r.flops_backward for r in report.rows) == truth_bwd
    return report


# -- models -------------------------------------------------------------------------------------
class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.gates = nn.ModuleDict({"a": nn.Linear(16, 16), "b": nn.Sequential(nn.Linear(16, 16), nn.GELU())})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.gates["a"](x) + self.gates["b"](x)


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(32, 32), nn.ReLU(inplace=True), nn.Linear(32, 32)

    def forward(self, x):
        h = self.fc1(x)
        h.mul_(2.0)
        h = self.fc2(self.act(h))
        h.add_(1.0)
        return F.relu_(h)


class Shared(nn.Module):
    """One Linear called twice, and an output layer tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.emb, self.block, self.out = nn.Embedding(50, 32), nn.Linear(32, 32), nn.Linear(32, 50, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        h = torch.relu(self.block(self.emb(ids)))
        return self.out(torch.relu(self.block(h)))


class Functional(nn.Module):
    """Every matmul in a plain function, on parameters the module owns itself."""

    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(64, 32) * 0.1), nn.Parameter(torch.randn(64, 64) * 0.1)
        self.w3, self.norm = nn.Parameter(torch.randn(64, 64) * 0.1), nn.LayerNorm(64)

    def forward(self, x):  # x (B, T, 32)
        h = F.linear(x, self.w1) @ self.w2
        h = torch.einsum("btd,de->bte", h, self.w3)
        h = torch.bmm(torch.bmm(h, h.transpose(1, 2)).softmax(-1), h)
        q = h.view(h.shape[0], h.shape[1], 4, 16).transpose(1, 2)  # (B, H, T, hs)
        return self.norm(F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape_as(h))


class Checkpointed(nn.Module):
    def __init__(self, reentrant=False):
        super().__init__()
        self.reentrant = reentrant
        self.block = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant))


def _ids(*shape, high=50):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(0))


STOCK = {
    "conv-bn-relu": lambda: (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                           nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10)),
                             torch.randn(4, 3, 8, 8)),
    "conv-groups-dilation-transpose": lambda: (nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=4), nn.Conv2d(16, 16, 3, padding=1, groups=16),
        nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1, groups=2)), torch.randn(2, 8, 8, 8)),
    "nested-containers": lambda: (nn.Sequential(nn.Sequential(Inner(), nn.Sequential(Inner())), nn.Linear(16, 4)),
                                  torch.randn(8, 16)),
    "in-place": lambda: (InPlace(), torch.randn(8, 32)),
    "shared-and-integer-ids": lambda: (Shared(), _ids(4, 10)),
    "lstm-gru": lambda: (nn.Sequential(nn.GRU(8, 16, batch_first=True)), torch.randn(2, 5, 8)),
    "eval-mode": lambda: (nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Dropout(0.5), nn.ReLU(),
                                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval(),
                          torch.randn(4, 3, 8, 8)),
}


@pytest.mark.parametrize("name", list(STOCK))
def test_flops_per_module_and_in_total_are_flop_counter_modes(name):
    torch.manual_seed(0)
    model, x = STOCK[name]()
    _assert_flops_match(model, x)


def test_a_module_called_twice_has_a_row_per_call_and_the_flops_of_both():
    torch.manual_seed(0)
    model = Shared()
    report = _assert_flops_match(model, _ids(4, 10))
    block = [r for r in report.rows if r.path == "block"]
    assert [r.call for r in block] == [1, 2]
    assert block[0].flops_forward == block[1].flops_forward > 0  # the same shapes, each call its own
    assert block[0].param_bytes > 0 and block[1].param_bytes == 0  # weights once, on the first call


@pytest.mark.parametrize("make", [
    lambda: (Functional(), torch.randn(2, 8, 32)),
    lambda: (nn.Sequential(nn.TransformerEncoder(
        nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2, enable_nested_tensor=False)),
        torch.randn(2, 8, 32)),
], ids=["functional-matmuls-and-sdpa", "transformer-encoder"])
def test_attention_flops_are_the_math_backends_in_both_directions(make):
    """On CPU SDPA runs a fused kernel torch's counter has no formula for; its math backend runs the
    same maths as bmm's it does count. Forced onto the math backend, every FLOP must match; on the
    default backend the forward must still match the math backend's."""
    torch.manual_seed(0)
    model, x = make()
    with sdpa_kernel(SDPBackend.MATH):
        _assert_flops_match(model, x)
        truth_fwd, _ = _flop_truth(model, x)
    fused = profile(model, x, repeats=1, warmup=0)
    assert sum(r.flops_forward for r in fused.rows) == truth_fwd[""]
    assert not fused.flops_not_counted


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hugging_face_models_flops_and_no_false_alarm(name):
    transformers = pytest.importorskip("transformers", reason="the Hugging Face cases need transformers")
    torch.manual_seed(0)
    if name == "gpt2":
        model = transformers.GPT2Model(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, bos_token_id=0, eos_token_id=0))
    elif name == "bert":
        model = transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=100,
            max_position_embeddings=32))
    else:
        model = transformers.LlamaModel(transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, vocab_size=100, max_position_embeddings=32))
    ids = _ids(2, 8, high=100)
    with sdpa_kernel(SDPBackend.MATH):
        report = _assert_flops_match(model, ids)
    assert sum(r.param_bytes for r in report.rows) == sum(p.numel() * p.element_size() for p in model.parameters())
    assert not [n for n in report.notes if not n.startswith("timings are unsteady")]


# -- parameters -----------------------------------------------------------------------------------
def _param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())  # unique tensors


def test_parameters_of_a_submodule_used_functionally_are_not_lost():
    """nn.MultiheadAttention calls its out_proj through F.linear: the submodule never runs, and
    its weights belong on the attention's row (a quarter of them went missing before)."""
    mha = nn.MultiheadAttention(32, 4, batch_first=True)

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    model = SelfAttention()
    report = profile(model, torch.randn(2, 6, 32), repeats=1, warmup=0)
    assert sum(r.param_bytes for r in report.rows) == _param_bytes(model)
    assert report.row("mha").param_bytes == _param_bytes(mha)


def test_tied_weights_are_counted_once():
    model = Shared()
    report = profile(model, _ids(4, 10), repeats=1, warmup=0)
    assert sum(r.param_bytes for r in report.rows) == _param_bytes(model)
    assert report.row("out").param_bytes == 0 and report.row("emb").param_bytes == 50 * 32 * 4


def test_hugging_face_tied_lm_head_is_counted_once():
    transformers = pytest.importorskip("transformers", reason="the Hugging Face cases need transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16, bos_token_id=0, eos_token_id=0))
    assert model.lm_head.weight is model.transformer.wte.weight
    report = profile(model, _ids(2, 8, high=100), repeats=1, warmup=0)
    assert sum(r.param_bytes for r in report.rows) == _param_bytes(model)


# -- activation checkpointing ---------------------------------------------------------------------
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_recompute_is_backward_work_not_a_second_call(reentrant):
    torch.manual_seed(0)
    model, x = Checkpointed(reentrant), torch.randn(8, 32, requires_grad=True)
    truth_fwd, truth_bwd = _flop_truth(model, x)  # FlopCounterMode's backward includes the recompute
    report = profile(model, x, repeats=1, warmup=0)
    assert [r.call for r in report.rows] == [1] * len(report.rows)  # no "block #2"
    assert sum(r.flops_forward for r in report.rows) == truth_fwd[""]
    assert sum(r.flops_backward for r in report.rows) == truth_bwd
    assert any("checkpointing" in n for n in report.notes)


# -- activation memory ----------------------------------------------------------------------------
class BigTemporary(nn.Module):
    """A 16 MiB temporary inside forward that autograd never saves: not activation memory."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        scale = torch.ones(2048, 2048).sum() * 0 + 1
        return self.fc(x) * scale


@pytest.mark.parametrize("make", [
    lambda: (BigTemporary(), torch.randn(8, 16)),
    lambda: (InPlace(), torch.randn(8, 32)),
    lambda: (Functional(), torch.randn(2, 8, 32)),
    lambda: (Shared(), _ids(4, 10)),
], ids=["big-temporary", "in-place", "functional", "shared"])
def test_activation_bytes_are_what_autograd_saved(make):
    torch.manual_seed(0)
    model, x = make()
    static = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in static:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    report = profile(model, x, repeats=1, warmup=0)
    assert sum(r.activation_bytes for r in report.rows) == sum(saved.values())


# -- ranking --------------------------------------------------------------------------------------
def test_a_huge_layer_outranks_a_tiny_one():
    """A 1024×1024 Linear next to an 8×8 one: ~16,000× the FLOPs and, timed alone with plain
    perf_counter, far more than 5× the time; the profile must rank it first by a wide margin."""
    import time

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 8))
    x = torch.randn(64, 8)

    def alone(layer, inp):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            layer(inp).sum().backward()
            best = min(best, time.perf_counter() - t0)
        return best

    assert alone(model[2], torch.randn(64, 1024)) > 5 * alone(model[0], x)  # the premise, in plain torch
    report = profile(model, x, repeats=3, warmup=1)
    ranked = sorted(report.rows, key=lambda r: -r.share)
    assert ranked[0].path == "2"
    assert report.row("2").share > 5 * report.row("0").share


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"repeats": 10 ** 11}, r"--repeats must be between 1 and 10000, got 100000000000"),
    ({"warmup": 10 ** 11}, r"--warmup must be between 0 and 10000"),
    ({"repeats": 0}, r"--repeats must be between 1"),
    ({"warmup": -1}, r"--warmup must be between 0"),
    ({"repeats": 2.5}, r"repeats must be an integer, got float"),
    ({"repeats": "3"}, r"repeats must be an integer, got str"),
    ({"warmup": True}, r"warmup must be an integer, got bool"),
])
def test_bad_repeats_and_warmup_are_refused_not_run(kwargs, match):
    with pytest.raises(UsageError, match=match):
        profile(nn.Linear(4, 4), torch.randn(2, 4), **kwargs)


@pytest.mark.parametrize("args", [["--repeats", "100000000000"], ["--repeats", "99999999999999999999999"],
                                  ["--warmup", "100000000000"]])
def test_cli_refuses_huge_repeats_with_exit_2(args, capsys, monkeypatch):
    from layerlab.cli.app import main

    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)
    code = main(["profile", "linear", *args])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "must be between" in err and "Traceback" not in err and out == ""
