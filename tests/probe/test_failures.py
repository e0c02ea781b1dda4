"""When a layer raises: the rows that ran, the call that failed, its inputs, and an explanation
from the layer's contract with the fix. Hooks are removed and modes restored on the way out."""

import pytest
import torch
import torch.nn as nn

import layerlab


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def failing(model, *args, **kwargs):
    report = layerlab.inspect(model, *args, **kwargs)
    assert not report.ok
    assert report.failure is not None, report.problems
    return report.failure, report


def test_linear_in_features_after_flatten():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(100, 10))
    failure, report = failing(model, torch.randn(2, 3, 60, 60))
    # rows that ran, in order, then the one that raised
    assert [c.status for c in report.calls] == ["unfinished", "ok", "ok", "ok", "ok", "raised"]
    assert report.call("3").outputs[0].shape == [2, 7200]
    assert failure.phase == "forward" and failure.path == "4" and failure.class_name == "Linear"
    assert failure.exception == "RuntimeError" and "mat1 and mat2" in failure.message
    assert failure.chain == ["(root)", "4"]
    assert failure.inputs[0].shape == [2, 7200]
    d = failure.diagnosis
    assert d.message.startswith("Linear expects last dim = in_features = 100, got 7200")
    assert d.hint.startswith("set in_features=7200")
    assert report.backward.ran is False and report.backward.skipped == "the forward raised"


def test_conv_channel_rule():
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.Conv2d(8, 4, 3))
    failure, _ = failing(model, torch.randn(1, 3, 12, 12))
    assert failure.path == "1"
    assert "expects C = in_channels = 8 input channels, got 16" in failure.diagnosis.message
    assert failure.diagnosis.hint.startswith("set in_channels=16")


def test_conv_wrong_rank():
    failure, _ = failing(nn.Conv2d(3, 4, 3), torch.randn(2, 2, 5, 8, 8))
    assert "expects a 3-D (C, H, W) or 4-D (N, C, H, W) input, got 5-D" in failure.diagnosis.message
    assert failure.diagnosis.cause == "rank"


def test_conv_given_a_stack_of_samples_folds_it_into_the_batch():
    failure, _ = failing(nn.Conv2d(3, 4, 3), torch.randn(2, 2, 3, 8, 8))
    d = failure.diagnosis
    assert "Conv2d expects a 4-D (N, C, H, W) input, got 5-D" in d.message and "(N, T, C, H, W)" in d.message
    assert d.fix.code == "x.flatten(0, 1)"
    assert d.verified.status == "runs" and d.verified.outputs == [[4, 4, 6, 6]]


def test_pool_input_too_small_uses_the_shape_arithmetic():
    pytest.importorskip("layerlab.shapes.pool")
    failure, _ = failing(nn.MaxPool2d(4), torch.randn(1, 1, 2, 2))
    assert failure.diagnosis is not None and failure.diagnosis.message


def test_rnn_input_size():
    failure, _ = failing(nn.LSTM(10, 20, 2), torch.randn(5, 3, 12))
    assert "expects last dim = input_size = 10, got 12" in failure.diagnosis.message
    assert failure.diagnosis.hint.startswith("set input_size=12")


def test_rnn_h0_shape_even_with_batch_first():
    gru = nn.GRU(10, 20, num_layers=2, batch_first=True)
    x = torch.randn(3, 5, 10)
    failure, _ = failing(gru, x, torch.randn(3, 2, 20))
    d = failure.diagnosis
    assert "h0 of shape [num_layers·D, N, H] = [2, 3, 20], got [3, 2, 20]" in d.message
    assert "the batch is dim 1 even with batch_first=True" in d.message
    assert "transpose(0, 1)" in d.hint


def test_lstm_c0_shape_bidirectional():
    lstm = nn.LSTM(4, 6, bidirectional=True)
    x = torch.randn(7, 2, 4)
    h0 = torch.zeros(2, 2, 6)
    failure, _ = failing(lstm, x, (h0, torch.zeros(1, 2, 6)))
    assert "c0 of shape [num_layers·D, N, H] = [2, 2, 6], got [1, 2, 6]" in failure.diagnosis.message


def test_mha_embed_dim():
    mha = nn.MultiheadAttention(64, 4, batch_first=True)
    q = torch.randn(2, 10, 32)
    failure, _ = failing(mha, q, q, q)
    assert failure.exception == "AssertionError"
    assert "query's last dim = embed_dim = 64, got 32" in failure.diagnosis.message
    assert failure.diagnosis.hint.startswith("set embed_dim=32")


def test_mha_attn_mask_shape():
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    q = torch.randn(2, 10, 16)
    failure, _ = failing(mha, q, q, q, attn_mask=torch.zeros(9, 10))
    d = failure.diagnosis
    assert "attn_mask must be (L, S) = [10, 10] or (N·num_heads, L, S) = [8, 10, 10], got [9, 10]" in d.message
    assert "generate_square_subsequent_mask(10)" in d.hint


def test_mha_key_padding_mask_shape():
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    q = torch.randn(2, 10, 16)
    failure, _ = failing(mha, q, q, q, key_padding_mask=torch.zeros(2, 9, dtype=torch.bool))
    assert "key_padding_mask must be (N, S) = [2, 10], got [2, 9]" in failure.diagnosis.message


