"""Leave a model's buffers as they were after a run that may write to them.

A train-mode forward updates BatchNorm's running statistics in place; ``inspect`` and
``precision-check`` run the user's own model and must hand it back unchanged, and every command's
snapshot (:mod:`layerlab.target.no_trace`) puts them back too. One mechanism for all: every buffer is saved before the run (buffers are small next to the activations) and, after
it, only those the run wrote to are put back, each as the same tensor object under the same name.

A Hugging Face model writes to its config too: a forward with ``labels`` and no
``config.problem_type`` stores the type it inferred from the labels' dtype, and every later forward
keeps it (float labels once make a classifier multi-label for good). That attribute is saved and
put back with the buffers.
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

import torch
from torch.nn.parameter import is_lazy

__all__ = ["SavedBuffers", "put_back"]


class SavedBuffers:
    """``saved = SavedBuffers(modules)`` before the run, ``saved.restore()`` after it.

    A lazy module's buffers have no values before its first forward, and inference or meta tensors
    cannot be compared: those are not saved (nothing to put back).
    """

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        modules = list(modules)
        self._saved: List[Tuple[torch.nn.Module, str, torch.Tensor, int, torch.Tensor]] = [
            (m, name, b, b._version, b.detach().clone())
            for m in modules for name, b in m._buffers.items()
            if b is not None and not is_lazy(b) and not b.is_inference() and not b.is_meta]
        configs = {id(c): c for c in (getattr(m, "config", None) for m in modules)
                   if c is not None and hasattr(c, "problem_type")}  # one config is shared by many modules
        self._config_choices = [(c, c.problem_type) for c in configs.values()]

    def restore(self) -> None:
        for config, problem_type in self._config_choices:
            if config.problem_type != problem_type:
                config.problem_type = problem_type
        with torch.no_grad():
            for m, name, b, version, values in self._saved:
                if m._buffers.get(name) is not b:  # the module replaced it (self.stat = new tensor)
                    m._buffers[name] = b
                put_back(b, version, values)


def put_back(t: torch.Tensor, version: int, values: torch.Tensor) -> bool:
    """Give ``t`` its saved ``values`` again if a run changed it (call under ``no_grad``); whether it had.

    Resized in place: its storage is set back. Otherwise the values are compared too, not only the
    version counter: batch_norm updates running statistics in place without bumping ``_version``,
    and a write through ``.data`` does not bump it either."""
    if t.shape != values.shape:
        t.set_(values.clone())
        return True
    if t._version != version or not torch.equal(t, values):
        t.copy_(values)
        return True
    return False
