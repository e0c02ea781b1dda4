"""New-user review: export-check on a model that draws random numbers with torch in forward (a VAE
sampling at inference), and the deprecated ``torch.nn.utils.weight_norm`` hooks through
export-check, train-check and precision-check.

The VAE's verdicts are checked against plain torch: with the RNG seeded alike before each call, a
traced, scripted, compiled (aot_eager) and exported VAE equals eager exactly, so each of those
paths must pass. Randomness that is not torch's (``random.random()``, a global counter) must still
get the "eager is not repeatable" verdict, and a real trace bug (a baked-in branch) must still warn.
"""

import random
import warnings

import pytest
import torch
from torch import nn

import layerlab
from layerlab.checks.report import Status
from layerlab.deploy.run import export_check

pytestmark = pytest.mark.usefixtures("one_thread")

TORCH_PATHS = ["trace", "script", "compile", "export", "export_dynamic"]


class VAE(nn.Module):
    """Samples z = mu + sigma * eps in eval mode too (reparameterisation at inference)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 8)
        self.dec = nn.Linear(4, 8)

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(z)


def _seeded(fn, *args):
    torch.manual_seed(1)
    with torch.no_grad():
        return fn(*args)


def _plain_torch_equal(model, x):
    """The paths whose program, run from the RNG state eager ran from, equals eager: plain torch."""
    model = model.eval()
    eager = _seeded(model, x)
    programs = {
        "trace": torch.jit.trace(model, (x,), check_trace=False),
        "script": torch.jit.script(model),
        "compile": torch.compile(model, fullgraph=True, backend="aot_eager"),
        "export": torch.export.export(model, (x,)).module(),
    }
    equal = {name: torch.equal(_seeded(p, x), eager) for name, p in programs.items()}
    torch._dynamo.reset()
    return equal


def test_the_vae_passes_every_path_plain_torch_says_equals_eager():
    torch.manual_seed(0)
    model, x = VAE(), torch.randn(4, 8)
    assert not torch.allclose(_seeded(model.eval(), x), model(x))  # it really is random between seeds
    equal = _plain_torch_equal(model, x)
    assert equal == {"trace": True, "script": True, "compile": True, "export": True}
    report = export_check(model, x, paths=TORCH_PATHS)
    cells = {p.path: p for p in report.paths}
    for path in TORCH_PATHS:
        assert cells[path].status is Status.PASS, (path, cells[path].reason)
        assert cells[path].matches_eager is True
    # the other inputs were compared from the same RNG state too: the batch variant ran and equalled eager
    assert "batch 5 (was 4)" in cells["trace"].reason
    assert "equals eager at 4 and 5" in cells["export_dynamic"].reason
    assert "eager_not_repeatable" not in report.settings


def test_export_check_leaves_the_callers_rng_stream_alone():
    torch.manual_seed(0)
    model, x = VAE(), torch.randn(4, 8)
    torch.manual_seed(123)
    expected_next = torch.rand(5)
    torch.manual_seed(123)
    export_check(model, x, paths=["trace", "export"])
    assert torch.equal(torch.rand(5), expected_next)


class PythonRandom(nn.Module):
    def forward(self, x):
        return x * random.random()


CALLS = 0


class GlobalCounter(nn.Module):
    def forward(self, x):
        global CALLS
        CALLS += 1
        return x + CALLS


class TorchAndPythonRandom(VAE):
    def forward(self, x):
        return super().forward(x) * (1.0 + random.random())


@pytest.mark.parametrize("model", [PythonRandom(), GlobalCounter(), TorchAndPythonRandom()],
                         ids=["random.random", "global counter", "torch and python randomness"])
def test_randomness_that_is_not_torchs_is_still_unrepeatable(model):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with torch.no_grad():  # the fact: two eager calls from one torch seed differ
        assert not torch.equal(_seeded(model, x), _seeded(model, x))
    report = export_check(model, x, paths=["trace", "export", "compile"])
    cells = {p.path: p for p in report.paths}
    assert "eager_not_repeatable" in report.settings
    for path in ("trace", "export"):
        assert cells[path].status is Status.FAIL, cells[path].reason
        assert cells[path].reason.startswith("eager is not repeatable"), cells[path].reason
    assert cells["compile"].status is Status.WARN


class NoisyBranch(nn.Module):
    """A Python branch on the data (the trace freezes it) plus torch noise."""

    def forward(self, x):
        noise = 0.01 * torch.randn_like(x)
        if x.sum() > 0:
            return x * 2 + noise
        return x - 1 + noise


def test_a_baked_in_branch_still_warns_when_forward_also_draws_noise():
    torch.manual_seed(0)
    model, x = NoisyBranch(), torch.rand(4, 8) + 0.1
    traced = torch.jit.trace(model, (x,), check_trace=False)
    assert not torch.allclose(_seeded(traced, -x), _seeded(model, -x))  # the fact: the trace froze the branch
    assert torch.equal(_seeded(torch.jit.script(model), -x), _seeded(model, -x))  # script keeps it
    report = export_check(model, x, paths=["trace", "script", "export"])
    cells = {p.path: p for p in report.paths}
    assert cells["trace"].status is Status.WARN
    assert "inputs negated" in cells["trace"].reason and "differs" in cells["trace"].reason
    assert cells["script"].status is Status.PASS, cells["script"].reason
    assert cells["export"].status is Status.FAIL  # data-dependent control flow


# -- the deprecated weight_norm hooks ----------------------------------------------------------------

def _audio_block(old_api: bool):
    torch.manual_seed(0)
    conv = nn.Conv1d(4, 8, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        conv = torch.nn.utils.weight_norm(conv) if old_api else torch.nn.utils.parametrizations.weight_norm(conv)
    return nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14, 3))


@pytest.fixture(scope="module")
def batch():
    return torch.randn(6, 4, 16, generator=torch.Generator().manual_seed(0))


def test_weight_norm_models_compute_the_same(batch):
    assert torch.equal(_audio_block(True)(batch), _audio_block(False)(batch))


def test_export_check_gives_old_weight_norm_the_verdicts_of_the_parametrization(batch):
    old = export_check(_audio_block(True), batch, paths=TORCH_PATHS)
    new = export_check(_audio_block(False), batch, paths=TORCH_PATHS)
    assert [(p.path, p.status) for p in old.paths] == [(p.path, p.status) for p in new.paths]
    assert not any("eager forward raised" in p.reason for p in old.paths)
    assert {p.path for p in old.paths if p.status is Status.PASS} == {"trace", "compile", "export", "export_dynamic"}


def test_train_check_gives_old_weight_norm_the_verdicts_of_the_parametrization(batch):
    model = _audio_block(True)
    before = [p.detach().clone() for p in model.parameters()]
    old, new = layerlab.train_check(model, batch), layerlab.train_check(_audio_block(False), batch)
    assert old.fit.verdict == new.fit.verdict == "overfits"
    assert old.losses == pytest.approx(new.losses, rel=1e-5)
    assert [f.code for f in old.flags] == [f.code for f in new.flags]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the user's model untouched


def test_precision_check_gives_old_weight_norm_the_verdicts_of_the_parametrization(batch):
    old, new = layerlab.precision_check(_audio_block(True), batch), layerlab.precision_check(_audio_block(False), batch)
    assert old.runs and [r.label for r in old.runs] == [r.label for r in new.runs]
    assert [(r.label, r.ok, r.raised, [f.code for f in r.findings]) for r in old.runs] == \
        [(r.label, r.ok, r.raised, [f.code for f in r.findings]) for r in new.runs]


class DerivedAttribute(nn.Module):
    """Keeps ``2 * w`` as a plain attribute that nothing recomputes: no copy can be made."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))
        self.doubled = self.w * 2

    def forward(self, x):
        return x * self.doubled


def test_a_model_no_copy_can_be_made_of_is_a_usage_error_not_eight_failed_cells():
    from layerlab.errors import UsageError

    model = nn.Sequential(nn.Linear(8, 8), DerivedAttribute())
    model(torch.randn(2, 8))  # eager itself runs
    with pytest.raises(UsageError, match=r"1\.doubled is a tensor computed with autograd") as info:
        export_check(model, torch.randn(2, 8), paths=["trace"])
    assert "parametrizations.weight_norm" in info.value.hint
