"""``layerlab ddp-check`` end to end: exit codes, JSON, --ranks-json, a failing spec, bad options."""

from __future__ import annotations

import json


def test_ddp_check_help(run):
    code, out, err = run("ddp-check", "--help")
    assert code == 0, err
    assert "--nproc" in out and "torchrun" in out


def test_healthy_spec_passes_with_json(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "ddp-check-report" and data["ok"] is True and data["world_size"] == 2
    assert data["backend"] == "gloo" and data["batch"] == 8 and data["findings"] == []
    assert [r["inputs"][0]["shape"] for r in data["ranks"]] == [[8, 16], [4, 16], [4, 16]]


def test_ranks_json_has_each_ranks_raw_results(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--ranks-json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "ddp-check-ranks" and [r["rank"] for r in data["ranks"]] == [0, 1]
    norms = [r["ddp"]["grad_norms"]["0.weight"] for r in data["ranks"]]
    assert norms[0] == norms[1] > 0  # one gradient after the all-reduce


def test_batchnorm_spec_is_warned_and_rendered(run):
    code, out, err = run("ddp-check", "configs/cnn_block.yaml")
    assert code == 0, out + err  # per-rank BatchNorm: warnings, not a failure
    assert "BatchNorm without SyncBatchNorm" in out and "running stats differ" in out
    assert "rank 1" in out and "ok: 0 error(s), 2 warning(s)" in out


def test_uneven_batch_is_a_usage_error(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--nproc", "3", "--json")
    assert code == 2, out + err
    assert json.loads(err.strip().splitlines()[-1])["message"] == "a batch of 8 does not split into 3 equal shards"


def test_bad_timeout_is_a_usage_error(run):
    code, out, err = run("ddp-check", "configs/ddp_mlp.yaml", "--timeout", "0")
    assert code == 2 and "timeout" in err
