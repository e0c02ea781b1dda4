"""Second false-alarm sweep: every command on stock Hugging Face models the other tests do not use.

The sweep ran inspect (default and --ops), gradcheck, train-check, precision-check, export-check,
profile, ddp-check and diff on 14 tiny models of :mod:`tests.stock_sweep_models` (OPT, GPT-NeoX,
Gemma, BLOOM, ALBERT, ELECTRA, DeBERTa-v2, MPNet, BART, MobileNetV2, Segformer, BEiT, RegNet,
Wav2Vec2). Each test here is one finding that plain torch showed to be false, on the smallest model
that showed it: the truth is measured with torch in the test, then layerlab must agree with it.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import layerlab
from tests.stock_sweep_models import MODELS

pytest.importorskip("transformers", reason="stock Hugging Face models need the [hf] extra")


def _unit_projection(out: torch.Tensor) -> torch.Tensor:
    r = torch.rand(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype) * 2 - 1
    return r / r.norm()


def test_deberta_pos_key_bias_is_zero_by_construction_and_said_as_a_note():
    """inspect warned "the gradient of encoder.layer.0.attention.self.pos_key_proj.bias is vanishing".
    DeBERTa's content→position term scores q_i·(pos_key[δ(i, j)] + b): the bias adds q_i·b to every
    logit of query i alike, and softmax ignores that, as it does BERT's key bias."""
    model, _, kwargs = MODELS["deberta_v2"]()
    wide = copy.deepcopy(model).train().double()  # plain torch, float64: the gradient is 0 up to rounding
    out = wide(**kwargs).last_hidden_state
    (out * _unit_projection(out)).sum().backward()
    attn = wide.encoder.layer[0].attention.self
    assert attn.pos_key_proj.bias.grad.norm() < 1e-12 * attn.pos_key_proj.weight.grad.norm()
    assert attn.key_proj.bias.grad.norm() > 1e-3 * attn.key_proj.weight.grad.norm()  # its p2c term is real

    report = layerlab.inspect(model.train(), **kwargs)
    assert not report.warnings, [p.message for p in report.warnings]
    [note] = [n for n in report.notes if n.code == "expected-grad:key-bias"]
    assert sorted(note.data["params"]) == [f"encoder.layer.{i}.attention.self.pos_key_proj.bias" for i in (0, 1)]


@pytest.mark.parametrize("seed", [0, 2])
def test_wav2vec2_layers_skipped_by_layerdrop_are_a_note_naming_the_draw(seed):
    """inspect warned "trainable parameter encoder.layers.0.attention.k_proj.weight received no gradient:
    its module never ran … remove it, use it, or freeze it" ×32: Wav2Vec2's encoder skips each layer
    with probability config.layerdrop = 0.1 in train mode, and these seeds skip some."""
    model, _, kwargs = MODELS["wav2vec2"]()
    model.train()
    ran = set()
    hooks = [layer.register_forward_hook(lambda *_, i=i: ran.add(i)) for i, layer in enumerate(model.encoder.layers)]
    torch.manual_seed(seed)
    model(**kwargs)
    for h in hooks:
        h.remove()
    skipped = [f"encoder.layers.{i}" for i in range(len(model.encoder.layers)) if i not in ran]
    assert skipped, "plain torch: this seed must skip a layer for the test to mean anything"

    report = layerlab.inspect(model, seed=seed, **kwargs)
    assert not report.warnings, [p.message for p in report.warnings]
    [note] = [n for n in report.notes if n.code == "layer-dropped"]
    assert note.data["layers"] == skipped and "layerdrop=0.1" in note.message, note.message
    assert len(note.data["params"]) == 16 * len(skipped)  # every parameter of the skipped layers

    evaluated = layerlab.inspect(model, seed=seed, mode="eval", **kwargs)  # eval: every layer runs
    assert not evaluated.warnings and not [n for n in evaluated.notes if n.code == "layer-dropped"]


