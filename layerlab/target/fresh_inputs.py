"""A forward that writes into its own input: every repeat must still start from the user's values.

``x.mul_(3)`` inside ``forward`` changes the caller's tensor. A command that runs the forward many
times (profile's timed steps, train-check's optimizer steps) would otherwise run step *k* on the
input multiplied *k* times (``x`` ends at 3**k times itself), measure or train on data the user
never gave, and hand the user's tensor back changed. :class:`FreshInputs` watches the input tensors
and, once a run has written into one, gives the next run the original values again (copied back
in place, outside what is timed); the report says so with :meth:`FreshInputs.note`::

    fresh = FreshInputs([("x", x)])
    for step in range(n):
        fresh.refresh()          # the original values, if the last run changed them
        model(*inputs)
    report.notes += fresh.note()

Detection compares the values after the first run (a write through ``.data`` does not bump the
version counter) and the version counters after every later one.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Tuple

import torch

from layerlab.target.no_trace import tensors_in

__all__ = ["FreshInputs"]


class FreshInputs:
    """The tensors in ``(name, value)`` inputs (nested values), saved once; see the module docstring."""

    def __init__(self, named: Iterable[Tuple[str, Any]]) -> None:
        self._saved = []
        self._names = {}
        seen: dict = {}
        for name, value in named:
            for key, t in tensors_in(value).items():
                if key in seen or t.layout != torch.strided or t.is_meta or t.is_inference():
                    continue
                seen[key] = t
                self._names[key] = name
                self._saved.append((t, t.detach().clone(), t._version))
        self._checked = False
        self.written: List[str] = []  # the inputs a run wrote into, by name

    def refresh(self) -> None:
        """Put back the values a run wrote into the inputs (nothing to do while none did)."""
        with torch.no_grad():
            for i, (t, values, version) in enumerate(self._saved):
                if t._version == version and (self._checked or _same(t, values)):
                    continue
                if t.shape != values.shape:
                    t.set_(values.clone())
                else:
                    t.copy_(values)
                self._saved[i] = (t, values, t._version)
                name = self._names[id(t)]
                if name not in self.written:
                    self.written.append(name)
        self._checked = True

    def note(self) -> List[str]:
        """The report's note when the forward wrote into its input(s), else none."""
        if not self.written:
            return []
        return [f"the forward writes into its input(s) {', '.join(self.written)} in place: every repeat ran on "
                "a fresh copy of the values you passed (and your tensors are left as they were)"]


def _same(t: torch.Tensor, values: torch.Tensor) -> bool:
    return t.shape == values.shape and t.dtype == values.dtype and bool(torch.equal(t, values))
