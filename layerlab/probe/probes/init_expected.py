"""What a weight's std would be under torch's default init, Kaiming and Xavier: the init check's yardsticks.

For one weight ``W`` of a module:

    torch default   the std of the same weight after ``reset_parameters()`` (``_reset_parameters()``
                    for ``nn.MultiheadAttention``) on a deep copy of the module that owns it, under
                    a fixed seed and a forked RNG: measured, never a copied formula, so it follows
                    whatever torch (or the layer's author) does
    Kaiming         ``gain / √fan_in``  (He et al., the std of ``kaiming_normal_``/``_uniform_``)
    Xavier          ``gain · √(2 / (fan_in + fan_out))``  (Glorot, the std of ``xavier_*_``)

``fan_in``/``fan_out`` come from ``torch.nn.init._calculate_fan_in_and_fan_out`` (torch's own
convention, the one its initialisers use: a ``ConvTranspose``'s "fan_in" is its ``out_channels/groups
× kernel``) and ``gain`` from ``torch.nn.init.calculate_gain`` for the nonlinearity that follows the
layer. That nonlinearity is read from the report's call order (:func:`next_activation`): the first
innermost call after the layer that is an activation, looking past dropout, norms, pooling and
reshapes; another weighted layer (or nothing) means "linear" (gain 1). An activation applied as a
function (``F.relu`` in a forward) is not a module call and is not seen: the row then says
``linear``. GELU, SiLU, Mish, ELU and friends have no gain in ``calculate_gain``; they get ReLU's,
and the label says so. Recurrent weights take their layer's own nonlinearity (``tanh``/``relu``
for ``nn.RNN``; gain 1 for the sigmoid/tanh gates of LSTM and GRU).

Fans are only meaningful when the weight is laid out as torch's are (``(out, in, *kernel)``): for
modules outside ``torch.nn`` and ``layerlab.layers`` (Hugging Face's ``Conv1D`` stores ``(in, out)``)
no Kaiming/Xavier figure is given.
"""

from __future__ import annotations

import copy
import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

__all__ = ["is_weight", "known_layout", "fans", "next_activation", "reference_stds", "torch_default_stds"]

#: class name -> calculate_gain's name for it (and whether the gain is borrowed from ReLU)
_ACTIVATIONS: Dict[str, Tuple[str, bool]] = {
    "ReLU": ("relu", False), "ReLU6": ("relu", False), "LeakyReLU": ("leaky_relu", False),
    "PReLU": ("leaky_relu", False), "RReLU": ("leaky_relu", False), "Tanh": ("tanh", False),
    "Sigmoid": ("sigmoid", False), "SELU": ("selu", False), "Softmax": ("linear", False),
    "LogSoftmax": ("linear", False), "Hardtanh": ("tanh", True),
    "GELU": ("relu", True), "SiLU": ("relu", True), "Mish": ("relu", True), "ELU": ("relu", True),
    "CELU": ("relu", True), "Hardswish": ("relu", True), "Softplus": ("relu", True),
}
#: innermost calls the search looks past (they neither weigh nor squash)
_PASS = ("Dropout", "Identity", "Flatten", "Unflatten", "Norm", "Pool", "ZeroPad", "Upsample", "Shuffle")


def is_weight(name: str) -> bool:
    """``weight``, ``in_proj_weight``, ``weight_ih_l0`` …: a parameter that is a weight (not a bias)."""
    last = name.rpartition(".")[2]
    return last == "weight" or last.endswith("_weight") or last.startswith("weight_")


def known_layout(module: nn.Module) -> bool:
    """Whether the module's weights are laid out as torch's (``(out, in, *kernel)``)."""
    return type(module).__module__.startswith(("torch.nn.", "layerlab.layers"))


def fans(weight: torch.Tensor) -> Optional[Tuple[int, int]]:
    """``(fan_in, fan_out)`` by torch's rule; ``None`` below 2 dims (a bias or a norm's scale)."""
    if weight.dim() < 2:
        return None
    return nn.init._calculate_fan_in_and_fan_out(weight)


def reference_stds(weight: torch.Tensor, gain: float) -> Tuple[Optional[float], Optional[float]]:
    """``(kaiming, xavier)`` stds for this weight's fans (see the module docstring)."""
    f = fans(weight)
    if f is None or min(f) == 0:
        return None, None
    fan_in, fan_out = f
    return gain / math.sqrt(fan_in), gain * math.sqrt(2.0 / (fan_in + fan_out))


def recurrent_nonlinearity(module: nn.Module) -> Optional[str]:
    """The nonlinearity inside an RNN/LSTM/GRU (torch's or layerlab's), else ``None``."""
    name = type(module).__name__
    if name in ("RNN", "RNNCell"):
        return getattr(module, "nonlinearity", "tanh")
    if name in ("LSTM", "GRU", "LSTMCell", "GRUCell"):
        return "sigmoid"  # most of the gates are sigmoids: gain 1
    return None


def next_activation(calls: List, path: str, root: nn.Module) -> Tuple[str, str, Optional[float]]:
    """``(label, nonlinearity, param)`` for the module at ``path`` (see the module docstring)."""
    module = _submodule(root, path)
    inner = recurrent_nonlinearity(module) if module is not None else None
    if inner is not None:
        return inner, inner, None
    if isinstance(module, nn.MultiheadAttention):
        return "attention", "linear", None
    first = next((c for c in calls if c.path == path), None)
    if first is None:  # used without being called (MultiheadAttention's out_proj)
        return "linear", "linear", None
    parents = {c.parent for c in calls}
    for call in calls[first.index + 1:]:
        if call.index in parents:  # a container: its leaves come next
            continue
        entry = _ACTIVATIONS.get(call.class_name)
        if entry is not None:
            nonlinearity, borrowed = entry
            param = None
            if nonlinearity == "leaky_relu":
                act = _submodule(root, call.path)
                slope = getattr(act, "negative_slope", None)
                if slope is None and isinstance(act, nn.PReLU):
                    slope = float(act.weight.detach().mean())
                param = 0.01 if slope is None else float(slope)
            label = f"{call.class_name} (ReLU gain)" if borrowed else call.class_name
            return label, nonlinearity, param
        if any(part in call.class_name for part in _PASS):
            continue
        break  # the next weighted layer (or something else): nothing squashes in between
    return "linear", "linear", None


def gain_of(nonlinearity: str, param: Optional[float]) -> float:
    return float(nn.init.calculate_gain(nonlinearity, param))


def torch_default_stds(owner: nn.Module, seed: int) -> Dict[str, float]:
    """The std of each of ``owner``'s own parameters after its reset on a deep copy (``{}``: it has no reset).

    The global RNG is forked (the caller's state is left as it was) and seeded with ``seed`` right
    before the reset, so ``torch.manual_seed(seed); copy.deepcopy(owner).reset_parameters()``
    gives the same weights.
    """
    reset_name = next((n for n in ("reset_parameters", "_reset_parameters") if callable(getattr(owner, n, None))),
                      None)
    if reset_name is None:
        return {}
    devices = sorted({p.device.index or 0 for p in owner.parameters() if p.device.type == "cuda"})
    try:
        twin = copy.deepcopy(owner)
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.default_generator.manual_seed(seed)
            for index in devices:
                torch.cuda.default_generators[index].manual_seed(seed)
            getattr(twin, reset_name)()
    except Exception:  # a layer whose copy or reset fails has no measurable default: say nothing
        return {}
    return {name: float(p.detach().double().std(correction=0))
            for name, p in twin.named_parameters(recurse=False) if p.numel() > 1}


def _submodule(root: nn.Module, path: str) -> Optional[nn.Module]:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None
