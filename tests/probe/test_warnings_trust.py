"""inspect's gradient warnings on stock structures: what is zero or tiny *by construction* becomes a
note that says why, one finding names the root of a chain of zero gradients, and everything else
stays a warning. Plus two crashes that must not happen: lazy modules and nested tensors.

Every "by construction" claim is checked against torch itself: perturbing the parameter does not
change the output, or the flag goes away when the structure is removed.
"""

import copy

import pytest
import torch
import torch.nn as nn

import layerlab


def _hf():
    return pytest.importorskip("transformers", reason="Hugging Face transformers is not installed (pip install transformers)")


def _ids():
    return torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(0))


def _warned(report, suffix):
    return [p for p in report.problems if (p.where or "").endswith(suffix)]


# -- 1. zero or tiny by construction ---------------------------------------------------------------
def _bert(tf):
    torch.manual_seed(0)
    return tf.BertModel(tf.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                      intermediate_size=64, vocab_size=100))


def test_bert_key_bias_is_a_note_not_a_vanishing_warning():
    tf = _hf()
    model = _bert(tf)
    report = layerlab.inspect(model, _ids())
    keys = [f"encoder.layer.{i}.attention.self.key.bias" for i in range(2)]
    for name in keys:
        rec = report.param(name)
        assert rec.flags in (["vanishing"], ["zero-grad"]), rec  # the fact stays
        assert "shift-invariant along the key axis" in rec.expected
        assert not _warned(report, name)
    assert report.param("encoder.layer.0.attention.self.query.bias").expected is None
    assert report.warnings == [] and report.ok
    (note,) = [n for n in report.notes if n.code == "expected-grad:key-bias"]
    assert note.severity == "info" and note.data["params"] == keys
    assert note.message.startswith("2 attention key biases get a zero gradient by construction")
    # torch agrees: moving the key bias leaves the output unchanged, moving the query bias does not
    model.eval()
    ids = _ids()
    with torch.no_grad():
        before = model(ids).last_hidden_state
        model.encoder.layer[0].attention.self.key.bias.add_(10 * torch.randn(32))
        assert (model(ids).last_hidden_state - before).abs().max() < 1e-5  # float32 rounding only
        model.encoder.layer[0].attention.self.query.bias.add_(10 * torch.randn(32))
        assert (model(ids).last_hidden_state - before).abs().max() > 1e-3


class _Scaled(nn.Module):
    """A stock model whose output is multiplied by a tiny constant: every gradient in it vanishes."""

    def __init__(self, inner, factor, pick=lambda out: out):
        super().__init__()
        self.inner, self.factor, self.pick = inner, factor, pick

    def forward(self, *args):
        return self.pick(self.inner(*args)) * self.factor


def test_a_key_bias_is_explained_but_the_other_vanishing_gradients_stay_warnings():
    tf = _hf()
    report = layerlab.inspect(_Scaled(_bert(tf), 1e-9, lambda out: out.last_hidden_state), _ids())
    key = "inner.encoder.layer.0.attention.self.key.bias"
    assert report.param(key).expected is not None and not _warned(report, key)
    for name in ("inner.encoder.layer.0.attention.self.query.bias", "inner.encoder.layer.0.attention.self.key.weight"):
        assert report.param(name).expected is None
        assert [p.code for p in _warned(report, name)] == ["vanishing"]


