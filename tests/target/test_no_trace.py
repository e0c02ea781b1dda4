"""Leave no trace: every command's Python API hands the model, its inputs and the process back as they
were, on success and on failure (layerlab.target.no_trace, applied by layerlab.target.entry).

The state is observed by tests.target.state_models.observe, written independently of the mechanism."""

import pytest
import torch

import layerlab
from layerlab.errors import CheckFailed, LayerlabError
from tests.target.state_models import MODELS, BnDropoutCnn, differences, observe, prepared

QUICK = {
    "inspect": lambda m, x: layerlab.inspect(m, x),
    "profile": lambda m, x: layerlab.profile(m, x, repeats=2, warmup=1),
    "train_check": lambda m, x: layerlab.train_check(m, x, steps=3),
    "precision_check": lambda m, x: layerlab.precision_check(m, x),
}
SLOW = {
    "gradcheck": lambda m, x: layerlab.gradcheck(m, x),
    "export_check": lambda m, x: layerlab.export_check(m, x),
    "ddp_check": lambda m, x: layerlab.ddp_check(m, x, nproc=1),
}


def _run_and_compare(command, name):
    model, x = prepared(name)
    before = observe(model, [x])
    try:
        command(model, x)
        outcome = "returned"
    except LayerlabError as exc:  # a failing model's error (CheckFailed), or ddp-check refusing a model
        outcome = type(exc).__name__
    assert differences(before, observe(model, [x])) == [], outcome
    return outcome


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("command", list(QUICK))
def test_every_command_leaves_no_trace(command, name, one_thread):
    outcome = _run_and_compare(QUICK[command], name)
    if name == "raises_halfway" and command != "inspect":
        assert outcome == "CheckFailed"  # the failure path was exercised, not skipped


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("command", list(SLOW))
def test_every_slow_command_leaves_no_trace(command, name, one_thread):
    _run_and_compare(SLOW[command], name)


def test_the_observer_sees_what_a_plain_train_forward_changes():
    """The observer is not blind: a plain torch train-mode forward + backward moves BatchNorm's
    statistics, the RNG (dropout) and the gradients."""
    model, x = prepared("bn_dropout_cnn")
    before = observe(model, [x])
    model(x).sum().backward()
    changed = differences(before, observe(model, [x]))
    assert {"buffer bn.running_mean", "buffer bn.num_batches_tracked", "rng torch", "grad head.weight"} <= set(changed)


def test_diff_is_pure():
    model, x = prepared("lstm")
    a = layerlab.inspect(model, x).to_dict()
    before = observe(model, [x])
    layerlab.diff(a, a)
    assert differences(before, observe(model, [x])) == []


def test_global_flags_a_run_flips_come_back():
    """A forward that flips torch's global switches and os.environ: all restored by the snapshot."""
    import os

    class Flips(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            torch.set_default_dtype(torch.float64)
            torch.set_num_threads(1)
            torch.autograd.set_detect_anomaly(True)
            os.environ["LAYERLAB_TEST_FLIPPED"] = "1"
            torch.set_default_dtype(torch.float32)  # the model itself needs float32 weights to run
            return self.lin(x)

    model, x = Flips(), torch.randn(2, 3)
    torch.set_num_threads(2)
    try:
        before = observe(model, [x])
        layerlab.inspect(model, x)
        assert differences(before, observe(model, [x])) == []
        assert "LAYERLAB_TEST_FLIPPED" not in os.environ and not torch.is_anomaly_enabled()
    finally:
        torch.set_num_threads(1)


def test_a_timeout_leaves_no_trace_either():
    class StatsThenLoops(BnDropoutCnn):
        def forward(self, x):
            self.bn(self.conv(x))  # moves the running statistics, then never returns
            while True:
                x = x + 0

    torch.manual_seed(0)
    model, x = StatsThenLoops().train(), torch.randn(4, 3, 8, 8)
    before = observe(model, [x])
    with pytest.raises(CheckFailed, match="stopped after 1 s in profile"):
        layerlab.profile(model, x, timeout=1)
    assert differences(before, observe(model, [x])) == []


def test_an_input_computed_by_the_users_graph_keeps_its_graph():
    """Nothing is written back where nothing changed: a write would bump the input's version and break
    the user's own backward through it."""
    y = torch.randn(3, 4, requires_grad=True)
    x = y * 2
    layerlab.profile(torch.nn.Linear(4, 2), x, repeats=2, warmup=0)
    layerlab.inspect(torch.nn.Linear(4, 2), x)
    x.sum().backward()
    assert torch.equal(y.grad, torch.full_like(y, 2.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("command", ["inspect", "profile", "train_check"])
def test_on_cuda_the_device_rng_and_model_come_back(command):
    model, x = prepared("bn_dropout_cnn")
    model, x = model.cuda(), x.cuda()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    before = observe(model, [x])
    cuda_rng = torch.cuda.get_rng_state()
    QUICK[command](model, x)
    assert differences(before, observe(model, [x])) == []
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)
