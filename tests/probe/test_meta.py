"""``layerlab.inspect(..., meta=True)``: a shape-only run must see what a real run sees, allocate
nothing of the model's, and never turn a missing value into a finding about the model."""

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.errors import UsageError


def _calls(report):
    """Every call's path, class, parameter count, and its inputs' and outputs' shapes and dtypes."""
    return [
        (c.path, c.call, c.class_name, c.params, c.status,
         [(i.name, i.shape, i.dtype, i.requires_grad) for i in c.inputs if i.is_tensor],
         [(o.name, o.shape, o.dtype, o.requires_grad) for o in c.outputs if o.is_tensor])
        for c in report.calls
    ]


def _same_as_real(model, *inputs, **kwargs):
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    real = layerlab.inspect(model, *inputs, **kwargs)
    meta = layerlab.inspect(model, *inputs, meta=True, **kwargs)
    assert real.ok and meta.ok, (real.failure, meta.failure)
    assert len(meta.calls) == len(real.calls) > 3
    assert _calls(meta) == _calls(real)
    assert [(c.path, c.predicted, c.actual, c.passed) for c in meta.checks] == \
        [(c.path, c.predicted, c.actual, c.passed) for c in real.checks]
    assert (meta.total_params, meta.trainable_params) == (real.total_params, real.trainable_params)
    # the user's model was neither moved nor changed
    after = model.state_dict()
    assert all(t.device.type == "cpu" and torch.equal(before[n], t) for n, t in after.items())
    return real, meta


def test_torch_nn_model_shapes_equal_a_real_run():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 8 * 8, 16), nn.Dropout(0.1), nn.Linear(16, 4),
    )
    real, meta = _same_as_real(model, torch.randn(2, 3, 16, 16))
    assert all(i.device == "meta" for c in meta.calls for i in c.tensor_inputs)
    assert all(i.stats is None and i.grad is None for c in meta.calls for i in (*c.inputs, *c.outputs))
    assert meta.problems == [] and meta.notes == []  # no gradient norms: nothing to warn about
    assert all(p.grad_norm is None and p.flags == [] for p in meta.params)


def test_plain_tensor_attributes_and_old_weight_norm_hooks_are_copied_as_meta():
    # the deprecated hook API keeps ``weight`` as an attribute computed from weight_g / weight_v (a
    # non-leaf tensor, which deepcopy refuses); spectral_norm keeps a plain one; ``scale`` is a constant
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 5)
            self.scale = torch.full((5,), 2.0)

        def forward(self, x):
            return self.lin(x) * self.scale

    torch.manual_seed(0)
    with pytest.warns(FutureWarning):
        conv = nn.utils.weight_norm(nn.Conv1d(4, 8, 3))
    model = nn.Sequential(conv, nn.ReLU(), nn.Flatten(1), nn.utils.spectral_norm(nn.Linear(64, 5)), Scaled())
    x = torch.randn(2, 4, 10)
    real, meta = _same_as_real(model, x)
    assert meta.calls[-1].outputs[0].shape == [2, 5]
    weight = conv.weight  # (the real run's forward recomputed it: the hook does, on every call)
    assert layerlab.inspect(model, x, meta=True).ok
    assert conv.weight is weight and weight.device.type == "cpu"  # the meta run left it alone


def test_transformer_encoder_shapes_equal_a_real_run():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    x = torch.randn(3, 5, 16)
    _same_as_real(model, x, mask=mask, is_causal=True)
    # without is_causal, torch compares the mask's values with a causal one: meta cannot, and says so
    failed = layerlab.inspect(model, x, mask=mask, meta=True)
    assert failed.failure.path == "" and failed.failure.diagnosis.cause == "data-dependent"


def test_tiny_llama_shapes_equal_a_real_run():
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    _, meta = _same_as_real(model, torch.randint(0, 50, (2, 7)))
    rotary = meta.call("model.rotary_emb")  # cos/sin tables: made in forward, no gradient flows to them
    assert rotary.outputs[0].shape == [1, 7, 8] and not rotary.outputs[0].requires_grad


def test_memory_estimate_is_bytes_of_real_outputs_grads_and_params():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 6).double(), nn.Tanh())
    model[0].weight.requires_grad_(False)
    ids = torch.randint(0, 20, (3, 5))

    class Cast(nn.Module):  # the embedding is float32, the linear float64
        def forward(self, x):
            return x.double()

    model.insert(1, Cast())
    meta = layerlab.inspect(model, ids, meta=True)
    assert meta.ok, meta.failure
    # the same outputs on real torch
    outs, x = [], ids
    for layer in model:
        x = layer(x)
        outs.append(x)
    rows = {row.path: row for row in meta.memory.layers}
    for i, out in enumerate(outs):
        assert rows[str(i)].activation_bytes == out.numel() * out.element_size()
    # the frozen embedding's output gets no gradient; the others get one of their own size
    assert rows["0"].grad_bytes == 0
    assert rows["2"].grad_bytes == outs[2].numel() * outs[2].element_size()
    assert rows["2"].param_bytes == sum(p.numel() * p.element_size() for p in model[2].parameters())
    # totals count each tensor once: the Sequential's output is its Tanh's output
    assert meta.memory.activation_bytes == sum(o.numel() * o.element_size() for o in outs)
    assert meta.memory.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert meta.memory.param_grad_bytes == sum(p.numel() * p.element_size() for p in model[2].parameters())


def test_a_shape_failure_is_blamed_as_in_a_real_run():
    model = nn.Sequential(nn.Embedding(10, 16), nn.Conv1d(16, 8, 3))
    ids = torch.randint(0, 10, (2, 12))
    real = layerlab.inspect(model, ids)
    meta = layerlab.inspect(model, ids, meta=True)
    for r in (real, meta):
        assert r.failure is not None and r.failure.path == "1"
    assert meta.failure.diagnosis.cause == real.failure.diagnosis.cause == "layout"
    assert meta.failure.diagnosis.hint == real.failure.diagnosis.hint
    assert meta.failure.diagnosis.verified.outputs == real.failure.diagnosis.verified.outputs == [[2, 8, 10]]


class _BranchOnValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        return self.b(x) if x.sum() > 0 else x


class _TensorWithoutDevice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x) + torch.ones(x.shape[-1])  # made on the default device, as users write it


def test_a_step_that_needs_values_is_said_so_not_blamed_on_the_model():
    assert layerlab.inspect(_BranchOnValue(), torch.randn(2, 4)).ok
    meta = layerlab.inspect(_BranchOnValue(), torch.randn(2, 4), meta=True)
    assert meta.failure is not None and meta.failure.diagnosis.cause == "data-dependent"
    assert [c.status for c in meta.calls] == ["raised", "ok"]  # the call before it was recorded
    # a tensor made without device= follows the run onto meta, as it follows a model onto its device
    assert layerlab.inspect(_TensorWithoutDevice(), torch.randn(2, 4), meta=True).ok


def test_a_model_built_on_meta_is_inspected_in_place():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 10))
    meta = layerlab.inspect(model, torch.randn(2, 4096), meta=True)
    assert meta.ok and meta.call("2").outputs[0].shape == [2, 10]
    assert meta.memory.param_bytes == (4096 * 4096 + 4096 + 4096 * 10 + 10) * 4
    with pytest.raises(UsageError, match="meta"):  # without meta=True: values are needed
        layerlab.inspect(model, torch.randn(2, 4096))
