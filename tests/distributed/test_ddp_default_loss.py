"""The default loss of ddp-check reads every output a user trains on, dual encoders included.

A dual encoder (CLIP, SigLIP) returns ``logits_per_image`` (B, B): on a rank (B/N, B/N), the pairs
within its shard. The loss used to leave those outputs out, so ``logit_scale``/``logit_bias`` (which
only the logits reach) were reported as unused parameters "cut from the graph" although a DDP run
trains all of them. The truth here is plain torch: which parameters get a gradient in one process
from a loss on every output.
"""

from __future__ import annotations

import pytest
import torch

import layerlab
from layerlab.distributed.loss import MeanLoss, batch_dims
from layerlab.target.bind import flatten

_TEXT = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=16, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_VISION = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, image_size=16,
               patch_size=8, num_channels=3)


def siglip():
    from transformers import SiglipConfig, SiglipModel

    torch.manual_seed(0)
    return SiglipModel(SiglipConfig(text_config=_TEXT, vision_config=_VISION)).eval()


def clip():
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    return CLIPModel(CLIPConfig(text_config={**_TEXT, "projection_dim": 16},
                                vision_config={**_VISION, "projection_dim": 16}, projection_dim=16)).eval()


def batch():
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(3, 99, (4, 7), generator=g),
            "pixel_values": torch.randn(4, 3, 16, 16, generator=g)}


def trained_by_every_output(model, inputs):
    """Plain torch, one process: the parameters a loss on every floating output gives a gradient."""
    model.zero_grad()
    g = torch.Generator().manual_seed(2)
    out = model(**inputs)
    sum((t * torch.randn(t.shape, generator=g)).sum() for _, t in flatten(out)
        if t.is_floating_point() and t.requires_grad).backward()
    return {n for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("make, count", [(siglip, 88), (clip, 78)], ids=["siglip", "clip"])
def test_dual_encoder_logit_scale_is_trained_not_reported_unused(make, count):
    model, inputs = make(), batch()
    truth = trained_by_every_output(make(), inputs)
    assert len(truth) == count and "logit_scale" in truth  # every parameter trains, logit_scale included
    r = layerlab.ddp_check(model, nproc=2, timeout=60, **inputs)
    assert r.ok and r.findings == [], [f.title for f in r.findings]  # before: "unused parameters: logit_scale…"
    for rank in r.raw:
        assert {n for n, norm in rank["ddp"]["grad_norms"].items() if norm is not None} == truth
    assert all(p.status == "ok" for p in r.params)
    assert any("logits_per_image" in n and "pairs across shards" in n for n in r.notes)


@pytest.mark.slow  # transformers' import and SigLIP's build
def test_default_loss_of_the_whole_batch_is_the_mean_of_the_ranks_losses_on_a_dual_encoder():
    """What makes DDP's average equal one process: with SigLIP's real outputs, the loss of the whole
    batch equals the mean of each shard's loss, though the logits split on two dims."""
    model, inputs = siglip(), batch()
    loss = MeanLoss(seed=0)
    shards = [model(**{k: v[2 * r:2 * r + 2] for k, v in inputs.items()}) for r in range(2)]
    whole = model(**inputs)
    loss.expect_shard(shards[0], 2)
    loss.observe(whole)
    assert loss.blockwise == {"output['logits_per_image']": (0, 1), "output['logits_per_text']": (0, 1)}
    assert loss.left_out == []
    per_rank = [float(loss(s, {}, r, 2).detach()) for r, s in enumerate(shards)]
    assert float(loss(whole, {}, None, 2).detach()) == pytest.approx(sum(per_rank) / 2, rel=1e-5, abs=1e-7)


def test_batch_dims_reads_one_or_several_dims_and_refuses_the_rest():
    assert batch_dims((8, 16), (4, 16), 2) == (0,)
    assert batch_dims((8, 8), (4, 4), 2) == (0, 1)  # similarities within a shard
    assert batch_dims((8, 8), (4, 8), 2) == (0,)  # a rank against every sample (all-gathered): one dim
    assert batch_dims((8, 3), (4, 4), 2) is None  # a dim that neither splits nor stays
    assert batch_dims((5,), (5,), 2) is None  # shared by every sample
    assert batch_dims((), (), 2) is None  # a scalar the model computed