def test_wav2vec2_input_made_to_require_grad_in_forward_is_not_an_unregistered_tensor():
    """train-check warned "the loss depends on 1 tensor(s) that require grad but are not parameters
    (shape [2, 1, 400]) … captured from outside the model": Wav2Vec2FeatureEncoder sets
    input_values[:, None].requires_grad = True in train mode (for gradient checkpointing)."""
    model, _, kwargs = MODELS["wav2vec2"]()
    model.train()
    out = model(**kwargs).last_hidden_state
    params = {id(p) for p in model.parameters()}
    from layerlab.train.unregistered import leaves

    strays = [t for t in leaves([out.sum()]) if id(t) not in params]  # plain autograd graph, walked
    [stray] = strays
    assert list(stray.shape) == [2, 1, 400]
    assert stray.untyped_storage().data_ptr() == kwargs["input_values"].untyped_storage().data_ptr()  # the input

    report = layerlab.train_check(model, steps=3, **kwargs)
    assert not report.flag("unregistered"), [f.message for f in report.flag("unregistered")]


def test_a_tensor_captured_from_outside_is_still_reported():
    """The control: a loss with its own weight that requires grad is still an unregistered tensor."""
    torch.manual_seed(0)
    weight = torch.randn(4, requires_grad=True)
    report = layerlab.train_check(torch.nn.Linear(3, 4), torch.randn(8, 3), steps=3,
                                  loss=lambda pred, target: ((pred - target) ** 2 * weight.abs()).mean())
    [flag] = report.flag("unregistered")
    assert "captured from outside the model" in flag.message and "[4]" in flag.message, flag.message


def test_mobilenet_v2_bias_before_a_train_mode_batchnorm_is_zero_by_construction_not_a_zeroed_input():
    """train-check warned "mobilenet_v2.layer.12.reduce_1x1.normalization (BatchNorm2d): its gradient is
    exactly 0 … its input is all zeros here": only the β is 0 (the weight learns), the input is not
    zero, and the next block's train-mode BatchNorm subtracts the batch mean, so no shift matters."""
    model, _, kwargs = MODELS["mobilenet_v2"]()
    model.train()
    probe = copy.deepcopy(model)  # plain torch, one forward and backward on a copy
    names = [f"mobilenet_v2.layer.{i}.reduce_1x1.normalization" for i in range(12, 16)]
    seen = {}

    def watch(name):
        def hook(module, inputs, output):
            seen[name] = float(inputs[0].detach().abs().max())  # what feeds the BatchNorm
            output.register_hook(lambda g: seen.__setitem__(name + ":grad", float(g.norm())))
        return hook

    for name in names:
        probe.get_submodule(name).register_forward_hook(watch(name))
    logits = probe(**kwargs).logits
    (logits * _unit_projection(logits)).sum().backward()
    for name in names:
        bn = probe.get_submodule(name)
        assert torch.equal(bn.bias.grad, torch.zeros_like(bn.bias.grad)), name  # exactly 0
        assert bn.weight.grad.abs().max() > 0 and seen[name] > 0 and seen[name + ":grad"] > 0, name  # input not 0

    report = layerlab.train_check(model, steps=5, **kwargs)  # exactly 0 at each of 5 steps already
    assert not report.flag("zero-grad"), [f.message for f in report.flag("zero-grad")]
    [note] = [n for n in report.notes if "zero by construction" in n]
    assert all(f"{name}.bias" in note for name in names) and "input is all zeros" not in note, note