def test_layer_norm_normalized_shape():
    failure, _ = failing(nn.LayerNorm(64), torch.randn(2, 10, 32))
    d = failure.diagnosis
    assert "expects them = normalized_shape = [64], got [32]" in d.message
    assert d.hint == "set normalized_shape=32"


def test_batch_norm_num_features():
    failure, _ = failing(nn.BatchNorm2d(16), torch.randn(2, 8, 4, 4))
    assert "expects C = num_features = 16 (dim 1), got 8" in failure.diagnosis.message
    assert failure.diagnosis.hint == "set num_features=8"


def test_batch_norm_single_value_in_training():
    failure, _ = failing(nn.BatchNorm1d(16), torch.randn(1, 16), mode="train")
    assert "needs more than 1 value per channel" in failure.diagnosis.message
    assert "eval" in failure.diagnosis.hint


def test_embedding_index_out_of_range():
    failure, _ = failing(nn.Embedding(100, 8), torch.tensor([[1, 100, 5]]))
    assert failure.exception == "IndexError"
    d = failure.diagnosis
    assert "Embedding index 100 out of range: num_embeddings = 100 allows ids 0..99" in d.message
    assert d.hint.startswith("set num_embeddings=101")


def test_embedding_negative_index_and_float_ids():
    failure, _ = failing(nn.Embedding(10, 2), torch.tensor([0, -1]))
    assert "index -1 out of range" in failure.diagnosis.message
    failure, _ = failing(nn.Embedding(10, 2), torch.tensor([0.0, 1.0]))
    assert "expects integer ids" in failure.diagnosis.message


def test_dtype_mismatch():
    failure, _ = failing(nn.Linear(4, 2), torch.randn(3, 4, dtype=torch.float64))
    d = failure.diagnosis
    assert "parameters are float32 but an input is float64" in d.message
    assert "x.to(torch.float32)" in d.hint and "module.to(torch.float64)" in d.hint


def test_device_mismatch_meta():
    failure, _ = failing(nn.Linear(3, 3), torch.randn(2, 3, device="meta"))
    d = failure.diagnosis
    assert "parameters are on cpu but an input is on meta" in d.message
    assert "x.to('cpu')" in d.hint


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch_cuda():
    failure, _ = failing(nn.Linear(3, 3).cuda(), torch.randn(2, 3))
    assert "parameters are on cuda:0 but an input is on cpu" in failure.diagnosis.message


def test_unknown_failure_keeps_torchs_message():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("custom layer broke")

    failure, _ = failing(nn.Sequential(nn.Identity(), Boom()), torch.randn(2))
    assert failure.path == "1" and failure.class_name == "Boom"
    assert failure.exception == "ValueError" and failure.message == "custom layer broke"
    assert failure.diagnosis is None


def test_exception_caught_inside_the_model_is_not_a_failure():
    class Guarded(nn.Module):
        def __init__(self):
            super().__init__()
            self.bad = nn.Linear(5, 5)
            self.good = nn.Linear(3, 3)

        def forward(self, x):
            try:
                return self.bad(x)
            except RuntimeError:
                return self.good(x)

    report = layerlab.inspect(Guarded(), torch.randn(2, 3))
    assert report.failure is None and report.ok
    assert report.call("bad").status == "raised"
    assert report.call("good").status == "ok"


def _hooks(module):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in module.modules())


def test_hooks_removed_and_modes_restored_after_a_forward_failure():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(), nn.Sequential(nn.BatchNorm1d(4), nn.Linear(5, 2)))
    model.eval()
    model[1].train()  # a mixed state must come back exactly
    before = [m.training for m in model.modules()]
    x = torch.randn(3, 4, requires_grad=True)
    report = layerlab.inspect(model, x, mode="train")
    assert report.failure is not None and report.failure.path == "2.1"
    assert report.mode == "train"
    assert [m.training for m in model.modules()] == before
    assert _hooks(model) == 0
    assert not x._backward_hooks


def test_hooks_removed_after_a_backward_failure():
    class BadBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("backward exploded")

    class Custom(nn.Module):
        def forward(self, x):
            return BadBackward.apply(x)

    model = nn.Sequential(nn.Linear(3, 3), Custom(), nn.Linear(3, 1))
    x = torch.randn(2, 3, requires_grad=True)
    report = layerlab.inspect(model, x)
    f = report.failure
    assert f is not None and f.phase == "backward" and "backward exploded" in f.message
    assert f.path == "1" and f.class_name == "Custom"
    assert _hooks(model) == 0 and not x._backward_hooks
    assert all(m.training for m in model.modules())
    # the forward rows are all there
    assert [c.status for c in report.calls] == ["ok"] * 4


def test_hook_bugs_are_not_blamed_on_the_model(monkeypatch):
    from layerlab.probe import hooks

    def broken(*args, **kwargs):
        raise KeyError("layerlab bug")

    monkeypatch.setattr(hooks, "tensor_stats", broken)
    model = nn.Linear(2, 2)
    with pytest.raises(KeyError, match="layerlab bug"):
        layerlab.inspect(model, torch.randn(1, 2))
    assert _hooks(model) == 0
