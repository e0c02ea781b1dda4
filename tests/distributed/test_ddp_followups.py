"""Follow-ups of the ddp-check audit: DDP's silent first step with an unused parameter, and one rank.

The truth is plain torch: two real gloo ranks of ``DistributedDataParallel`` with its default
``find_unused_parameters=False`` (:func:`plain_first_step`, forked once for every case), each rank's
gradients right after the first backward compared with the mean of the ranks' own gradients (what an
all-reduce leaves), and whether the next forward raises. layerlab's list of un-averaged parameters
must be exactly the list torch's run shows.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn

import layerlab
from tests.distributed import planted as P
from tests.distributed.forked import two_ranks

X = torch.randn(8, 16, generator=torch.Generator().manual_seed(7))
#: both ranks get the same four samples: their own gradients already equal the mean
SAME = torch.cat([X[:4], X[:4]])
_CASES = {"unused": X, "same_shards": SAME}


def _first_steps(rank: int) -> dict:
    result = {}
    for case, batch in _CASES.items():
        shard = batch.tensor_split(2)[rank]
        own = P.UnusedBranch()
        P.weighted_mean_loss(own(shard), {}).backward()
        model = P.UnusedBranch()
        ddp = nn.parallel.DistributedDataParallel(model)  # find_unused_parameters=False: the default
        P.weighted_mean_loss(ddp(shard), {}).backward()
        second = None
        try:
            ddp(shard)
        except RuntimeError as exc:
            second = str(exc)
        result[case] = {"own": {n: p.grad for n, p in own.named_parameters()},
                        "first": {n: p.grad for n, p in model.named_parameters()}, "second": second}
    return result


@pytest.fixture(scope="module")
def plain_first_step(tmp_path_factory):
    """``{case: [rank0, rank1]}``, each ``{"own", "first", "second"}`` (see :func:`_first_steps`)."""
    ranks = two_ranks(_first_steps, str(tmp_path_factory.mktemp("first_step")))
    return {case: [ranks[0][case], ranks[1][case]] for case in _CASES}


def _unaveraged(truth):
    """Parameters whose gradient after DDP's first backward is not the mean of the ranks' own, on some rank."""
    out = {}
    for name, g0 in truth[0]["first"].items():
        if g0 is None:
            continue
        mean = (truth[0]["own"][name] + truth[1]["own"][name]) / 2
        off = max(float((t["first"][name] - mean).abs().max()) for t in truth)
        if off > 1e-6:
            out[name] = off
    return out


def test_first_step_left_unaveraged_is_measured_not_inferred(plain_first_step):
    truth = plain_first_step["unused"]
    left = _unaveraged(truth)
    assert left == {"body.weight": pytest.approx(left["body.weight"])} and left["body.weight"] > 0.01
    assert torch.equal(truth[0]["first"]["body.weight"], truth[0]["own"]["body.weight"])  # each rank its own
    assert all("Expected to have finished reduction" in t["second"] for t in truth)
    report = layerlab.ddp_check(P.UnusedBranch(), X, nproc=2, timeout=20, loss=P.weighted_mean_loss)
    assert not report.ok
    f = report.finding("gradients not averaged on the first step")
    assert f.severity == "error" and f.where == list(left)  # body.bias: its own gradient is the mean already
    spread = float((truth[0]["first"]["body.weight"] - truth[1]["first"]["body.weight"]).abs().max())
    assert f"differ by up to {spread:.3g}" in f.message and f"up to {left['body.weight']:.3g}" in f.message
    assert "still hold each rank's own gradient" in f.message and "silently diverge" in f.message
    assert "next forward raised: RuntimeError: Expected to have finished reduction" in f.message
    assert "find_unused_parameters=True" in f.fix and "static_graph=True" in f.fix and "remove" in f.fix
    assert "aux.weight, aux.bias" in f.cause
    assert "un-averaged" in report.finding("unused parameters").fix
    # the table still comes from the run that finishes (find_unused_parameters=True), and says so
    assert report.param("body.weight").status == "ok" and report.options["find_unused_parameters_run"]
    assert any("first step with your setting" in n for n in report.notes)


def test_first_step_is_not_blamed_when_the_ranks_gradients_already_agree(plain_first_step):
    truth = plain_first_step["same_shards"]
    assert _unaveraged(truth) == {}
    assert all("Expected to have finished reduction" in t["second"] for t in truth)
    report = layerlab.ddp_check(P.UnusedBranch(), SAME, nproc=2, timeout=20, loss=P.weighted_mean_loss)
    assert "gradients not averaged on the first step" not in report.titles()
    assert "Expected to have finished reduction" in report.finding("first step measured").message
    assert report.finding("unused parameters").severity == "error"  # the next step still raises


def test_first_step_is_not_guessed_when_ranks_skip_different_parameters():
    report = layerlab.ddp_check(P.RankBranch(), X, nproc=2, timeout=20)
    note = next(n for n in report.notes if n.startswith("first step not measured"))
    assert "(rank 0: extra.bias, extra.weight; rank 1: none)" in note and "can't tell" in note
    assert not any(t.startswith("gradients not averaged") or t.startswith("first step") for t in report.titles())
    assert report.finding("rank-dependent control flow").severity == "error"


def test_one_rank_says_it_cannot_show_a_cross_rank_bug():
    """Truth: with world size 1 DDP's gradient is the process's own, exactly (nothing to average with)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, own = P.mlp(), P.mlp()
        P.weighted_mean_loss(nn.parallel.DistributedDataParallel(model)(X), {}).backward()
        P.weighted_mean_loss(own(X), {}).backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), own.parameters()))
    finally:
        dist.destroy_process_group()
    report = layerlab.ddp_check(P.mlp(), X, nproc=1, timeout=20)
    assert report.ok and report.titles() == ["one rank: no cross-rank check"]
    f = report.finding("one rank: no cross-rank check")
    assert f.severity == "info" and "--nproc 2" in f.fix
    two = layerlab.ddp_check(P.mlp(), X, nproc=2, timeout=20)
    assert two.ok and two.findings == []


def test_one_rank_on_the_cli_exits_0_with_the_note():
    from typer.testing import CliRunner

    from layerlab.cli.app import app

    result = CliRunner().invoke(app, ["ddp-check", "linear", "--nproc", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] and data["world_size"] == 1
    assert [(f["severity"], f["title"]) for f in data["findings"]] == [("info", "one rank: no cross-rank check")]
    human = CliRunner().invoke(app, ["ddp-check", "linear", "--nproc", "1"], env={"COLUMNS": "200"})
    assert human.exit_code == 0, human.output
    assert "one rank: no cross-rank check" in human.stdout and "--nproc 2 or more" in human.stdout
