"""layerlab.ddp_check on 2 CPU ranks (gloo): healthy models pass, each planted DDP pitfall is named.

Every run starts real ranks under torch.distributed; the first one in a session pays for the fork
server importing torch (seconds), the others start in well under a second. Each case runs once
(module-scoped fixtures) and its tests read the same report. Expected gradients come from plain torch
on the whole batch in the test itself, not from layerlab's single-process side.
"""

from __future__ import annotations

import time

import pytest
import torch

import layerlab
from layerlab.errors import SpecError, UsageError
from tests.distributed import planted as P

X = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


def torch_grads(model, x, loss):
    """The whole batch's gradient in one process, by plain torch."""
    model.zero_grad()
    loss(model(x), {}).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def healthy_mlp():
    return layerlab.ddp_check(P.mlp(), X, nproc=2, timeout=20, loss=P.weighted_mean_loss)


def test_healthy_mlp_passes_and_equals_torch_whole_batch_gradient(healthy_mlp):
    r = healthy_mlp
    assert r.ok and r.findings == [], r.findings
    assert [row.status for row in r.ranks] == ["ok", "ok", "ok"]
    assert [row.inputs[0].shape for row in r.ranks] == [[8, 16], [4, 16], [4, 16]]
    want = torch_grads(P.mlp(), X, P.weighted_mean_loss)
    for rank in r.raw:
        for name, norm in rank["ddp"]["grad_norms"].items():
            assert norm == pytest.approx(float(want[name].double().norm()), rel=1e-5)
    assert all(p.status == "ok" and p.ranks_diff == 0 for p in r.params)


def test_healthy_cnn_passes():
    x = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    r = layerlab.ddp_check(P.cnn(), x, nproc=2, timeout=20)
    assert r.ok and r.findings == [], r.findings
    assert r.batch_dims == {"input": 0}
    assert {p.name for p in r.params} == {n for n, _ in P.cnn().named_parameters()}


def test_unused_branch_is_named_with_its_module():
    r = layerlab.ddp_check(P.UnusedBranch(), X, nproc=2, timeout=20)
    f = r.finding("unused parameters")
    assert f.severity == "error" and f.where == ["aux", "aux.weight", "aux.bias"]
    assert "its forward never ran" in f.message and "find_unused_parameters=True" in f.fix
    assert r.param("aux.weight").unused_on == [0, 1] and not r.ok
    assert r.param("body.weight").status == "ok"


def test_unused_branch_with_find_unused_parameters_is_only_noted():
    r = layerlab.ddp_check(P.UnusedBranch(), X, nproc=2, timeout=20, find_unused_parameters=True)
    assert r.ok and r.finding("unused parameters").severity == "info"


def test_rank_dependent_control_flow_is_named():
    r = layerlab.ddp_check(P.RankBranch(), X, nproc=2, timeout=20)
    flow = r.finding("rank-dependent control flow")
    assert flow.severity == "error" and flow.where[0] == "extra"
    assert "ranks 1 but not on ranks 0" in flow.message and "ran on ranks 1 only" in flow.message
    grads = r.finding("rank-dependent computation")
    assert grads.where == ["rank 1"] and grads.cause == "control flow that depends on the rank"


def test_batchnorm_without_syncbatchnorm_is_named():
    r = layerlab.ddp_check(P.batchnorm_mlp(), X, nproc=2, timeout=20)
    grads = r.finding("BatchNorm without SyncBatchNorm")
    assert grads.where == ["1"] and "SyncBatchNorm" in grads.fix
    stats = r.finding("BatchNorm running stats differ between ranks")
    assert stats.where == ["1.running_mean", "1.running_var"]
    # what torch itself says: each shard's batch statistics differ, so the running means do
    model = P.batchnorm_mlp()
    with torch.no_grad():
        h = model[0](X)
    assert r.buffers[0].ranks_diff == pytest.approx(
        float((h[:4].mean(0) - h[4:].mean(0)).abs().max()) * model[1].momentum, rel=1e-4)
    assert r.ok  # per-rank BatchNorm is a choice DDP users make: warned, not failed


