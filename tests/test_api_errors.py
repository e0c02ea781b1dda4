"""The Python API's entry points on hostile arguments (issue 11, item 14).

``layerlab.inspect``, ``verify``, ``profile`` and ``export_check`` either report (a model that returns
odd tensors or raises odd exceptions is a finding) or raise :class:`~layerlab.errors.UsageError`
naming the bad argument — never an ``AttributeError``, an overflow inside torch or a raw
``RuntimeError`` of their own making. Models are real torch.nn modules; expected values come from
running torch itself.
"""

import pytest
import torch
from torch import nn

import layerlab
from layerlab.arguments import MAX_SEED
from layerlab.errors import CheckFailed, UsageError

ENTRY_POINTS = {
    "inspect": lambda m, x, **kw: layerlab.inspect(m, x, **kw),
    "verify": lambda m, x, **kw: layerlab.verify(m, x, only=["runs"], **kw),
    "profile": lambda m, x, **kw: layerlab.profile(m, x, repeats=1, warmup=0, **kw),
    "export_check": lambda m, x, **kw: layerlab.export_check(m, x, paths=["trace"], **kw),
}


# -- the module argument ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ENTRY_POINTS)
@pytest.mark.parametrize("not_a_module", [torch.relu, torch.randn(2, 3), "nn.Linear"], ids=["function", "tensor", "str"])
def test_non_module_is_a_usage_error(name, not_a_module):
    with pytest.raises(UsageError, match=r"needs a torch\.nn\.Module") as info:
        ENTRY_POINTS[name](not_a_module, torch.randn(2, 3))
    assert info.value.where == "module" and info.value.got == type(not_a_module).__name__


# -- seed ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ENTRY_POINTS)
@pytest.mark.parametrize("seed", [1.5, True, "7"], ids=["float", "bool", "str"])
def test_seed_of_the_wrong_type_is_a_usage_error(name, seed):
    with pytest.raises(UsageError, match=r"seed must be an integer") as info:
        ENTRY_POINTS[name](nn.Linear(3, 2), torch.randn(2, 3), seed=seed)
    assert info.value.where == "seed"


@pytest.mark.parametrize("name", ["inspect", "profile", "export_check"])
@pytest.mark.parametrize("seed", [2**70, 2**64, -1], ids=["2**70", "2**64", "-1"])
def test_seed_out_of_range_is_a_usage_error(name, seed):
    with pytest.raises(UsageError, match=r"seed must be between 0 and 2\*\*63 − 1") as info:
        ENTRY_POINTS[name](nn.Linear(3, 2), torch.randn(2, 3), seed=seed)
    assert info.value.where == "seed" and info.value.got == seed


def test_verify_refuses_a_seed_beyond_torchs_range_like_every_entry_point():
    with pytest.raises(UsageError, match="seed"):
        layerlab.verify(nn.Linear(3, 2), torch.randn(2, 3), seed=2**70, only=["runs", "gradcheck"])
    report = layerlab.verify(nn.Linear(3, 2), torch.randn(2, 3), seed=MAX_SEED, only=["runs", "gradcheck"])
    assert report.ok and report.settings["seed"] == MAX_SEED


def test_largest_seed_is_accepted_and_reproducible():
    """2**63 − 1 seeds the run's RNG: the dropout mask is the one torch draws from that seed."""
    model = nn.Dropout(0.5)
    x = torch.ones(4, 16)
    report = layerlab.inspect(model, x, seed=MAX_SEED, backward=False)
    torch.manual_seed(MAX_SEED)
    y = model(x)
    stats = report.outputs[0].stats
    assert report.ok and stats.zeros == float((y == 0).sum()) / y.numel()  # a fraction of the elements
    assert stats.mean == pytest.approx(float(y.mean()))


# -- meta tensors (item 9) ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_meta_model_is_refused(name):
    with pytest.raises(UsageError, match="meta tensors have shapes but no values"):
        ENTRY_POINTS[name](nn.Linear(3, 2, device="meta"), torch.randn(2, 3, device="meta"))


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_meta_input_to_parameterless_module_is_refused(name):
    with pytest.raises(UsageError, match="meta tensors"):
        ENTRY_POINTS[name](nn.ReLU(), torch.randn(2, 3, device="meta"))


def test_meta_input_to_a_real_model_is_still_diagnosed():
    """A cpu model fed a meta tensor is the model's device mismatch: inspect reports it, as before."""
    report = layerlab.inspect(nn.Linear(3, 3), torch.randn(2, 3, device="meta"))
    assert not report.ok and "parameters are on cpu but an input is on meta" in report.failure.diagnosis.message


# -- tolerances and threads (items 3 and 12) ----------------------------------------------------------

