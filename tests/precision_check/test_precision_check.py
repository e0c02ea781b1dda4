"""layerlab.mixed on stock modules (no false alarms) and planted half-precision bugs.

Every planted bug is also confirmed with plain torch, outside layerlab, so a test can only pass
when the bug is real and layerlab names it. Letters: B batch · L length · E features.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os

import pytest
import torch
from torch import nn

import layerlab
from layerlab.errors import SpecError, UsageError
from layerlab.mixed.capture import MAX_SAMPLES
from layerlab.mixed.dtypes import FP16_MAX, autocast_supported

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
BF16_EPS = torch.finfo(torch.bfloat16).eps
FP16_EPS = torch.finfo(torch.float16).eps

needs_cpu_fp16 = pytest.mark.skipif(autocast_supported("cpu", "float16") is not None,
                                    reason=f"no float16 autocast on CPU here: {autocast_supported('cpu', 'float16')}")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA paths need a GPU (torch.cuda.is_available())")


def _layers():
    spec = importlib.util.spec_from_file_location("precision_layers", os.path.join(CONFIGS, "precision_layers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(text: str) -> str:
    """``precision_layers.py:N``: the line of configs/precision_layers.py that holds ``text``."""
    with open(os.path.join(CONFIGS, "precision_layers.py")) as f:
        n = next(i for i, line in enumerate(f, 1) if text in line)
    return f"precision_layers.py:{n}"


def _problems(report):
    return [f for f in report.findings if f.severity in ("error", "warning")]


# -- healthy blocks: no false alarms ------------------------------------------------------------

def _stock():
    torch.manual_seed(0)
    return [
        ("encoder", nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True), (torch.randn(2, 10, 32),)),
        ("conv-bn-relu", nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                       nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU()), (torch.randn(4, 3, 12, 12),)),
        ("lstm", nn.LSTM(8, 16, num_layers=2, batch_first=True), (torch.randn(3, 7, 8),)),
        ("gru", nn.GRU(8, 16, batch_first=True), (torch.randn(3, 7, 8),)),
        ("mha", nn.MultiheadAttention(16, 4, batch_first=True), (torch.randn(2, 5, 16),) * 3),
        ("mlp-gelu-layernorm", nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16), nn.LayerNorm(16)),
         (torch.randn(8, 16),)),
    ]


@pytest.mark.parametrize("name, module, inputs", _stock(), ids=[s[0] for s in _stock()])
def test_stock_blocks_pass_under_bf16_autocast(name, module, inputs):
    report = layerlab.precision_check(module, *inputs, autocast=["bfloat16"])
    run = report.run("autocast bfloat16")
    assert report.ok and not _problems(report), [f.message for f in _problems(report)]
    # the calibration the bars rest on: stock blocks stay within ~1 eps, far below the 8·eps bar
    assert run.output_error < 2 * BF16_EPS
    assert all(p.error < 8 * BF16_EPS for p in run.params if p.error is not None)


def test_rows_report_the_dtype_torch_autocast_ran_each_module_in():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    x = torch.randn(3, 8)
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what torch itself does, outside layerlab
        h = model[0](x)
        n = model[1](h)
        y = model[2](n)
    run = report.runs[0]
    assert [run.row(p).dtype for p in ("0", "1", "2")] == [str(t.dtype)[6:] for t in (h, n, y)]
    # and the error layerlab reports for the output is the one torch's own runs give
    with torch.no_grad():
        ref = model(x)
        expected = float(torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref))
    assert run.row("2").error == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("config", ["transformer_preln.yaml", "cnn_block.yaml", "lstm.yaml", "mha_causal.yaml",
                                    "attention_ops.yaml"])
def test_example_configs_pass(config):
    report = layerlab.precision_check(os.path.join(CONFIGS, config), allow_import=True)
    assert report.ok and not _problems(report), [f.message for f in _problems(report)]


def test_tiny_gpt2_passes_bf16_and_fp16():
    tf = pytest.importorskip("transformers", reason="Hugging Face models need the transformers package")
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32))
    ids = torch.randint(0, 100, (2, 10))
    dtypes = ["bfloat16"] + (["float16"] if autocast_supported("cpu", "float16") is None else [])
    report = layerlab.precision_check(model, ids, autocast=dtypes)
    assert report.ok and not _problems(report), [f.message for f in _problems(report)]
    assert len(report.runs) == len(dtypes)


# -- planted bugs: found, named, explained --------------------------------------------------------

def test_sum_of_squares_in_bf16_is_named_with_its_op():
    layers = _layers()
    torch.manual_seed(0)
    model, x = layers.VarianceBlock(64, 8), torch.randn(4, 6, 64)
    # the bug is real: the norm's output in bf16 is far from float32's
    h = model.fc_in(x)
    fp32 = model.norm(h)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model.norm(h.bfloat16())
    assert not torch.isfinite(low).all() or float((low.float() - fp32).norm() / fp32.norm()) > 8 * BF16_EPS
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    first = report.runs[0].first
    assert not report.ok and first.where == "norm"
    assert "pow" in first.cause and first.source.endswith(_line("x.pow(2).mean"))
    assert "float32" in first.fix
    assert report.runs[0].row("fc_in").flags == []          # the Linear before it is fine
    assert "inherited" in report.runs[0].row("").flags       # the root only contains it


def test_activation_past_fp16_max_is_forecast_from_float32_values():
    layers = _layers()
    torch.manual_seed(0)
    model, x = layers.OverflowBlock(16), torch.randn(4, 16)
    assert float((model.gate.proj(model.fc_in(x)) * model.gate.gain).abs().max()) > FP16_MAX  # real overflow
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    assert report.ok  # bfloat16 has float32's range
    [fc] = [f for f in report.forecast if f.kind == "fp16-overflow"]
    assert fc.severity == "warning" and fc.where == "gate" and fc.source.endswith(_line("self.proj(x) * self.gain"))
    assert "bfloat16" in fc.fix


@needs_cpu_fp16
def test_activation_past_fp16_max_fails_fp16_autocast():
    layers = _layers()
    torch.manual_seed(0)
    model, x = layers.OverflowBlock(16), torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not torch.isfinite(model(x)).all()  # torch itself overflows
    report = layerlab.precision_check(model, x, autocast=["float16"])
    first = report.runs[0].first
    assert not report.ok and first.kind == "overflow" and first.where == "gate"
    assert "65504" in first.cause and "mul" in first.cause


@needs_cpu_fp16
def test_softmax_of_large_logits_in_fp16():
    layers = _layers()
    torch.manual_seed(0)
    model, x = layers.HotAttention(16), torch.randn(2, 8, 16)
    with torch.autocast("cpu", dtype=torch.float16):
        low = model(x)
    assert float((low.float() - model(x)).norm() / model(x).norm()) > 8 * FP16_EPS  # real
    report = layerlab.precision_check(model, x, autocast=["float16"])
    first = report.runs[0].first
    assert not report.ok and first.where == "(root)" and first.cause.startswith("softmax runs in float16")


def test_cast_mode_runs_the_whole_model_in_half():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    report = layerlab.precision_check(model, torch.randn(3, 8), autocast=[], cast=["bfloat16"])
    run = report.run("cast bfloat16")
    assert run.kind == "cast" and report.ok
    assert {r.dtype for r in run.rows} == {"bfloat16"}  # LayerNorm too: no autocast lists in cast mode


class _SmallGrads(nn.Module):
    """Scales its output by 1e-7 after a float32 cast: the forward is fine in float16, but the
    gradient reaching the Linear's float16 output is ~1e-9, below float16's smallest subnormal."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x).float() * 1e-7


