"""The model's inputs, the same in every run of precision-check, and handed back unchanged.

precision-check runs the user's model twice or more on the same input tensors: float32, then each
half-precision setting. A model that writes into its input (``x.sub_(x.mean())``, a mask scaled in
place) would give the second run other inputs than the first, and every error measured between
them would be the model's write, not rounding (seen: errors of 99 where torch's are 0.003, and a
false alarm on a scaled mask). Every input tensor is saved before the first run and put back after
each one that changed it, so each run starts from the caller's values and the caller gets them back.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import torch

__all__ = ["SavedInputs"]


class SavedInputs:
    """``saved = SavedInputs(args)`` before the first run, ``saved.restore()`` after each.

    Inputs are small next to the activations; a full comparison also catches writes the version
    counter does not see (through ``.data``). Inference, meta and sparse tensors are not saved."""

    def __init__(self, args: Sequence[Any]) -> None:
        from layerlab.target.bind import input_tensors

        seen = set()
        self._saved: List[Tuple[str, torch.Tensor, int, torch.Tensor]] = []
        for name, t in input_tensors(args):
            if not isinstance(t, torch.Tensor) or id(t) in seen or t.is_inference() or t.is_meta \
                    or t.layout != torch.strided or t.is_nested:
                continue
            seen.add(id(t))
            self._saved.append((name, t, t._version, t.detach().clone()))
        self.changed: List[str] = []  # the inputs a run wrote into, by name

    def restore(self) -> List[str]:
        """Put back every input a run changed; return their names (also kept in :attr:`changed`)."""
        from layerlab.target.buffers import put_back

        found = []
        with torch.no_grad():
            for i, (name, t, version, values) in enumerate(self._saved):
                if put_back(t, version, values):
                    self._saved[i] = (name, t, t._version, values)
                    found.append(name)
        self.changed += [n for n in found if n not in self.changed]
        return found