def _conv_bn_block():
    """MobileNet-style conv → BN → Hardswish blocks, built with bias=True, and a Linear → BN1d."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Hardswish(),
        nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * 8 * 8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4),
    )


def test_bias_feeding_a_train_mode_batchnorm_is_a_note():
    model, x = _conv_bn_block(), torch.randn(4, 3, 8, 8)
    report = layerlab.inspect(model, x)
    explained = ["0.bias", "3.bias", "7.bias"]
    assert [p.name for p in report.params if p.expected] == explained
    for name in explained:
        assert report.param(name).flags == ["vanishing"] and "BatchNorm" in report.param(name).expected
    assert report.warnings == [] and report.ok
    (note,) = report.notes
    assert note.code == "expected-grad:bias-before-norm" and note.data["params"] == explained
    # torch agrees: in train mode the bias does not change the output; in eval mode it does
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].bias.add_(1.0)
        torch.testing.assert_close(twin(x), copy.deepcopy(model)(x), rtol=1e-4, atol=1e-5)
        assert (twin.eval()(x) - copy.deepcopy(model).eval()(x)).abs().max() > 1e-2
    assert [p.name for p in layerlab.inspect(model, x, mode="eval").params if p.expected] == []


def test_bias_before_batchnorm_is_explained_but_other_vanishing_gradients_stay():
    report = layerlab.inspect(_Scaled(_conv_bn_block(), 1e-9), torch.randn(4, 3, 8, 8))
    assert [p.name for p in report.params if p.expected] == ["inner.0.bias", "inner.3.bias", "inner.7.bias"]
    assert [p.code for p in _warned(report, "inner.0.weight")] == ["vanishing"]
    assert [p.code for p in _warned(report, "inner.9.bias")] == ["vanishing"]


class _InvertedResidual(nn.Module):
    """MobileNetV2/V3's block as torchvision builds it: 1×1 expand, depthwise 3×3, 1×1 project +
    BatchNorm with no activation, a residual add when shapes allow. The projection BatchNorm's β
    reaches the next block's expansion BatchNorm through a 1×1 conv (and the add)."""

    def __init__(self, c, e, residual):
        super().__init__()
        self.residual = residual
        self.block = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish(),
                                   nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e),
                                   nn.Hardswish(), nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


def _mobilenet_like():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.Hardswish(),
                         _InvertedResidual(8, 16, False), _InvertedResidual(8, 16, True),
                         _InvertedResidual(8, 16, True), nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16),
                         nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))


def test_a_norm_bias_whose_shift_reaches_a_later_batchnorm_is_a_note():
    model, x = _mobilenet_like(), torch.randn(4, 3, 16, 16)
    report = layerlab.inspect(model, x)
    explained = ["3.block.7.bias", "4.block.7.bias", "5.block.7.bias"]
    assert [p.name for p in report.params if p.expected] == explained
    assert report.warnings == [] and report.ok
    # torch agrees: shifting a projection BatchNorm's β leaves the train-mode output unchanged
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[4].block[7].bias.add_(1.0)
        torch.testing.assert_close(twin(x), copy.deepcopy(model)(x), rtol=1e-4, atol=1e-5)
    # in eval mode the shift matters, and nothing is excused
    assert [p.name for p in layerlab.inspect(model, x, mode="eval").params if p.expected] == []


def _convnext(tf, gamma):
    torch.manual_seed(0)
    config = tf.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                               layer_scale_init_value=gamma, image_size=32)
    return tf.ConvNextModel(config)


def test_convnext_layer_scale_gives_expected_small_gradients():
    tf = _hf()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    report = layerlab.inspect(_convnext(tf, 1e-6), x)
    assert report.warnings == [] and report.ok, report.problems
    rec = report.param("encoder.stages.0.layers.0.dwconv.weight")
    assert rec.flags == ["vanishing"]
    assert rec.expected.startswith("layer scale γ=1e-06 at init (encoder.stages.0.layers.0.layer_scale_parameter)")
    assert rec.expected.endswith("expected small gradient")
    (note,) = report.notes
    assert note.code == "expected-grad:layer-scale" and "encoder.stages.1.layers.0.pwconv2.weight" in note.data["params"]
    # the cause is γ: the same model with γ = 1 has no small gradient to explain
    plain = layerlab.inspect(_convnext(tf, 1.0), x)
    assert [p.name for p in plain.params if p.flags] == [] and plain.notes == []


