"""``layerlab.target.seeding``: one run seeded like ``torch.manual_seed``, the caller's RNG put back,
and no lazy CUDA seeding queued (what inspect, its fix verification and the precision runs use)."""

import pytest

torch = pytest.importorskip("torch")

from layerlab.target.seeding import cuda_devices, seed_generators, seeded  # noqa: E402
import layerlab  # noqa: E402


def _draws():
    """Random numbers from the global generator, as a model draws them: rand, randn and a dropout mask."""
    return torch.cat([torch.rand(5), torch.randn(5), torch.nn.functional.dropout(torch.ones(64), 0.5)])


def test_seeded_draws_what_torch_manual_seed_draws():
    torch.manual_seed(11)
    expected = _draws()
    torch.manual_seed(0)  # another state: seeded must not depend on it
    with seeded(11, torch.nn.Linear(2, 2), [torch.ones(2)]):
        got = _draws()
    assert torch.equal(got, expected)


def test_seeded_puts_the_callers_stream_back():
    torch.manual_seed(3)
    first, then = _draws(), _draws()
    torch.manual_seed(3)
    assert torch.equal(_draws(), first)
    with seeded(99):
        inside = _draws()
    assert torch.equal(_draws(), then)  # the caller's stream goes on as if nothing ran
    assert not torch.equal(inside, then)


def test_seed_none_runs_on_the_rng_as_it_is():
    torch.manual_seed(4)
    expected = _draws()
    torch.manual_seed(4)
    with seeded(None):
        got = _draws()
    assert torch.equal(got, expected)


def test_seed_generators_inside_fork_rng_is_the_same_stream():
    torch.manual_seed(8)
    expected = _draws()
    with torch.random.fork_rng(devices=[]):
        seed_generators(8, [])
        got = _draws()
    assert torch.equal(got, expected)


def test_no_lazy_cuda_seeding_is_queued(monkeypatch):
    """torch.manual_seed queues a CUDA seeding (with a formatted stack trace) while CUDA is not
    started; the run's seeding must not, on every seeded forward."""
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is started here: torch seeds it at once, nothing is queued")
    import torch.cuda.random as cuda_random

    def queued(*args, **kwargs):
        raise AssertionError("a lazy CUDA call was queued")

    monkeypatch.setattr(cuda_random, "_lazy_call", queued)
    with pytest.raises(AssertionError, match="lazy CUDA call"):  # the patch sees torch.manual_seed's
        torch.manual_seed(1)
    with seeded(1, torch.nn.Linear(2, 2), [torch.ones(2)]):
        torch.rand(3)
    with torch.random.fork_rng(devices=[]):
        seed_generators(1, [])


def test_cuda_devices_of_a_cpu_model_is_none():
    assert cuda_devices(torch.nn.Linear(2, 2), [torch.ones(2), "not a tensor"]) == []
    assert cuda_devices(None) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_on_cuda_matches_manual_seed_and_restores():
    model = torch.nn.Linear(2, 2).cuda()
    assert cuda_devices(model, []) == [torch.cuda.current_device()]
    torch.manual_seed(5)
    expected = torch.rand(8, device="cuda")
    before = torch.cuda.get_rng_state()
    with seeded(5, model, []):
        got = torch.rand(8, device="cuda")
    assert torch.equal(got, expected) and torch.equal(torch.cuda.get_rng_state(), before)


@pytest.mark.parametrize("command", ["verify", "profile", "inspect", "train_check", "precision_check"])
def test_a_command_leaves_the_users_random_stream_where_it_was(command):
    """The checks run the user's dropout; the user's next torch.rand must not depend on having run one."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    x = torch.randn(2, 4)
    torch.manual_seed(0)
    before = torch.get_rng_state().clone()
    getattr(layerlab, command)(model, x)
    assert torch.equal(torch.get_rng_state(), before)
