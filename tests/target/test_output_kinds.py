"""What a forward may return besides tensors: a dataclass is read field by field (not "no output
requires grad"), a generator is refused with a clear reason (layerlab.target.bind), and a model nested
deeper than Python's recursion limit is a clear error (layerlab.faults)."""

import dataclasses
import sys

import pytest
import torch
from torch import nn

import layerlab
from layerlab.errors import CheckFailed, UsageError
from layerlab.target.bind import flatten, map_tensors


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: torch.Tensor
    note: str = "kept"


class ReturnsDataclass(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        h = self.lin(x)
        return Out(logits=h * 2, hidden=h)


class ReturnsGenerator(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return (self.lin(row) for row in x)


def test_flatten_and_map_walk_dataclass_fields():
    t = torch.ones(2)
    out = Out(logits=t, hidden=t * 2)
    assert [p for p, _ in flatten(out)] == ["output.logits", "output.hidden"]
    doubled = map_tensors(out, lambda v: v * 2)
    assert isinstance(doubled, Out) and torch.equal(doubled.hidden, t * 4) and doubled.note == "kept"
    assert torch.equal(out.hidden, t * 2)  # the original is not changed


def test_inspect_differentiates_a_dataclass_output():
    torch.manual_seed(0)
    model, x = ReturnsDataclass(), torch.randn(2, 4)
    report = layerlab.inspect(model, x)
    assert report.backward.ran and report.backward.skipped is None
    grads = {p.name: p.grad_norm for p in report.params}
    assert grads["lin.weight"] > 0 and grads["lin.bias"] > 0


def test_profile_and_train_check_read_a_dataclass_output():
    torch.manual_seed(0)
    model, x = ReturnsDataclass(), torch.randn(8, 4)
    assert layerlab.profile(model, x, repeats=2, warmup=0).backward is True
    report = layerlab.train_check(model, x, steps=10)
    assert report.losses[-1] < report.losses[0]


@pytest.mark.parametrize("command", ["inspect", "profile", "train_check", "export_check"])
def test_a_generator_output_is_refused_with_the_reason(command):
    with pytest.raises(UsageError, match="the model's output is a generator: its values are made only while it is "
                                         "iterated, once") as info:
        getattr(layerlab, command)(ReturnsGenerator(), torch.randn(2, 4))
    assert info.value.got == "generator" and "tuple" in info.value.hint


class Nested(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.inner = Nested(depth - 1) if depth > 1 else None

    def forward(self, x):
        x = self.lin(x)
        return self.inner(x) if self.inner is not None else x


def test_a_model_nested_2000_deep_is_a_clear_error():
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        model = Nested(2000)  # building it needs the higher limit too
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(CheckFailed, match="the model nests submodules 2000 deep") as info:
        layerlab.inspect(model, torch.randn(1, 2))
    assert info.value.got == "2000 levels" and f"sys.setrecursionlimit(20000)" in info.value.hint


def test_a_shallow_recursion_error_is_the_models_own_failure():
    class Recurses(nn.Module):
        def forward(self, x):
            return self(x)

    report = layerlab.inspect(Recurses(), torch.randn(1, 2))
    assert not report.ok and report.failure.exception == "RecursionError"
