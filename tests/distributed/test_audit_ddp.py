"""Audit of ``layerlab ddp-check`` against what plain torch DDP does: regression tests for its misses.

Each truth comes from torch itself — two real gloo ranks of ``DistributedDataParallel`` started here
(:func:`plain_ddp`, one spawn for every case), a one-process gloo group, or one process's autograd —
never from layerlab's formulas. The models live at module level so spawned ranks can import them.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

import layerlab
from layerlab.errors import CheckFailed
from tests.distributed.forked import two_ranks

X = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))


class ParamInForward(nn.Module):
    """Creates ``scale`` on its first forward: after DDP has wrapped the model."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if not hasattr(self, "scale"):
            self.scale = nn.Parameter(torch.ones(8))
        return self.lin(x) * self.scale


class Detached(nn.Module):
    """``encoder``'s output is detached: its forward runs, its parameters never get a gradient."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)).detach())


class NoiseForward(nn.Module):
    """Gaussian noise drawn in forward, no nn.Dropout anywhere."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x + 0.1 * torch.randn_like(x))


class StallsOnRankOne(nn.Module):
    """Rank 1 sleeps in forward — also while a rank builds the model from a spec."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(600)
        return self.lin(x)


class TiedDict(nn.Module):
    """Embedding and output projection share one weight; int64 ids in, a dict with a tuple out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(30, 16)
        self.mix = nn.Linear(16, 16)
        self.lm_head = nn.Linear(16, 30, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        h = torch.tanh(self.mix(self.embed(ids)))
        return {"logits": self.lm_head(h), "aux": (h.mean(1),)}


def lazy_mlp() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 4))


def dropout_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))


# --- plain torch DDP: the truth ---------------------------------------------------------------

_PLAIN_CASES = {"param_in_forward": ParamInForward, "detached": Detached}


def _plain_cases(rank: int) -> dict:
    result = {}
    for name, factory in _PLAIN_CASES.items():
        model = factory()
        ddp = nn.parallel.DistributedDataParallel(model)  # find_unused_parameters=False, as people train
        shard = X.tensor_split(2)[rank]
        ddp(shard).sum().backward()
        grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        second = None
        try:
            ddp(shard)
        except RuntimeError as exc:
            second = str(exc)
        result[name] = {"grads": grads, "second_forward": second}
    return result


@pytest.fixture(scope="module")
def plain_ddp(tmp_path_factory):
    """Every case of ``_PLAIN_CASES`` under two real gloo ranks of DDP: ``{case: [rank0, rank1]}``."""
    ranks = two_ranks(_plain_cases, str(tmp_path_factory.mktemp("plain_ddp")))
    return {name: [ranks[0][name], ranks[1][name]] for name in _PLAIN_CASES}


# --- misses the audit found --------------------------------------------------------------------

