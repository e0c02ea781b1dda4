"""The one line worth showing from torch's long export/compile errors, and where it points.

Dynamo, torch.export and TorchScript raise messages of thirty lines: an explanation, hints, a
link, the user frame, "set TORCH_LOGS=…". A matrix cell shows the first line that says what is
unsupported, and the user's ``file.py:line`` the message names.
"""

from __future__ import annotations

import os
import re
from typing import Optional

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
#: torch's own plumbing: a location there says nothing about the layer
_MACHINERY = ("torch/_dynamo/", "torch/nn/modules/module.py", "torch/export/", "torch/_export/", "torch/fx/",
              "torch/jit/", "torch/onnx/", "torch/_subclasses/", "torch/_functorch/")
_SKIP = ("Traceback", "The above exception", "Set TORCH", "For more", "from user code")


def short_path(filename: str) -> str:
    """``…/site-packages/torch/nn/modules/rnn.py`` → ``torch/nn/modules/rnn.py``; a file under the
    working directory relative to it; anything else by its last two parts."""
    norm = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in norm:
            return norm.split(marker, 1)[1]
    try:
        rel = os.path.relpath(filename)
        if not rel.startswith(".."):
            return rel.replace("\\", "/")
    except ValueError:  # pragma: no cover - another drive on Windows
        pass
    return "/".join(norm.split("/")[-2:])


_ERROR_LINE = re.compile(r"^[A-Za-z_.]*(Error|Exception): ")
_SCHEMA = re.compile(r"^[\w.:]*\(.*\) -> .*:$")  # TorchScript prints the op schema before its complaint
_UNIT = re.compile(r" \(of Python compilation unit at: 0x[0-9a-fA-F]+\)")
_MANGLE = re.compile(r"___torch_mangle_\d+\.")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TRACE_TYPE = re.compile(r"^(.*Tracer cannot infer type of [\w.]+)\(.*$")


def first_line(exc: BaseException) -> str:
    """``ExcType: the first meaningful line`` (for torch.export's constraint errors, the violation;
    for a wrapper such as the ONNX exporter's "Failed to export …", the error it wraps)."""
    try:
        str(exc)
    except Exception:  # the model's own exception class may fail to print: its name still says something
        return f"{type(exc).__name__} (its message could not be shown: str() raised)"
    cause = exc.__cause__
    if cause is not None and str(exc).lstrip().startswith(("Failed to export", "Failed to convert")):
        return first_line(cause)
    text = _ANSI.sub("", str(exc)).strip()
    lines = [ln.strip() for ln in text.splitlines()]
    if "failed in the TorchScript interpreter" in text:  # the error raised inside the scripted code
        inner = [ln for ln in lines if _ERROR_LINE.match(ln)]
        if inner:
            return inner[-1] if len(inner[-1]) <= 240 else inner[-1][:237] + "…"
    head = lines[:next((i for i, ln in enumerate(lines) if ln.startswith('File "')), len(lines))]
    pick = next((ln for ln in head if ln and ln != ":" and not ln.startswith(_SKIP) and not _SCHEMA.match(ln)), "")
    if pick.startswith("Constraints violated"):
        violation = next((ln.lstrip("- ").strip() for ln in lines if ln.startswith("- ")), None)
        if violation:
            pick = violation.split(". ", 1)[0]
    pick = _MANGLE.sub("", _UNIT.sub("", pick)).rstrip(": ").strip()
    pick = _TRACE_TYPE.sub(r"\1", pick)  # the type, not the repr of every tensor it holds
    if len(pick) > 240:
        pick = pick[:237] + "…"
    name = type(exc).__name__
    return f"{name}: {pick}" if pick else name


def user_location(text: str, innermost: str = "last") -> Optional[str]:
    """A ``File "…", line N`` of a message that is not inside torch itself, as ``path:N``.

    Dynamo and torch.export list frames outermost first (``innermost="last"``); TorchScript names
    the failing line first and then its callers (``innermost="first"``).
    """
    # ``<string>`` / ``<eval_with_key>`` / ``<frozen …>``: code torch generated or exec'd, no file to open
    found = [(path, line) for path, line in _FILE_LINE.findall(text) if not path.startswith("<")]
    if not found:
        return None
    own = [(p, n) for p, n in found if not in_torch(p)]
    if own:
        path, line = own[-1] if innermost == "last" else own[0]
        return f"{short_path(path)}:{line}"
    useful = [(p, n) for p, n in found if not short_path(p).startswith(_MACHINERY)]
    if not useful:
        return None
    path, line = useful[-1] if innermost == "last" else useful[0]  # the frame nearest the failure
    return f"{short_path(path)}:{line}"


#: installed libraries whose modules people export without having written them
LIBRARIES = ("torch", "transformers", "torchvision", "timm", "torchaudio")


def library_of_path(where: Optional[str]) -> Optional[str]:
    """``torch`` for ``torch/nn/modules/rnn.py:328`` (a :func:`user_location` inside a library), else ``None``."""
    if not where:
        return None
    top = where.replace("\\", "/").split("/", 1)[0]
    return top if top in LIBRARIES and "/" in where else None


def in_torch(path: str) -> bool:
    norm = path.replace("\\", "/")
    return "/torch/" in norm and ("site-packages" in norm or "dist-packages" in norm)