def test_layer_scale_does_not_excuse_a_model_whose_every_gradient_vanishes():
    tf = _hf()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    report = layerlab.inspect(_Scaled(_convnext(tf, 1e-6), 1e-12, lambda out: out.last_hidden_state), x)
    assert not [p for p in report.params if p.expected]
    assert [p.code for p in _warned(report, "inner.encoder.stages.0.layers.0.dwconv.weight")] == ["vanishing"]


def test_a_layer_scale_held_by_its_own_child_module_is_recognised_too():
    tf = _hf()  # DINOv2 keeps γ in a child module (layer_scale1.lambda1), like timm's LayerScale
    torch.manual_seed(0)
    model = tf.Dinov2Model(tf.Dinov2Config(image_size=32, patch_size=8, num_hidden_layers=1, hidden_size=32,
                                           num_attention_heads=4, mlp_ratio=2, layerscale_value=1e-6))
    report = layerlab.inspect(model, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert not [p for p in report.warnings if p.code in ("vanishing", "vanishing-activation-grad")]
    scaled = [p for p in report.params if p.flags == ["vanishing"] and "key axis" not in p.expected]
    assert len(scaled) >= 5 and "encoder.layer.0.norm1.weight" in [p.name for p in scaled]
    assert all(p.expected.startswith("layer scale γ=1e-06 at init (encoder.layer.0.layer_scale") for p in scaled)


# -- 2. one root for a chain of zero gradients -----------------------------------------------------
class _TinyViT(nn.Module):
    """torchvision's ViT layout: conv patches, a class token, an encoder, ``heads.head`` zeroed."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv_proj = nn.Conv2d(3, 16, 4, 4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, 16))
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(16, 10))
        nn.init.zeros_(self.heads.head.weight)
        nn.init.zeros_(self.heads.head.bias)

    def forward(self, x):
        tokens = self.conv_proj(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.class_token.expand(len(tokens), -1, -1), tokens], 1)
        return self.heads(self.encoder(tokens)[:, 0])


def test_zero_initialised_head_is_one_finding_not_one_warning_per_module():
    model, x = _TinyViT(), torch.randn(2, 3, 16, 16)
    report = layerlab.inspect(model, x)
    upstream = [n for n, _ in model.named_parameters() if not n.startswith("heads.")]
    # torch agrees: every parameter upstream of the head gets exactly zero gradient
    grads = torch.autograd.grad((model(x) * torch.randn(2, 10)).sum(), [p for n, p in model.named_parameters()
                                                                        if n in upstream])
    assert all(not g.any() for g in grads)
    assert all(report.param(n).flags == ["zero-grad"] for n in upstream)
    assert report.warnings == [] and report.ok
    (finding,) = report.notes
    assert finding.code == "zero-grad-root" and finding.where == "heads.head"
    assert finding.message.startswith("everything upstream of heads.head gets zero gradient because "
                                      "heads.head.weight is all zero (zero-initialised head)")
    assert sorted(finding.data["folded"]) == sorted(upstream)


def test_a_frozen_zero_head_stays_a_warning():
    model = _TinyViT()
    model.heads.head.weight.requires_grad_(False)
    report = layerlab.inspect(model, torch.randn(2, 3, 16, 16))
    (finding,) = [p for p in report.problems if p.code == "zero-grad-root"]
    assert finding.severity == "warning" and "stays zero" in finding.message
    assert not [p for p in report.problems if p.code == "zero-grad"]


def test_a_dead_relu_in_the_middle_is_flagged_at_that_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    nn.init.constant_(model[2].bias, -100.0)
    x = torch.randn(4, 8)
    assert model[:3](x).max() <= 0  # torch agrees: every unit of the second ReLU is dead
    report = layerlab.inspect(model, x)
    (finding,) = [p for p in report.problems if p.code == "zero-grad-root"]
    assert finding.severity == "warning" and finding.where == "3"
    assert finding.message.startswith("the gradient stops at 3 (ReLU)")
    assert "(the output of 2 (Linear)) is ≤ 0" in finding.message and "all its units are dead" in finding.message
    assert finding.data["folded"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert finding.data["folded_downstream"] == ["4.weight"]
    assert [p.code for p in report.problems] == ["zero-grad-root"] and report.notes == []


# -- 3. lazy modules, 4. nested tensors ------------------------------------------------------------
@pytest.mark.parametrize("make, shape", [
    (lambda: nn.LazyLinear(4), (2, 3)),
    (lambda: nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3)), (2, 3, 8, 8)),
    (lambda: nn.Sequential(nn.LazyConvTranspose2d(4, 3), nn.LazyBatchNorm2d()), (2, 3, 8, 8)),
])
def test_lazy_modules_are_counted_after_their_first_forward(make, shape):
    torch.manual_seed(0)
    model = make()
    report = layerlab.inspect(model, torch.randn(*shape))
    assert report.ok and report.problems == [], report.problems
    assert report.total_params == sum(p.numel() for p in model.parameters()) > 0
    assert report.call("").params == report.total_params
    for call in report.calls:
        assert call.params == sum(p.numel() for p in model.get_submodule(call.path).parameters())


def test_a_lazy_module_that_never_ran_does_not_crash_the_report():
    model = nn.Sequential(nn.Linear(3, 4), nn.LazyLinear(2))
    report = layerlab.inspect(model, torch.randn(2, 5))
    assert report.failure is not None and report.failure.path == "0"
    assert report.total_params == 16 and [p.name for p in report.params] == ["0.weight", "0.bias"]


def _nested_encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_transformer_encoder_fast_path_with_nested_tensors():
    model, x = _nested_encoder(), torch.randn(2, 5, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    with torch.no_grad():  # no grad: torch takes the nested-tensor fast path
        expected = model(x, src_key_padding_mask=pad)
        report = layerlab.inspect(model, x, src_key_padding_mask=pad)
    assert report.ok and report.failure is None and report.problems == []
    src = report.call("layers.0").inputs[0]
    assert src.nested and src.shape == [2, None, 16]
    real = torch.cat([x[0, :5], x[1, :3]])  # the tokens, without the padding
    assert src.stats.numel == real.numel() == 128
    assert src.stats.mean == pytest.approx(real.mean().item(), abs=1e-6)
    assert src.stats.std == pytest.approx(real.std(unbiased=False).item(), rel=1e-5)
    out = report.call("").outputs[0]
    assert not out.nested and out.shape == [2, 5, 16]
    assert out.stats.mean == pytest.approx(expected.mean().item(), abs=1e-6)
    # with gradients on, torch takes the ordinary path and the backward runs clean
    report = layerlab.inspect(model, x, src_key_padding_mask=pad)
    assert report.ok and report.backward.ran and report.problems == []


class _ZeroInitResidualBlock(torch.nn.Module):
    """A ResNet basic block with torchvision's ``zero_init_residual``: its last BatchNorm starts at 0."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.relu = torch.nn.ReLU()
        torch.nn.init.zeros_(self.bn2.weight)

    def forward(self, x):
        return self.relu(x + self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))


def test_zero_init_residual_branches_are_one_note_each_and_never_blame_the_skip_path():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1),
                                *[_ZeroInitResidualBlock(8) for _ in range(3)],
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    x = torch.randn(4, 3, 12, 12)
    report = layerlab.inspect(model, x)
    # torch: the stem still gets gradient (through the skips), every branch's conv1 gets none
    model.zero_grad()
    model(x).sum().backward()
    assert model[0].weight.grad.abs().sum() > 0
    assert all(not model[i].conv1.weight.grad.any() for i in (1, 2, 3))
    roots = [n for n in report.notes if n.code == "zero-grad-root"]
    assert [n.where for n in roots] == ["1.bn2", "2.bn2", "3.bn2"]
    for i, note in zip((1, 2, 3), roots):
        assert all(name.startswith(f"{i}.") for name in note.data["folded"])  # its own branch only
        assert f"{i}.conv1.weight" in note.data["folded"]
        assert "everything upstream" not in note.message and "still gets gradient by another path" in note.message
    assert report.warnings == [] and report.ok