@pytest.mark.parametrize("kw", [{"rtol": float("nan")}, {"atol": float("inf")}, {"rtol": -1e-3}, {"atol": "1e-3"}])
def test_bad_tolerance_is_a_usage_error(kw):
    with pytest.raises(UsageError, match=r"(rtol|atol) must be") as info:
        layerlab.export_check(nn.Linear(3, 2), torch.randn(2, 3), paths=["trace"], **kw)
    assert info.value.where == next(iter(kw))


def test_too_many_threads_is_a_usage_error():
    with pytest.raises(UsageError, match="threads must be between 1 and") as info:
        layerlab.profile(nn.Linear(3, 2), torch.randn(2, 3), threads=100_000, repeats=1, warmup=0)
    assert info.value.got == 100_000


# -- odd outputs, exceptions and arguments: reported, not raised ---------------------------------------

class ToSparse(nn.Module):
    def forward(self, x):
        return x.relu().to_sparse()


def test_sparse_output_is_reported():
    x = torch.randn(2, 3)
    report = layerlab.inspect(ToSparse(), x)
    out = report.outputs[0]
    assert report.ok, report.failure
    assert out.shape == list(ToSparse()(x).shape) and out.stats is None  # no reductions on a sparse layout


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_nested_output_is_reported(layout):
    class Ragged(nn.Module):
        def forward(self, x):
            return torch.nested.nested_tensor([x[0], x[1, :2]], layout=layout)

    report = layerlab.inspect(Ragged(), torch.randn(2, 3))
    assert report.ok and report.outputs[0].nested


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("this exception cannot print itself")


class RaisesUnprintable(nn.Module):
    def forward(self, x):
        raise Unprintable()


def test_exception_whose_str_raises_is_a_finding():
    report = layerlab.inspect(RaisesUnprintable(), torch.randn(2, 3))
    assert not report.ok
    assert report.failure.exception == "Unprintable" and "could not be shown" in report.failure.message


class NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


class TakesFlag(nn.Module):
    def forward(self, x, flag=None):
        return x * 2


def test_kwarg_whose_repr_raises_is_described_by_its_type():
    report = layerlab.inspect(TakesFlag(), torch.randn(2, 3), flag=NoRepr())
    assert report.ok
    assert [i.value for i in report.inputs if i.name == "flag"] == ["NoRepr"]


# -- profile: non-leaf inputs and consistent failures --------------------------------------------------

def test_profile_non_leaf_input():
    """An input made by another computation (x * 2) used to die on the second step ("backward through
    the graph a second time"); the step profiled is the model's, and the user's graph is left alone."""
    leaf = torch.randn(4, 8, requires_grad=True)
    x = leaf * 2
    report = layerlab.profile(nn.Linear(8, 5), x, repeats=2, warmup=1)
    assert report.backward and report.row("").flops_forward == 2 * 4 * 8 * 5
    assert any("came out of another computation" in n for n in report.notes)
    assert leaf.grad is None and x.grad_fn is not None


class HalfBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("this backward is broken")


class BrokenBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return HalfBackward.apply(self.linear(x))


def test_profile_backward_failure_is_check_failed_like_a_forward_failure():
    with pytest.raises(CheckFailed, match="the model raised on its inputs: .*mat1 and mat2 shapes"):
        layerlab.profile(nn.Linear(4, 3), torch.randn(2, 3), repeats=1, warmup=0)
    with pytest.raises(CheckFailed, match="the model raised in the backward: RuntimeError: this backward is broken"):
        layerlab.profile(BrokenBackward(), torch.randn(2, 3), repeats=1, warmup=0)


def test_exception_whose_str_raises_in_every_entry_point():
    x = torch.randn(2, 3)
    assert not layerlab.verify(RaisesUnprintable(), x, only=["runs"]).ok
    exported = layerlab.export_check(RaisesUnprintable(), x, paths=["trace"])
    assert [p.status.value for p in exported.paths] == ["fail"]
    assert "Unprintable (its message could not be shown" in exported.paths[0].reason
    with pytest.raises(CheckFailed, match="the model raised on its inputs: Unprintable"):
        layerlab.profile(RaisesUnprintable(), x, repeats=1, warmup=0)


def test_profile_hf_model_on_embeddings_computed_outside():
    """The realistic non-leaf input: a Hugging Face GPT-2 (tiny config, random weights) profiled on
    ``inputs_embeds`` the user computed with its own embedding layer."""
    tf = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed (pip install transformers)")
    model = tf.GPT2Model(tf.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)).eval()
    embeds = model.get_input_embeddings()(torch.randint(0, 50, (2, 5)))
    assert not embeds.is_leaf and embeds.requires_grad
    report = layerlab.profile(model, inputs_embeds=embeds, repeats=2, warmup=1)
    assert report.backward and any("inputs_embeds" in n and "not leaves" in n for n in report.notes)
    paths = [r.path for r in report.rows]
    assert "h.0.attn" in paths and "wte" not in paths  # the embedding ran outside the profiled step
