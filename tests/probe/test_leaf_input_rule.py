"""Hugging Face's audio models set requires_grad on a slice of their input in training; given an input
that requires grad (a spec's floating input does by default), torch refuses. The blame is the input's
flag, verified by re-running with the input detached."""

import pytest
import torch

import layerlab


def _wav2vec2():
    tf = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    torch.manual_seed(0)
    config = tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               conv_dim=[16, 16], conv_stride=[5, 4], conv_kernel=[10, 8],
                               num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2)
    return tf.Wav2Vec2Model(config).train()


def test_wav2vec2_input_requiring_grad_is_blamed_on_the_flag_and_the_fix_runs():
    model, x = _wav2vec2(), torch.randn(2, 400)
    with pytest.raises(RuntimeError, match="leaf variables"):  # the truth: plain torch raises the same way
        model(x.clone().requires_grad_(True))
    torch.manual_seed(0)
    want = model(x).last_hidden_state  # and runs without the flag
    report = layerlab.inspect(model, x.clone().requires_grad_(True), backward=False)
    d = report.failure.diagnosis
    assert d.cause == "input-requires-grad" and d.fix.code == "input_values.detach()"
    assert "requires_grad: false" in d.hint
    assert d.verified.status == "runs" and d.verified.outputs[0] == list(want.shape)


def test_a_flag_set_on_a_tensor_made_from_a_parameter_is_not_blamed_on_the_input():
    class OwnTensor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            scale = self.w * 2
            scale.requires_grad = False  # the model's own mistake: scale is computed from w, whatever x is
            return x * scale

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf variables"):  # the truth: it raises with x detached too
        OwnTensor()(x.detach())
    report = layerlab.inspect(OwnTensor(), x, backward=False)
    d = report.failure.diagnosis
    assert d is None or d.cause != "input-requires-grad"
