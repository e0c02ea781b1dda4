"""The six kinds of model the leave-no-trace snapshot tests run every command on, and an observer of
everything a run must leave as it was, written independently of :mod:`layerlab.target.no_trace`
(a test that compared with the mechanism's own snapshot could not fail)."""

from __future__ import annotations

import os
import random
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import torch
from torch import nn


class BnDropoutCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


class LstmNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, 6, batch_first=True)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class HookedMlp(nn.Module):
    """Module hooks of every kind, tensor hooks on a weight: all the user's, all to be kept."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 2)
        self.a.register_forward_hook(lambda m, i, o: None)
        self.a.register_forward_pre_hook(lambda m, i: None)
        self.b.register_full_backward_hook(lambda m, gi, go: None)
        self.a.weight.register_hook(lambda g: g)
        self.b.weight.register_post_accumulate_grad_hook(lambda p: None)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Parametrized(nn.Module):
    """spectral norm (parametrization API: its _u/_v buffers move in every train forward), weight
    norm, and the old hook API's spectral norm."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.utils.parametrizations.spectral_norm(nn.Linear(6, 8))
        self.b = nn.utils.parametrizations.weight_norm(nn.Linear(8, 8))
        self.c = nn.utils.spectral_norm(nn.Linear(8, 2))

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


class MutatesInput(nn.Module):
    """Writes into its input in place: every repeat of a command would see a different input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 2)

    def forward(self, x):
        x.mul_(3.0)
        return self.lin(x)


class RaisesHalfway(nn.Module):
    """Updates BatchNorm's statistics, then raises."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        h = self.bn(self.conv(x))
        raise ValueError(f"half-way: {tuple(h.shape)}")


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7))


#: name -> (make the model, make its input)
MODELS: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "bn_dropout_cnn": (BnDropoutCnn, lambda: _x(4, 3, 8, 8)),
    "lstm": (LstmNet, lambda: _x(3, 4, 5)),
    "user_hooks": (HookedMlp, lambda: _x(4, 6)),
    "parametrized": (Parametrized, lambda: _x(4, 6)),
    "mutates_input": (MutatesInput, lambda: _x(4, 6)),
    "raises_halfway": (RaisesHalfway, lambda: _x(2, 3, 8, 8)),
}


def prepared(name: str) -> Tuple[nn.Module, torch.Tensor]:
    """The model in train mode, every parameter with a ``.grad`` of the user's (a backward they ran)."""
    torch.manual_seed(0)
    make, make_input = MODELS[name]
    model = make().train()
    x = make_input()
    if name != "raises_halfway":
        model(x.clone()).sum().backward()
    else:
        for p in model.parameters():
            p.grad = torch.full_like(p, 0.5)
    return model, x


def _hooks(d: Any) -> Any:
    return None if d is None else list(d.keys())


def observe(model: nn.Module, inputs: List[torch.Tensor]) -> Dict[str, Any]:
    """Everything the guarantee covers, as plain values and object ids."""
    s: Dict[str, Any] = {}
    for n, p in model.named_parameters():
        s[f"param {n}"] = (id(p), p.detach().clone(), p.requires_grad)
        s[f"grad {n}"] = (id(p.grad), None if p.grad is None else p.grad.clone())
        s[f"tensor hooks {n}"] = (_hooks(p._backward_hooks), _hooks(p._post_accumulate_grad_hooks))
    for n, b in model.named_buffers():
        s[f"buffer {n}"] = (id(b), b.clone())
    for n, m in model.named_modules():
        s[f"module {n or '(root)'}"] = (type(m), m.training, *[
            list(getattr(m, d).keys()) for d in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                  "_backward_pre_hooks", "_forward_hooks_with_kwargs")])
        if hasattr(m, "parametrizations"):
            s[f"parametrizations {n}"] = {k: [type(p) for p in v] for k, v in m.parametrizations.items()}
    for i, x in enumerate(inputs):
        s[f"input {i}"] = (x.clone(), x.requires_grad, id(x.grad), _hooks(x._backward_hooks))
    s["rng torch"] = torch.get_rng_state()
    s["rng numpy"] = np.random.get_state()[1].copy()
    s["rng python"] = random.getstate()
    s["grad mode"] = torch.is_grad_enabled()
    s["default dtype"] = torch.get_default_dtype()
    s["threads"] = torch.get_num_threads()
    s["deterministic"] = torch.are_deterministic_algorithms_enabled()
    s["anomaly"] = torch.is_anomaly_enabled()
    s["autocast cpu"] = torch.is_autocast_enabled("cpu")
    s["environ"] = dict(os.environ)
    return s


def differences(before: Dict[str, Any], after: Dict[str, Any]) -> List[str]:
    """What changed, one line each (empty: nothing)."""
    out = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if not _equal(a, b):
            out.append(key)
    return out


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b
