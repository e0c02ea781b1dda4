"""Resource limits on what a spec may ask for, and making spec text safe to echo.

A spec file is input from anyone: a 0.5 KB alias bomb, ``repeat: 1000000000``, a dim of 10^26
or ``/dev/zero`` must each end in one clear :class:`~layerlab.errors.SpecError` (exit 2) naming
the limit and where the spec crosses it, never in a hang, an out-of-memory kill or a traceback.
The limits are far above any real layer spec (the README's examples use < 1 % of each):

* :data:`MAX_SPEC_BYTES` the file size (and at most that many bytes are ever read);
* :data:`MAX_VALUES` YAML values after alias expansion (billion laughs);
* :data:`MAX_DEPTH` nesting of brackets and blocks (Python's recursion limit is ~1000 frames);
* :data:`MAX_REPEAT` one item's ``repeat:``, and :data:`MAX_LAYERS` the layers a spec builds;
* :data:`MAX_INT` sizes and seeds fit torch's int64.

Memory is judged against what the machine has free (:func:`available_memory`), see
:mod:`layerlab.spec.memory`. Everything echoed back from a spec goes through :func:`clean_text`:
control characters (ESC sequences that recolour or retitle the terminal, ``\\r``) are replaced
and long values truncated.

This module never imports torch.
"""

from __future__ import annotations

import re
import unicodedata
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from layerlab.errors import LayerlabError

MAX_SPEC_BYTES = 1 << 20
MAX_VALUES = 100_000
MAX_DEPTH = 64
MAX_REPEAT = 1_000
MAX_LAYERS = 10_000
MAX_INT = 2**63 - 1
#: characters of one echoed value (a name, a got: value) before it is cut
ECHO_CHARS = 200
#: characters of one whole message line before it is cut
MESSAGE_CHARS = 2_000

# C0 (but newline), DEL, C1, and the bidi/isolate overrides that reorder what a terminal shows
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean_text(value: Any, limit: int = ECHO_CHARS) -> str:
    """``str(value)`` safe for a terminal: control characters shown as ``\\x1b``-style escapes,
    cut to ``limit`` characters with a note of how many were left out."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text) - limit} more characters)"
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def has_control(text: str) -> bool:
    """Does ``text`` hold a character :func:`clean_text` would replace (or a line break)?"""
    return bool(_CONTROL.search(text)) or "\n" in text


def clean_value(value: Any, limit: int = ECHO_CHARS) -> Any:
    """A ``got:``/``expected:`` value safe to echo: small plain values unchanged, the rest as
    cleaned, truncated text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return clean_text(value, limit)
    if isinstance(value, (list, tuple, dict)) and _small(value):
        if isinstance(value, dict):
            return {clean_text(k, limit): clean_value(v, limit) for k, v in value.items()}
        return [clean_value(v, limit) for v in value]
    return clean_text(repr(value) if isinstance(value, (list, tuple, dict)) else value, limit)


def _small(value: Any, budget: int = 50) -> bool:
    """At most ``budget`` values in all (a shared-alias structure is not walked further)."""
    stack, seen = [value], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(v, dict):
            stack.extend(v.values())
            stack.extend(v.keys())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return True


def clean_error(exc: Any) -> Any:
    """Make a :class:`~layerlab.errors.LayerlabError`'s fields safe to echo (in place); returns it."""
    for attr in ("message", "hint", "where"):
        text = getattr(exc, attr, None)
        if isinstance(text, str):
            setattr(exc, attr, clean_text(text, MESSAGE_CHARS))
    for attr in ("expected", "got"):
        setattr(exc, attr, clean_value(getattr(exc, attr, None)))
    if exc.args:
        exc.args = (exc.message,) + tuple(exc.args[1:])
    return exc


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (torch appends a C++ stack to some), or its class name."""
    try:
        lines = str(exc).strip().splitlines()
    except Exception:  # an exception whose __str__ raises
        lines = []
    return lines[0] if lines else type(exc).__name__


@contextmanager
def clean_errors() -> Iterator[None]:
    """Let a :class:`~layerlab.errors.LayerlabError` through with its fields made safe to echo."""
    try:
        yield
    except LayerlabError as exc:
        clean_error(exc)
        raise


def format_bytes(n: float) -> str:
    """``4.0 PB``, ``21 GB``, ``512 B`` (decimal units, as ``free``/``df -H`` print them)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB", "EB"):
        if abs(n) < 1000 or unit == "EB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.1f} {unit}" if abs(n) < 10 else f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.0f} EB"  # pragma: no cover - the loop returns


def available_memory() -> Optional[int]:
    """Bytes of memory free for a new allocation (``MemAvailable``), or ``None`` if unknown.

    psutil when it is installed (it knows macOS and Windows too), else ``/proc/meminfo``.
    A cgroup limit (a container) lowers it further.
    """
    free: Optional[int] = None
    try:
        import psutil  # type: ignore[import-not-found]

        free = int(psutil.virtual_memory().available)
    except Exception:
        free = _meminfo_available()
    limit = _cgroup_room()
    if limit is not None:
        free = limit if free is None else min(free, limit)
    return free


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo", "r", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> Optional[int]:
    """cgroup v2 ``memory.max − memory.current`` of this process's cgroup, if it has a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max", "r", encoding="ascii") as f:
            raw = f.read().strip()
        if raw == "max":
            return None
        with open("/sys/fs/cgroup/memory.current", "r", encoding="ascii") as f:
            current = int(f.read().strip())
        return max(int(raw) - current, 0)
    except (OSError, ValueError):
        return None


def char_name(ch: str) -> str:
    """``U+0000 (NUL)``-style name of one character, for messages about bad bytes."""
    name = unicodedata.name(ch, "") or {0: "NUL", 0x1B: "ESC", 0x7F: "DEL"}.get(ord(ch), "control character")
    return f"U+{ord(ch):04X} ({name})"

