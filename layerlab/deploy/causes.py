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
* a failure inside a library's own code (``torch/nn/…``, ``transformers/…``) on a module of that
  library (a stock ``nn.LSTM``, ``nn.Transformer``, a Hugging Face model): the generic hints ("annotate
  arguments", "an if on a tensor") would blame code the user never wrote. Say whose code it is, that
  it is a limitation of the path with that module, and what does work (a bare ``nn.LSTM`` cannot be
  scripted, the model holding it can; transformers models are not written for TorchScript).

:func:`cause_hint` returns ``None`` when none of these is the cause.
"""

from __future__ import annotations

import re
import traceback
from typing import Any, Optional

__all__ = ["cause_hint", "library_hint", "SAVE_HINT"]

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


def _library_of(module: Any) -> Optional[str]:
    """The library (``torch``, ``transformers``, …) whose class ``module`` is, or ``None`` for the user's own."""
    from layerlab.deploy.messages import LIBRARIES

    top = type(module).__module__.split(".", 1)[0] if module is not None else ""
    return top if top in LIBRARIES else None


def library_hint(exc: BaseException, path: str, module: Any = None, where: Optional[str] = None) -> Optional[str]:
    """Whose code failed, when ``module`` is a library's own class and the error points inside that
    library (or nowhere): a torch / transformers limitation, not a bug in the user's model."""
    from layerlab.deploy.messages import library_of_path

    lib = _library_of(module)
    if lib is None or type(module).__name__ in ("Sequential", "ModuleList", "ModuleDict"):
        return None  # a container of stock layers is the user's composition
    inside = library_of_path(where)
    if where is not None and inside is None:
        return None  # it points at the user's own file
    text = str(exc)
    cls = f"{type(module).__module__.split('.')[0]}.{type(module).__qualname__}"
    if lib == "torch":
        cls = f"torch.nn.{type(module).__name__}" if type(module).__module__.startswith("torch.nn") else cls
    tool = {"trace": "torch.jit.trace", "script": "torch.jit.script", "compile": "torch.compile(fullgraph=True)",
            "export": "torch.export", "export_dynamic": "torch.export", "onnx": "the ONNX exporter"}.get(path, path)
    import torch

    if path == "script" and isinstance(module, torch.nn.RNNBase) and "has no attribute 'forward'" in text:
        return (f"torch.jit.script cannot script a bare {cls}: its forward is an @overload pair that TorchScript "
                "resolves only when the RNN is a submodule (a torch limitation, not your code): script the model "
                "that holds it, or use torch.export")
    if path == "script" and lib == "transformers":
        return (f"{cls} is a transformers model, not written for TorchScript (scripting compiles the source of "
                "every method it reaches, the config's included): nothing in your code to fix; use torch.export "
                "or torch.jit.trace")
    place = f" at {where}" if where else ""
    return (f"{cls} is {lib}'s own module and the error is raised inside {lib}{place}: a limitation of {tool} "
            f"with this module, not a bug in code you wrote; try another path")


def cause_hint(exc: BaseException, path: str, module: Any = None, where: Optional[str] = None) -> Optional[str]:
    """The fix for ``exc`` raised by ``path`` when its cause is one of the module docstring's, else ``None``
    (``module``: the layer, ``where``: the location the error points at, to tell a library's own code)."""
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
    library = library_hint(exc, path, module, where)
    if library is not None:
        return library
    if path == "compile" and "data-dependent" in text:
        return ("a Python int or bool is read from a tensor's value (a ModuleList indexed by a tensor, an if on a "
                "tensor): select with tensor ops (torch.where, torch.cond) or index with a Python int")
    if _NUMPY.search(text) or "/numpy/" in frames:
        return (f"forward leaves torch for NumPy (tensor.numpy(), np.*): {tool} sees torch ops only; write that "
                "step with torch ops (torch.round, torch.sort, …)")
    return None