@needs_cpu_fp16
def test_gradient_underflow_in_fp16_and_the_grad_scaler_fix():
    torch.manual_seed(0)
    model, x = _SmallGrads(), torch.randn(8, 16)
    plain = layerlab.precision_check(model, x, autocast=["float16"])
    under = {f.where: f for f in plain.runs[0].findings if f.kind == "underflow"}
    assert "lin.weight" in under and "GradScaler" in under["lin.weight"].fix and not plain.ok
    assert any(f.kind == "fp16-underflow" for f in plain.forecast)  # also read off the float32 gradients
    scaled = layerlab.precision_check(model, x, autocast=["float16"], grad_scaler=True)
    assert scaled.runs[0].label == "autocast float16 + GradScaler"
    assert scaled.ok and not [f for f in scaled.runs[0].findings if f.kind == "underflow"]


def test_attention_key_bias_noise_is_not_compared():
    # softmax ignores a shift shared by a row, so the key bias's gradient is 0 up to float32 rounding
    torch.manual_seed(0)
    report = layerlab.precision_check(_layers().HotAttention(16, offset=0.0), torch.randn(2, 8, 16))
    assert report.ok and not _problems(report)


def test_cpu_float16_lstm_without_a_kernel_is_a_warning_not_a_failure():
    if autocast_supported("cpu", "float16") is not None:
        pytest.skip("no float16 autocast on CPU here")
    torch.manual_seed(0)
    report = layerlab.precision_check(nn.LSTM(4, 8), torch.randn(5, 2, 4), autocast=["float16"])
    kinds = {f.kind for f in report.runs[0].findings}
    assert report.ok and kinds <= {"unsupported"}