def test_summed_loss_is_named_with_the_world_size_factor():
    r = layerlab.ddp_check(P.mlp(), X, nproc=2, timeout=20, loss=P.summed_loss)
    f = r.finding("loss not a per-sample mean")
    assert f.severity == "error" and "0.5 ×" in f.message and "1/2: the world size" in f.message
    want = torch_grads(P.mlp(), X, P.summed_loss)
    got = r.raw[0]["ddp"]["grad_norms"]
    assert got["0.weight"] == pytest.approx(0.5 * float(want["0.weight"].norm()), rel=1e-5)


def test_loss_scaled_per_rank_is_named():
    r = layerlab.ddp_check(P.mlp(), X, nproc=2, timeout=20, loss=P.rank_scaled_loss)
    f = r.finding("loss scaled per rank")
    assert f.where == ["rank 1"] and "rank 1: ×2" in f.message


def test_buffer_updated_on_rank_zero_only_is_named():
    r = layerlab.ddp_check(P.BufferOnRankZero(), X, nproc=2, timeout=20)
    f = r.finding("buffer updated on some ranks only")
    assert f.where == ["seen"] and "ranks 0 change it" in f.message and "ranks 1 do not" in f.message
    row = r.buffers[0]
    assert row.changed_on == [0] and row.ranks_diff == 4.0  # rank 0 counted its 4 samples
    assert row.after_diff == 4.0  # still apart after the step: DDP re-broadcasts rank 0's at the next forward
    assert "broadcast_buffers=True" in f.message and "thrown away" in f.message


def test_a_raising_rank_is_blamed_and_the_other_stopped():
    r = layerlab.ddp_check(P.RaisesOnRankOne(), X, nproc=2, timeout=20)
    f = r.finding("rank 1 raised")
    assert "ValueError: planted failure on rank 1" in f.message
    assert any("planted.py" in w and "in forward" in w for w in f.where)
    assert r.ranks[2].status == "raised" and r.ranks[1].status != "ok" and not r.ok


def test_a_hanging_rank_is_reported_in_bounded_time():
    t0 = time.perf_counter()
    r = layerlab.ddp_check(P.HangsOnRankOne(), X, nproc=2, timeout=3)
    took = time.perf_counter() - t0
    f = r.finding("rank 1 hung")
    assert any("planted.py" in w and "in forward" in w for w in f.where), f.where  # where it sleeps
    assert r.ranks[2].status == "hung"
    assert took < 30, took  # 3 s collective timeout + a grace, not the 600 s sleep


def test_a_tiny_gpt2_in_train_mode_raises_no_false_alarm():
    transformers = pytest.importorskip("transformers", reason="the Hugging Face check needs transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64)
    torch.manual_seed(0)
    model = transformers.GPT2Model(cfg)
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(3))
    r = layerlab.ddp_check(model, ids, nproc=2, timeout=30)
    assert r.ok, [(f.title, f.message) for f in r.findings]
    assert set(r.titles()) <= {"random draws in the step"}  # GPT-2's dropout, said as such


def test_bad_inputs_are_usage_errors_before_any_rank_starts():
    with pytest.raises(UsageError, match="does not split into 3 equal shards"):
        layerlab.ddp_check(P.mlp(), X, nproc=3)
    with pytest.raises(UsageError, match="nproc must be"):
        layerlab.ddp_check(P.mlp(), X, nproc=0)

    class Local(torch.nn.Linear):
        pass

    with pytest.raises(UsageError, match="the ranks cannot receive the model .*Local"):
        layerlab.ddp_check(Local(16, 4), X, nproc=2)


def test_ddp_section_is_validated(tmp_path):
    spec = tmp_path / "m.yaml"
    spec.write_text("layer: Linear\nargs: {in_features: 16, out_features: 4}\ninput: {shape: [8, 16]}\n"
                    "ddp: {nproc: 2, find_unused: true}\n")
    with pytest.raises(SpecError, match="ddp: has no option 'find_unused'") as info:
        layerlab.ddp_check(str(spec))
    assert info.value.hint and "find_unused_parameters" in info.value.hint
