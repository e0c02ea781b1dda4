"""Gate saturation inside layerlab's own recurrent layers, per time step, read off torch's function calls.

A sigmoid gate whose value is below :data:`SIGMOID_LOW` or above :data:`SIGMOID_HIGH`, or a tanh
whose ``|value|`` is above :data:`TANH_HIGH`, passes almost no gradient (σ' ≤ 0.0099, tanh' ≤ 0.0199):
a saturated unit barely learns. layerlab's cells and sequence layers compute their gates with
``torch.sigmoid`` and ``torch.tanh`` (see :mod:`layerlab.layers.cells`, :mod:`layerlab.layers.recurrent`),
so a ``TorchFunctionMode`` sees every gate value as it is made, without changing it: the mode
calls the function and only counts, under ``torch.no_grad``, on the result.

Which step a value belongs to:

* a cell (``LSTMCell``, ``GRUCell``, ``RNNCell``) does one step per call: its ops belong to that call;
* a sequence layer (``LSTM``, ``GRU``, ``RNN``) runs, for each layer and direction in turn, T steps
  with the same number ``k`` of gate ops each (LSTM: σ(f), σ(i), tanh(g), σ(o), tanh(c); GRU: σ(r, z),
  tanh(n); RNN: tanh), the reverse direction from t = T−1 down to 0. ``k`` is the number of ops seen
  divided by L·D·T; when that is not a whole number the ops are not attributed (``None``), rather than
  guessed. An ``RNN`` with ``nonlinearity='relu'`` has no saturating gate (``None``).

torch.nn's RNN/LSTM/GRU run one fused kernel: their gates are never visible, so they get no saturation.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from layerlab.probe.probes.base import quiet

__all__ = ["GateWatch", "SIGMOID_LOW", "SIGMOID_HIGH", "TANH_HIGH", "per_step"]

SIGMOID_LOW, SIGMOID_HIGH, TANH_HIGH = 0.01, 0.99, 0.99

_SIGMOIDS = {torch.sigmoid, torch.Tensor.sigmoid, torch.special.expit, torch.nn.functional.sigmoid}
_TANHS = {torch.tanh, torch.Tensor.tanh, torch.nn.functional.tanh}

#: one counted op: (kind "sigmoid" | "tanh", saturated elements, elements)
Op = Tuple[str, int, int]


class GateWatch(TorchFunctionMode):
    """Counts saturated sigmoid/tanh outputs made while a watched module's forward runs.

    :meth:`enter` and :meth:`leave` are called from that module's forward pre-hook and hook; the
    ops seen in between go to the innermost watched call still running.
    """

    def __init__(self) -> None:
        super().__init__()
        self._open: List[List[Op]] = []

    def enter(self) -> None:
        self._open.append([])

    def leave(self) -> List[Op]:
        return self._open.pop() if self._open else []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if self._open and (func in _SIGMOIDS or func in _TANHS) and isinstance(result, torch.Tensor) \
                and result.is_floating_point():
            with quiet():  # layerlab's counting: no graph, invisible to the op trace and other modes
                if func in _SIGMOIDS:
                    saturated = int(((result < SIGMOID_LOW) | (result > SIGMOID_HIGH)).sum())
                    kind = "sigmoid"
                else:
                    saturated = int((result.abs() > TANH_HIGH).sum())
                    kind = "tanh"
            self._open[-1].append((kind, saturated, result.numel()))
        return result


def fractions(ops: List[Op]) -> Dict[str, Optional[float]]:
    """``{"sigmoid": fraction saturated, "tanh": …}`` over ``ops`` (``None`` where none of that kind)."""
    out: Dict[str, Optional[float]] = {}
    for kind in ("sigmoid", "tanh"):
        sat = sum(s for k, s, _ in ops if k == kind)
        total = sum(n for k, _, n in ops if k == kind)
        out[kind] = sat / total if total else None
    return out


def per_step(ops: List[Op], steps: int, layers: int, directions: int) -> Optional[List[List[Op]]]:
    """The ops of one sequence-layer call, grouped by time step (see the module docstring); ``None``
    when they cannot be attributed."""
    runs = steps * layers * directions
    if not ops or runs == 0 or len(ops) % runs:
        return None
    k = len(ops) // runs
    grouped: List[List[Op]] = [[] for _ in range(steps)]
    for j, op in enumerate(ops):
        block, s = divmod(j // k, steps)
        reverse = directions == 2 and block % 2 == 1
        grouped[steps - 1 - s if reverse else s].append(op)
    return grouped
