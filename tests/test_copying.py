"""copy_model: a deep copy that works where copy.deepcopy refuses (the old weight_norm / spectral_norm
hooks), computes exactly what the original computes, and leaves the original as it was."""

import copy
import warnings

import pytest
import torch
from torch import nn

from layerlab.errors import UsageError
from layerlab.target.copying import copy_model, picklable_copy


def _old_weight_norm(module, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated API is the point
        return torch.nn.utils.weight_norm(module, **kw)


def test_torch_refuses_to_deepcopy_an_old_weight_norm_module():
    # the torch fact this helper exists for
    with pytest.raises(RuntimeError, match="deepcopy protocol"):
        copy.deepcopy(_old_weight_norm(nn.Conv1d(4, 8, 3)))


def test_the_copy_of_a_weight_norm_conv_computes_what_the_original_computes():
    torch.manual_seed(0)
    model = nn.Sequential(_old_weight_norm(nn.Conv1d(4, 8, 3)), nn.Tanh(),
                          _old_weight_norm(nn.Conv1d(8, 2, 3), dim=None))
    x = torch.randn(2, 4, 16)
    weight_before = model[0].weight
    twin = copy_model(model)
    assert torch.equal(twin(x), model(x))
    assert torch.equal(twin[0].weight, weight_before)  # the attribute it recomputed, before any forward
    assert model[0].weight is not twin[0].weight


def test_the_original_is_unchanged_and_the_copy_independent():
    torch.manual_seed(0)
    model = _old_weight_norm(nn.Conv1d(4, 8, 3))
    x = torch.randn(2, 4, 16)
    expected = model(x).detach()  # the forward-pre-hook recomputes weight: take it after
    weight = model.weight
    twin = copy_model(model)
    assert model.weight is weight  # the same tensor object put back
    with torch.no_grad():
        twin.weight_g.mul_(3.0)
    assert torch.equal(model(x), expected)
    assert not torch.allclose(twin(x), expected)


def test_gradients_reach_the_copys_own_g_and_v():
    torch.manual_seed(0)
    model = _old_weight_norm(nn.Conv1d(4, 8, 3))
    x = torch.randn(2, 4, 16)
    twin = copy_model(model)
    model(x).square().sum().backward()
    twin(x).square().sum().backward()
    assert torch.equal(twin.weight_g.grad, model.weight_g.grad)
    assert torch.equal(twin.weight_v.grad, model.weight_v.grad)


def test_spectral_norm_after_a_training_forward_copies_without_a_power_iteration():
    torch.manual_seed(0)
    model = torch.nn.utils.spectral_norm(nn.Linear(5, 6))
    x = torch.randn(3, 5)
    model(x)  # training mode, with grad: weight is now a non-leaf tensor
    with pytest.raises(RuntimeError, match="deepcopy protocol"):
        copy.deepcopy(model)
    twin = copy_model(model)
    assert torch.equal(twin.weight_u, model.weight_u)  # copying did not advance the u estimate
    assert torch.equal(twin.weight, model.weight)
    twin.eval(), model.eval()
    assert torch.equal(twin(x), model(x))


def test_a_plain_model_is_an_ordinary_deep_copy():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    twin = copy_model(model)
    assert twin is not model and twin[0].weight is not model[0].weight
    assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(), model.state_dict().values()))


class Derived(nn.Module):
    """Keeps ``2 * p`` as a plain attribute: no hook recomputes it."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(3))
        self.doubled = self.p * 2

    def forward(self, x):
        return x * self.doubled


def test_an_unknown_derived_tensor_is_a_usage_error_naming_it():
    model = nn.Sequential(nn.Linear(3, 3), Derived())
    with pytest.raises(UsageError, match=r"1\.doubled is a tensor computed with autograd") as info:
        copy_model(model)
    assert info.value.where == "1.doubled"
    assert "torch.nn.utils.parametrizations.weight_norm" in info.value.hint
    assert model[1].doubled.grad_fn is not None  # left as it was


def test_a_derived_tensor_inside_a_list_is_a_usage_error_too():
    class Cached(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.ones(3))
            self.cache = [self.p * 2]

    with pytest.raises(UsageError, match="deepcopy refuses") as info:
        copy_model(Cached())
    assert "parametrizations" in info.value.hint


def test_a_copy_for_another_process_pickles_and_computes_the_same():
    # ddp-check pickles the model to its ranks; pickle refuses a weight_norm module's derived weight
    # ("autograd does not support crossing process boundaries") — the torch fact, then the fix
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers torch's reducers, as the ranks' queues use

    torch.manual_seed(0)
    model = nn.Sequential(_old_weight_norm(nn.Conv1d(4, 8, 3)), nn.ReLU(), _old_weight_norm(nn.Conv1d(8, 2, 3)))
    x = torch.randn(2, 4, 16)
    expected = model(x)
    with pytest.raises(RuntimeError, match="crossing process boundaries"):
        ForkingPickler.dumps(copy_model(model))
    received = pickle.loads(ForkingPickler.dumps(picklable_copy(model)))
    assert torch.equal(received(x), expected)
    assert received[0].weight_g.requires_grad and received[0].weight.requires_grad  # recomputed by its hook
