"""A Hugging Face model that pickle refuses (Wav2Vec2's weight-norm positional conv) reaches the ranks
rebuilt from its class and config, its weights loaded after, as a training script builds it in each
rank. Before, ddp_check stopped with "the ranks cannot receive the model"."""

import pickle

import pytest
import torch

import layerlab
from layerlab.distributed.run import ConfigBuild


def _wav2vec2():
    tf = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    torch.manual_seed(0)
    config = tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               conv_dim=[16, 16], conv_stride=[5, 4], conv_kernel=[10, 8], num_conv_pos_embeddings=8,
                               num_conv_pos_embedding_groups=2, layerdrop=0.0, hidden_dropout=0.0,
                               attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
                               mask_time_prob=0.0)
    return tf.Wav2Vec2Model(config).train()


def test_an_unpicklable_hf_model_is_rebuilt_in_the_ranks_and_ddp_agrees():
    model = _wav2vec2()
    with pytest.raises(Exception):  # the truth: pickle refuses the weight-norm parametrization
        pickle.dumps(model)
    rebuilt = ConfigBuild.of(model)()
    rebuilt.load_state_dict(model.state_dict())  # the rank's model: same class, config and weights
    x = torch.randn(4, 400)
    torch.testing.assert_close(rebuilt.eval()(x).last_hidden_state, model.eval()(x).last_hidden_state)
    report = layerlab.ddp_check(model.train(), x, nproc=2)
    assert report.ok, [f.message for f in report.findings]
    assert not [f for f in report.findings if f.severity == "error"]


def test_a_picklable_model_is_still_pickled():
    assert ConfigBuild.of(torch.nn.Linear(2, 3)) is None
