"""Hints named after the cause torch's error points at, where a path's generic hint would mislead.

A path's usual hint fits its usual failure ("data-dependent control flow needs torch.cond" for
torch.export). Some failures have another cause that the exception shows plainly, and the generic
hint sends the user the wrong way:

* NumPy in forward (``x.numpy()``, ``np.round``): TorchScript and torch.export see torch ops only;
  ``torch.export`` says ".numpy() is not supported for tensor subclasses", TorchScript "cannot
  create weak reference to 'numpy…'". Fix: torch ops.
* ``torch.nn.utils.rnn.pack_padded_sequence``: the packed batch is sized from the *values* of the
  lengths tensor, which export cannot trace. The exception is raised inside ``torch/nn/utils/rnn.py``,
  or in ``torch/nn/modules/rnn.py`` where the RNN sizes its zero state from a fake (traced) tensor.
* keyword-only ``forward(self, *, x)``: ``torch.jit.trace`` fills parameters by position or by
  name from the signature's positional parameters and cannot pass keyword-only ones.
* a data-dependent guard under ``torch.compile(fullgraph=True)`` (Dynamo's own message names no fix).
* ``torch.jit.save`` refusing a scripted module: a ``@torch.jit.ignore``'d method stays Python.

:func:`cause_hint` returns ``None`` when none of these is the cause.
"""

from __future__ import annotations

import re
import traceback
from typing import Optional

__all__ = ["cause_hint", "SAVE_HINT"]

_NUMPY = re.compile(r"\.numpy\(\)|numpy|ndarray", re.IGNORECASE)
_KW_ONLY_TRACE = re.compile(r"is not in forward\(\) method's arguments|missing \d+ required keyword-only argument")

#: the fix when a scripted module runs but cannot be saved
SAVE_HINT = ("a method marked @torch.jit.ignore (or another Python fallback) stays Python: the scripted module runs "
             "only inside this process and cannot be saved; write it in TorchScript, mark it @torch.jit.unused "
             "if inference never calls it, or use torch.export")


def _frames(exc: BaseException) -> str:
    """The file names of every frame the exception (and its causes) went through."""
    names, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        names += [f.filename.replace("\\", "/") for f in traceback.extract_tb(exc.__traceback__)]
        exc = exc.__cause__ or exc.__context__
    return "\n".join(names)


def cause_hint(exc: BaseException, path: str) -> Optional[str]:
    """The fix for ``exc`` raised by ``path`` when its cause is one of the module docstring's, else ``None``."""
    text = str(exc)
    frames = _frames(exc)
    tool = {"trace": "torch.jit.trace", "script": "TorchScript", "compile": "torch.compile"}.get(path, "torch.export")
    if path == "trace" and _KW_ONLY_TRACE.search(text):
        return ("torch.jit.trace cannot pass keyword-only forward parameters (forward(self, *, x)): make them "
                "ordinary parameters, or use torch.export (it takes kwargs)")
    packed = "torch/nn/utils/rnn.py" in frames or ("torch/nn/modules/rnn.py" in frames and "FakeTensor" in text)
    if packed and path not in ("trace", "script"):
        return ("a PackedSequence (pack_padded_sequence) sizes the RNN's batch from the values of the lengths tensor, which "
                f"{tool} cannot trace: run the RNN on the padded batch (mask the padding afterwards), or pack "
                "outside the exported module")
    if path == "compile" and "data-dependent" in text:
        return ("a Python int or bool is read from a tensor's value (a ModuleList indexed by a tensor, an if on a "
                "tensor): select with tensor ops (torch.where, torch.cond) or index with a Python int")
    if _NUMPY.search(text) or "/numpy/" in frames:
        return (f"forward leaves torch for NumPy (tensor.numpy(), np.*): {tool} sees torch ops only; write that "
                "step with torch ops (torch.round, torch.sort, …)")
    return None
