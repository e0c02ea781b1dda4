"""The job file the launcher writes for its ranks: what goes in comes out, as a copy of its own."""

from __future__ import annotations

import os

import torch
from torch import nn

from layerlab.distributed.transport import read_job, write_job


def test_tensors_views_dtypes_and_modules_come_back_equal_and_independent(tmp_path):
    torch.manual_seed(0)
    base = torch.randn(6, 4)
    job = {"model": nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), "base": base, "view": base[2:4, 1:],
           "empty": torch.empty(0, 5), "flags": torch.tensor([True, False]), "ids": torch.arange(5),
           "half": torch.randn(3).bfloat16(), "frozen": nn.Parameter(torch.ones(2), requires_grad=False),
           "text": "kept", "nested": [(1, torch.zeros(2))]}
    write_job(job, str(tmp_path))
    got = read_job(str(tmp_path))
    for key in ("base", "view", "empty", "flags", "ids", "half"):
        assert got[key].dtype == job[key].dtype and torch.equal(got[key], job[key]), key
    assert got["view"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()  # still a view
    assert isinstance(got["frozen"], nn.Parameter) and not got["frozen"].requires_grad
    assert got["text"] == "kept" and torch.equal(got["nested"][0][1], torch.zeros(2))
    for (n, a), (_, b) in zip(job["model"].state_dict().items(), got["model"].state_dict().items()):
        assert torch.equal(a, b), n
    got["base"].add_(1)  # the rank's copy is its own
    assert torch.equal(job["base"], base) and not torch.equal(got["base"], base)


def test_a_thousand_tensors_are_two_files(tmp_path):
    job = [torch.full((3,), float(i)) for i in range(1000)]
    write_job(job, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["job.bin", "job.pkl"]
    assert os.path.getsize(tmp_path / "job.bin") == 1000 * 3 * 4
    assert all(torch.equal(t, torch.full((3,), float(i))) for i, t in enumerate(read_job(str(tmp_path))))
