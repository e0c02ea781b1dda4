"""ddp-check at real sizes: models with hundreds of tensors, and GPT-2 124M, on 2 CPU ranks.

The job reaches the ranks as one file of tensor bytes (layerlab/distributed/transport.py), not one
file descriptor per tensor: a model with more than ~254 parameters and buffers used to stop with
``ValueError: too many fds``. The gradients DDP leaves on the ranks are checked against plain torch's
backward on the whole batch in this process (never against layerlab's own single-process side).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import layerlab
import layerlab.distributed.assemble as assemble_module
from tests.distributed import scale_models as M


@pytest.fixture
def rank_results(monkeypatch):
    """What each rank sent back, tensors included: the gradients DDP left after its all-reduce."""
    seen = {}
    real = assemble_module.assemble

    def spy(base, module, single, results, find_unused):
        seen["results"] = results
        return real(base, module, single, results, find_unused)

    monkeypatch.setattr(assemble_module, "assemble", spy)
    return seen


def torch_grads(model, loss, **inputs):
    """Plain torch: one process, the whole batch, one backward."""
    model = copy.deepcopy(model)
    model.zero_grad()
    loss(model(**inputs), inputs).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def worst_difference(results, want):
    """max |DDP − torch| over every rank and parameter, and that relative to the model's largest |grad|.

    Relative to the model's largest gradient, not each parameter's: a parameter whose gradient is a sum
    of terms that cancel to a tiny value rounds by a large part of itself whenever the order changes."""
    worst = 0.0
    for rank in results:
        for name, g in want.items():
            worst = max(worst, float((rank["ddp"]["grads"][name].double() - g.double()).abs().max()))
    return worst, worst / max(float(g.abs().max()) for g in want.values())


def test_a_model_with_more_tensors_than_a_process_can_pass_descriptors_runs():
    # 127 Linear layers = 254 tensors: the fork server passes at most 256 descriptors, one per tensor before
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(127)])
    r = layerlab.ddp_check(model, torch.randn(4, 4, generator=torch.Generator().manual_seed(0)), nproc=2, timeout=30)
    assert [row.status for row in r.ranks] == ["ok", "ok", "ok"]
    assert r.ok and r.findings == [], r.findings
    assert len(r.params) == 254 and all(p.status == "ok" for p in r.params)


def test_the_job_folder_is_removed_after_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(3)])
    r = layerlab.ddp_check(model, torch.randn(4, 4), nproc=2, timeout=30)
    assert r.ok
    assert [p for p in os.listdir(tmp_path) if p.startswith("layerlab-ddp-")] == []


@pytest.mark.slow
def test_resnet50_sized_model_gradient_equals_torch(rank_results):
    # float64: this randomly initialised ResNet in eval mode sums gradient terms that cancel by ~1e5 in its
    # last block, where float32 rounds by 0.6 % of the model's largest gradient whenever the summation order
    # changes (plain torch with 1 thread against 2 already differs that much); float64 leaves a clean truth
    model = M.resnet50_like().double().eval()  # eval: BatchNorm's running statistics, DDP must equal one process
    assert len(list(model.parameters())) + len(list(model.buffers())) == 320  # past the old limit of ~254
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    r = layerlab.ddp_check(model, x, nproc=2, timeout=120, loss=M.logsumexp_loss)
    assert r.ok and r.findings == [], r.findings
    assert len(r.params) == 161 and all(p.status == "ok" for p in r.params)
    worst, worst_rel = worst_difference(rank_results["results"], torch_grads(model, M.logsumexp_loss, input=x))
    assert worst_rel < 1e-9, (worst, worst_rel)  # float64 sums in another order over 2 ranks


@pytest.mark.slow
def test_gpt2_124m_matches_torch_on_two_ranks(rank_results):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()  # eval: no dropout, so one process and DDP draw nothing
    assert sum(p.numel() for p in model.parameters()) == 124_439_808
    ids = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(1))
    r = layerlab.ddp_check(model, input_ids=ids, nproc=2, timeout=120, loss=M.lm_loss)
    assert r.ok and r.findings == [], r.findings
    assert [row.status for row in r.ranks] == ["ok", "ok", "ok"]
    worst, worst_rel = worst_difference(rank_results["results"], torch_grads(model, M.lm_loss, input_ids=ids))
    # tolerance: float32 sums in another order over 2 ranks: 1e-5 of the model's largest gradient
    assert worst_rel < 1e-5, (worst, worst_rel)
