"""Make untrusted text safe to show: the one sanitiser for names, messages, warnings, file names.

A model is code from anyone, and so are its module names, the messages of the exceptions and
warnings it raises, a spec's ``name:`` and the name of the spec file. Shown raw, such text drives
the terminal: ``ESC[2J`` clears the screen, an OSC sequence retitles the window or plants a
hyperlink, a bidi override reorders what is read, a newline forges a line of layerlab's own
("result: ok"), and a lone surrogate (a non-UTF-8 file name) makes writing it raise. Rich markup
in it (``[bold red]``, ``[link=file:///etc/passwd]``) would be interpreted rather than shown.

Every such piece of text passes through :func:`clean` on its way out, in both forms of output:

* every renderer's entry point is wrapped in :func:`displays`: it renders a copy of the report with
  every string cleaned (:func:`display_copy`), so a name put in a ``rich.text.Text`` or cut to a
  column's width is already safe, and its width is the width shown;
* the renderers build Rich markup from data only through :func:`escape` (``clean`` + Rich's
  markup escape), so the text is shown literally, whatever brackets it holds;
* ``--json`` documents and JSON lines on stderr go through :func:`clean_json`
  (:func:`layerlab.serialize.dumps`), so a JSON consumer gets the same visible text.

What :func:`clean` does to one field, and nothing else (plain text comes back unchanged):

* C0 and C1 control characters, DEL and the bidi/isolate marks (U+200E/F, U+061C,
  U+202A–202E, U+2066–2069) and the line/paragraph separators U+2028/9 are shown as the escape
  that names them: ``\\x1b``, ``\\x9b``, ``\\u202e``;
* a newline is shown as ``⏎`` (under JSON it stays a newline: JSON escapes it, and a message of
  several lines is data there);
* a lone surrogate is replaced: one from a byte that was not UTF-8 (``\\udcff``, Python's
  ``surrogateescape``) by that byte as ``\\xff``, any other by its ``\\udXXX`` escape;
* a field longer than ``limit`` characters is cut, ending in ``…(+N chars)`` — N characters of
  the original left out. The result is never longer than ``limit``.

``clean`` is idempotent (cleaning cleaned text changes nothing), so text that crosses a process
boundary as JSON (``ddp-check``'s ranks) and is then rendered is not escaped twice.

This module never imports torch; Rich only inside :func:`escape` and :func:`safe_console_class`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from typing import Any, Callable, Optional

__all__ = ["clean", "clean_json", "display_copy", "displays", "escape", "FIELD_CHARS", "JSON_FIELD_CHARS",
           "safe_console_class", "unsafe"]

#: characters of one field shown on a terminal before it is cut (a module path is < 200)
FIELD_CHARS = 1_000
#: characters of one string in a JSON document before it is cut (longer: a message of many lines)
JSON_FIELD_CHARS = 10_000

# control characters but the newline, DEL, C1, the bidi/isolate marks, line/paragraph separators,
# and every surrogate (a str holding one cannot be written as UTF-8)
_UNSAFE = "\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_UNSAFE_OR_NEWLINE_RE = re.compile(f"[\n{_UNSAFE}]")
NEWLINE_MARK = "⏎"


def _visible(ch: str) -> str:
    """The escape that names one unsafe character."""
    if ch == "\n":
        return NEWLINE_MARK
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte that was not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def unsafe(text: str, newlines: bool = True) -> bool:
    """Does ``text`` hold a character :func:`clean` would replace (a newline too, unless
    ``newlines=False``)?"""
    return bool((_UNSAFE_OR_NEWLINE_RE if newlines else _UNSAFE_RE).search(text))


def clean(value: Any, limit: Optional[int] = FIELD_CHARS, newlines: bool = False) -> str:
    """``str(value)`` safe to write to a terminal (see the module docstring); ``newlines=True``
    keeps newlines as they are (a JSON string); ``limit=None`` never cuts."""
    text = value if isinstance(value, str) else _str(value)
    pattern = _UNSAFE_RE if newlines else _UNSAFE_OR_NEWLINE_RE
    if limit is None:
        return pattern.sub(lambda m: _visible(m.group()), text)
    if len(text) <= limit and not pattern.search(text):
        return text
    head = text[:limit]
    shown = pattern.sub(lambda m: _visible(m.group()), head)
    if len(text) <= limit and len(shown) <= limit:
        return shown
    return _cut(text, limit, pattern)


def _cut(text: str, limit: int, pattern: "re.Pattern[str]") -> str:
    """``text`` cleaned and cut to at most ``limit`` characters, the note of what was left out
    included. Escapes are never split."""
    out, used, taken = [], 0, 0
    for ch in text[:limit]:
        piece = _visible(ch) if pattern.match(ch) else ch
        note = len(_note(len(text) - taken - 1))
        if used + len(piece) + note > limit and taken < len(text):
            break
        out.append(piece)
        used += len(piece)
        taken += 1
    return "".join(out) + _note(len(text) - taken)


def _note(left_out: int) -> str:
    return f"…(+{left_out} chars)"


def _str(value: Any) -> str:
    try:
        return str(value)
    except Exception as exc:  # a model's object whose __str__ raises: name it, don't fail the report
        return f"<{type(value).__name__}: str() raised {type(exc).__name__}>"


def escape(value: Any, limit: int = FIELD_CHARS) -> str:
    """``value`` as Rich markup that shows it literally: :func:`clean`, then Rich's markup escape
    (``[bold]`` shows as ``[bold]``). The renderers build markup from data only through this."""
    from rich.markup import escape as markup_escape

    return markup_escape(clean(value, limit))


def clean_json(obj: Any, limit: int = JSON_FIELD_CHARS) -> Any:
    """A JSON-ready structure (:func:`layerlab.serialize.to_jsonable`) with every string, keys
    included, passed through :func:`clean` (newlines kept: JSON escapes them)."""
    if isinstance(obj, str):
        return clean(obj, limit, newlines=True)
    if isinstance(obj, dict):
        return {clean(k, limit, newlines=True) if isinstance(k, str) else k: clean_json(v, limit)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_json(v, limit) for v in obj]
    return obj


def display_copy(obj: Any, limit: int = FIELD_CHARS, _memo: Optional[dict] = None) -> Any:
    """A copy of a report to render: dataclasses, lists, tuples, dicts (keys too) and sets walked,
    every string passed through :func:`clean`. Anything else (numbers, enums, tensors, modules) is
    the same object. Shared parts stay shared; the report itself is not changed. Nothing is copied
    when no string needs cleaning."""
    memo = {} if _memo is None else _memo
    if isinstance(obj, str):
        return clean(obj, limit)
    if obj is None or isinstance(obj, (bool, int, float)):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        memo[key] = obj  # a cycle back to obj while it is walked sees obj itself
        values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if hasattr(obj, f.name)}
        walked = {name: display_copy(v, limit, memo) for name, v in values.items()}
        if all(walked[name] is values[name] for name in values):
            return obj
        new = copy.copy(obj)
        for name, v in walked.items():
            object.__setattr__(new, name, v)
        memo[key] = new
        return new
    if isinstance(obj, (list, tuple, set, frozenset)):
        memo[key] = obj
        items = list(obj)
        walked_items = [display_copy(v, limit, memo) for v in items]
        if all(a is b for a, b in zip(walked_items, items)):
            return obj
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple
            new = type(obj)(*walked_items)
        else:
            try:
                new = type(obj)(walked_items)
            except TypeError:
                new = list(walked_items) if isinstance(obj, list) else tuple(walked_items)
        memo[key] = new
        return new
    if isinstance(obj, dict):
        memo[key] = obj
        pairs = [(display_copy(k, limit, memo), display_copy(v, limit, memo)) for k, v in obj.items()]
        if all(k2 is k and v2 is v for (k2, v2), (k, v) in zip(pairs, obj.items())):
            return obj
        new = dict(pairs)
        memo[key] = new
        return new
    return obj


def displays(render: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a renderer's entry point ``render(report, ..., title=...)``: it is given
    :func:`display_copy` of the report and of every other argument (a title from a spec's
    ``name:``), so nothing it shows from them can drive the terminal."""

    @functools.wraps(render)
    def safe(*args: Any, **kwargs: Any) -> Any:
        memo: dict = {}
        return render(*(display_copy(a, _memo=memo) for a in args),
                      **{k: display_copy(v, _memo=memo) for k, v in kwargs.items()})

    return safe


def safe_console_class():
    """:class:`rich.console.Console` that writes no control character from text: the last line of
    defence should a renderer pass data to Rich without :func:`escape` or :func:`displays`. Only
    text segments are cleaned (newlines kept: they are Rich's line breaks); colour codes (rendered
    from styles) and Rich's own control segments (a progress bar's cursor moves) pass unchanged."""
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        def _render_buffer(self, buffer):
            return super()._render_buffer(
                Segment(clean(text, limit=None, newlines=True), style, control) if not control else segment
                for segment in buffer for text, style, control in (segment,))

    return SafeConsole