def test_lazy_module_is_refused_as_ddp_refuses_it():
    """Before: a traceback from the CLI (spec memory estimate) and from ddp_check(factory); a
    'rank raised' with the wrong fix for a module. Torch's DDP constructor refuses a lazy module."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="uninitialized parameters"):
            nn.parallel.DistributedDataParallel(lazy_mlp())
    finally:
        dist.destroy_process_group()
    for model in (lazy_mlp(), lazy_mlp):  # a module and a factory
        with pytest.raises(CheckFailed, match=r"0 \(LazyLinear\) has uninitialized \(lazy\) parameters") as info:
            layerlab.ddp_check(model, X, nproc=2, timeout=20)
        assert info.value.where == "0" and "dummy batch" in info.value.hint


def test_lazy_spec_is_one_message_on_the_cli(tmp_path):
    from typer.testing import CliRunner

    from layerlab.cli.app import app

    spec = tmp_path / "lazy.yaml"
    spec.write_text("layer: LazyLinear\nargs: {out_features: 4}\ninput: {shape: [8, 8]}\n")
    result = CliRunner().invoke(app, ["ddp-check", str(spec), "--nproc", "2"])
    assert result.exit_code == 1, result.output
    assert "uninitialized (lazy) parameters" in result.output and "Traceback" not in result.output


def test_parameter_created_in_forward_is_named(plain_ddp):
    """Before: both ranks 'raised' in layerlab's own load_state_dict. Truth: DDP never all-reduces
    the gradient of a parameter born after it wrapped the model — the ranks keep different ones."""
    r0, r1 = plain_ddp["param_in_forward"]
    assert torch.equal(r0["grads"]["lin.weight"], r1["grads"]["lin.weight"])  # known to DDP: all-reduced
    assert (r0["grads"]["scale"] - r1["grads"]["scale"]).abs().max() > 1e-3  # not known: each rank its own
    with pytest.raises(CheckFailed, match=r"registers new tensors: scale \(parameter\).*never all-reduces") as info:
        layerlab.ddp_check(ParamInForward(), X, nproc=2, timeout=20)
    assert info.value.where == "scale" and "__init__" in info.value.hint


def test_detached_submodule_blames_the_detach(plain_ddp):
    """Truth: the encoder gets no gradient on either rank and DDP raises at the next forward."""
    truth = plain_ddp["detached"]
    no_grad = sorted(n for n, g in truth[0]["grads"].items() if g is None)
    assert no_grad == ["encoder.bias", "encoder.weight"]
    assert all("Expected to have finished reduction" in r["second_forward"] for r in truth)
    report = layerlab.ddp_check(Detached(), X, nproc=2, timeout=20)
    assert not report.ok
    unused = report.finding("unused parameters")
    assert unused.severity == "error" and unused.where[0] == "encoder"
    assert sorted(p.name for p in report.params if p.status == "unused") == no_grad
    assert ".detach()" in unused.cause and "remove the detach" in unused.fix


def test_random_draws_name_their_source():
    """Before: 'dropout RNG' for a model with no dropout. Truth: the step is random (two seeds, two
    gradients) and there is no nn.Dropout; with dropout, the Dropout module is named."""
    def grad(seed):
        model = NoiseForward()
        torch.manual_seed(seed)
        model(X).sum().backward()
        return model.lin.weight.grad

    assert not torch.equal(grad(0), grad(1))
    assert not any(isinstance(m, nn.Dropout) for m in NoiseForward().modules())
    noise = layerlab.ddp_check(NoiseForward(), X, nproc=2, timeout=20)
    assert noise.ok  # a warning: the comparison cannot be made, nothing is known to be wrong
    assert "no nn.Dropout" in noise.finding("random draws in the step").cause
    dropout = layerlab.ddp_check(dropout_mlp(), X, nproc=2, timeout=20)
    assert dropout.finding("random draws in the step").cause == "dropout in train mode (2)"


def test_stalled_rank_frames_are_the_users_not_layerlabs(tmp_path):
    """Before: a rank stuck while building a spec showed layerlab/spec/memory.py frames as 'where'."""
    spec = tmp_path / "stall.yaml"
    spec.write_text("build: tests.distributed.test_audit_ddp:StallsOnRankOne\ninput: {shape: [8, 8]}\n")
    report = layerlab.ddp_check(str(spec), nproc=2, timeout=3, allow_import=True)
    hung = report.finding("rank 1 hung")
    assert hung.where[0] == "rank 1"
    assert any("test_audit_ddp.py" in w and "in forward" in w for w in hung.where[1:]), hung.where
    assert not any(f"layerlab{os.sep}" in w for w in hung.where[1:]), hung.where


# --- healthy: no false alarm -----------------------------------------------------------------------

def test_tied_weights_int_ids_and_dict_output_match_one_process():
    """Truth: the mean of the two shards' gradients is the whole batch's (a per-sample mean loss), so
    a correct DDP step matches one process; layerlab must say ok with no finding."""
    ids = torch.randint(0, 30, (8, 5), generator=torch.Generator().manual_seed(4))
    w = torch.randn(5, 30, generator=torch.Generator().manual_seed(5))

    def grad(batch):
        model = TiedDict()
        (model(batch)["logits"] * w).sum((1, 2)).mean().backward()
        return model.embed.weight.grad

    halves = ids.tensor_split(2)
    torch.testing.assert_close((grad(halves[0]) + grad(halves[1])) / 2, grad(ids))
    report = layerlab.ddp_check(TiedDict(), ids, nproc=2, timeout=20)
    assert report.ok and report.findings == [], report.titles()
    assert [p.name for p in report.params] == ["embed.weight", "mix.weight", "mix.bias"]  # tied: listed once
    assert all(p.status == "ok" for p in report.params)