# -- guarantees ----------------------------------------------------------------------------------

def test_memory_is_bounded_and_max_is_torchs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 4096), nn.ReLU())
    x = torch.randn(64, 64)
    from layerlab.mixed.runs import FLOAT32, run
    from layerlab.target import from_module

    t = from_module(model, x)
    result = run(model, t.args, FLOAT32, seed=0)
    seen = result.calls[("0", 1)].outputs[0]
    assert seen.numel == 64 * 4096 and seen.sample.numel() == MAX_SAMPLES
    assert seen.amax == pytest.approx(float(model[0](x).abs().max()), rel=1e-6)


def test_the_users_module_is_left_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    before = copy.deepcopy(model.state_dict())
    layerlab.precision_check(model, torch.randn(6, 4))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())


def test_bad_input_is_a_clear_error():
    with pytest.raises(UsageError, match="compares half precision with float32"):
        layerlab.precision_check(nn.Linear(2, 2).double(), torch.randn(1, 2, dtype=torch.float64))
    with pytest.raises(UsageError, match="takes float16 or bfloat16"):
        layerlab.precision_check(nn.Linear(2, 2), torch.randn(1, 2), autocast=["float64"])


def test_precision_section_is_validated(tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text("layer: Linear\nargs: {in_features: 4, out_features: 2}\ninput: {shape: [3, 4]}\n"
                    "precision:\n  autocast: [float64]\n")
    with pytest.raises(SpecError, match="takes float16 or bfloat16") as info:
        layerlab.precision_check(str(spec))
    assert info.value.where.endswith("p.yaml:5:3")  # the autocast: line of the section
    spec.write_text("layer: Linear\nargs: {in_features: 4, out_features: 2}\ninput: {shape: [3, 4]}\n"
                    "precision:\n  autocasts: [bfloat16]\n")
    with pytest.raises(SpecError, match="no key 'autocasts'"):
        layerlab.precision_check(str(spec))


def test_spec_section_picks_the_runs(tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text("layer: Linear\nargs: {in_features: 4, out_features: 2}\ninput: {shape: [3, 4]}\n"
                    "precision:\n  autocast: []\n  cast: bf16\n")
    report = layerlab.precision_check(str(spec))
    assert [r.label for r in report.runs] == ["cast bfloat16"]


# -- CUDA (where a GPU is lent) ----------------------------------------------------------------

@needs_cuda
def test_cuda_default_runs_fp16_and_bf16_and_the_grad_scaler():
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).cuda()
    x = torch.randn(2, 10, 32, device="cuda")
    report = layerlab.precision_check(model, x)
    assert report.ok and "autocast float16" in [r.label for r in report.runs]
    scaled = layerlab.precision_check(_SmallGrads().cuda(), torch.randn(8, 16, device="cuda"), autocast=["float16"],
                                      grad_scaler=True)
    assert scaled.ok and not math.isnan(scaled.runs[0].grad_error)
