"""Writing a file the user named (``--svg``, ``--html``, ``--plot``, ``--plot-histograms``): all or nothing,
never over an input, never through a link unless asked.

One helper for every writer (:func:`write_output`), and one check of the whole set before the run
(:func:`check_outputs`):

* **all or nothing**: the bytes go to a temporary file in the same folder, which is renamed over the
  path only once complete (``os.replace`` is atomic on one file system). A run stopped half-way (a
  full disk, Ctrl-C, a timeout) leaves the old file as it was and no partial one; the temporary
  file is removed on every way out.
* **never over an input**: a path that is one of the run's inputs (the spec, a model's source file,
  the report ``diff`` reads) is refused, as are two outputs with one path (``--svg a --plot a``).
  Paths are compared as files (``os.path.samefile``), so ``./a.svg``, ``a.svg`` and a hard link
  are the same file.
* **never through a link unless asked**: a path that is a symbolic link is refused (it may point at
  a file the user did not mean: ``report.html -> ~/.bashrc``); ``--force`` writes the file the link
  points to (the link itself is kept).

This module never imports torch or the CLI.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

from layerlab.errors import UsageError

__all__ = ["write_output", "check_outputs", "source_files", "Data"]

#: what to write: text, bytes, or a function that writes to a binary file object
Data = Union[str, bytes, Callable[[object], None]]


def check_outputs(outputs: Sequence[Tuple[str, Optional[Union[str, Path]]]], inputs: Iterable[Union[str, Path]] = (),
                  *, force: bool = False) -> None:
    """Refuse, before any work, an output path that is a symbolic link (unless ``force``), one of the
    ``inputs``, or the path of another output. ``outputs``: ``(flag, path or None)`` pairs."""
    given = [(flag, Path(path)) for flag, path in outputs if path is not None]
    for flag, path in given:
        _refuse_link(flag, path, force)
    files = [Path(p) for p in inputs if p is not None]
    for flag, path in given:
        for source in files:
            if _same_file(path, source):
                raise UsageError(f"{flag}: {str(path)!r} is one of this run's inputs ({str(source)!r}); writing "
                                 "it would destroy it", where=flag, got=str(path),
                                 hint="save the output under another name")
    for i, (flag, path) in enumerate(given):
        for other_flag, other in given[i + 1:]:
            if _same_file(path, other):
                raise UsageError(f"{flag} and {other_flag} name the same file {str(path)!r}: one would overwrite "
                                 "the other", where=other_flag, got=str(other), hint="give each output its own path")


def write_output(path: Union[str, Path], data: Data, *, flag: str, force: bool = False) -> Path:
    """Write ``data`` to ``path`` all at once (see the module docstring); return the path written.

    Raises:
        UsageError: the path is a symbolic link and ``force`` is off, or the file cannot be written
            (no such folder, no permission, a full disk): nothing was changed.
    """
    target = Path(path)
    _refuse_link(flag, target, force)
    if force and target.is_symlink():
        target = Path(os.path.realpath(target))  # the file the link points to; the link stays
    folder = target.parent
    fd, tmp = -1, None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            fd = -1  # the file object owns it now
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write {str(path)!r}: {exc.strerror or exc}", where=flag, got=str(path),
                         hint="choose a path in a folder you can write to") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return target


def _mode_for(target: Path) -> int:
    """An existing file keeps its permissions; a new one gets what ``open()`` would give it (0666 − umask)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _refuse_link(flag: str, path: Path, force: bool) -> None:
    if force or not path.is_symlink():
        return
    raise UsageError(f"{flag}: {str(path)!r} is a symbolic link (to {os.readlink(path)!r}); layerlab does not write "
                     "through a link unless told to", where=flag, got=str(path),
                     hint="pass --force to write the file it points to, or give another path")


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.abspath(a) == os.path.abspath(b)


def source_files(objects: Iterable[object]) -> List[str]:
    """The source files of the classes of ``objects`` that are the user's (not torch's, not layerlab's):
    a model's ``.py`` files, which an output must not overwrite."""
    import inspect
    import sys

    roots = [os.path.dirname(os.path.abspath(m.__file__)) + os.sep
             for m in (sys.modules.get("torch"), sys.modules.get("layerlab")) if getattr(m, "__file__", None)]
    found: List[str] = []
    for cls in {type(o) for o in objects}:
        try:
            path = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            continue
        if path and not os.path.abspath(path).startswith(tuple(roots)) and path not in found:
            found.append(path)
    return found