def test_segformer_gradient_zero_by_construction_is_not_compared_in_bfloat16():
    """precision-check warned "gradient of segformer.stages.1.layer_norm.bias is off by 3.5e+04
    (4.51e+06·eps)" and forecast a float16 underflow of it: in float64 that gradient is ~1e-17 (the
    decode head's train-mode BatchNorm removes the shift), so both runs compare rounding noise; its
    float32 RMS sits just above the 1e-5 × median bar that used to wave such noise through."""
    from layerlab.mixed.compare import NEGLIGIBLE, SUSPECT

    model, _, kwargs = MODELS["segformer"]()
    model.train()
    rms = {}
    for dtype in (torch.float32, torch.float64):
        wide = copy.deepcopy(model).to(dtype)
        torch.manual_seed(0)
        out = wide(pixel_values=kwargs["pixel_values"].to(dtype)).logits
        (out * _unit_projection(out)).sum().backward()
        rms[dtype] = {n: float(p.grad.norm()) / math.sqrt(p.numel()) for n, p in wide.named_parameters()}
    name = "segformer.stages.1.layer_norm.bias"
    median = sorted(rms[torch.float32].values())[len(rms[torch.float32]) // 2]
    assert NEGLIGIBLE * median < rms[torch.float32][name] < SUSPECT * median  # noise above the old bar
    assert rms[torch.float64][name] < 1e-6 * rms[torch.float32][name]  # ... and an exact zero in float64

    report = layerlab.precision_check(model, **kwargs)
    bad = [(f.kind, f.where) for r in report.runs for f in r.findings if f.severity in ("warning", "error")]
    bad += [(f.kind, f.where) for f in report.forecast if f.severity in ("warning", "error")]
    assert report.ok and not bad, bad
    assert next(p for p in report.runs[0].params if p.name == name).negligible


def test_beit_drop_path_is_a_random_draw_not_samples_interacting():
    """ddp-check failed BEiT with "samples interact across the batch": with drop path off the whole
    batch's gradient is the mean of the shards' (no interaction); drop path (rate 0.1) draws other
    masks per shard, and the seed probe on a one-sample shard drew the same masks at both seeds."""
    model, _, kwargs = MODELS["beit"]()
    model.train()
    pixels = kwargs["pixel_values"]
    weights = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))

    def grads(m, rows, seed):
        m = copy.deepcopy(m)
        torch.manual_seed(seed)
        ((m(pixel_values=pixels[rows]).logits * weights[rows]).sum(-1).mean()).backward()
        return {n: p.grad for n, p in m.named_parameters()}

    still = copy.deepcopy(model)
    for m in still.modules():
        if hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
    whole, first, second = grads(still, [0, 1], 0), grads(still, [0], 0), grads(still, [1], 0)
    for n, g in whole.items():  # plain torch: the samples do not interact
        torch.testing.assert_close(g, (first[n] + second[n]) / 2, rtol=1e-4, atol=1e-6)
    probe_a, probe_b = grads(model, [0], 0), grads(model, [0], 1)
    assert all(torch.equal(probe_a[n], probe_b[n]) for n in probe_a)  # why the seed probe saw no draw

    report = layerlab.ddp_check(model, nproc=2, timeout=30, **kwargs)
    titles = [f.title for f in report.findings]
    assert "samples interact across the batch" not in titles and report.ok, titles
    [draws] = [f for f in report.findings if f.title == "random draws in the step"]
    assert "drop_path" in draws.cause and "two seeds give two gradients" not in draws.message, draws.cause


def test_segformer_ranks_record_hidden_states_after_the_model_crosses_to_them():
    """ddp-check failed Segformer with "rank 0 raised … 'NoneType' object is not subscriptable": a
    model unpickled in a fresh rank was never built there, and transformers ≥ 5 records hidden states
    only for classes built in the process. A training script builds the model in each rank; the ranks
    must see the model that one process sees, so the only findings left are the true ones: the decode
    head's train-mode BatchNorm normalises each shard by its own statistics."""
    model, _, kwargs = MODELS["segformer"]()
    model.train()
    assert model(output_hidden_states=True, **kwargs).hidden_states is not None  # plain torch, built here

    report = layerlab.ddp_check(model, nproc=2, timeout=30, **kwargs)
    titles = [f.title for f in report.findings]
    assert report.ok and not [t for t in titles if "raised" in t], titles
    assert "BatchNorm without SyncBatchNorm" in titles  # decode_head.batch_norm, train mode: true
