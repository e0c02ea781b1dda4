"""Parsing of command-line values: sizes, int tuples, padding, floats, name lists — each error names its flag.

Accepted forms (documented in ``explain-shape --help``):

* sizes: ``32`` (every spatial dim), ``32x48`` (spatial dims), ``2,3,32,32`` (a full tensor shape);
* int tuples: ``3``, ``3x5``, ``3,5`` or ``(3, 5)``;
* padding: an int tuple, ``same`` or ``valid``;
* output sizes: int tuples where ``none`` keeps that input dim (adaptive pools).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

from layerlab.errors import UsageError

_SEP = re.compile(r"\s*[x×,*]\s*")


def _strip(text: str) -> str:
    return text.strip().strip("()[]").strip()


def _ints(text: str, flag: str, *, allow_none: bool = False, minimum: Optional[int] = None, what: str = "an integer",
          examples: Tuple[str, ...] = ("3", "3x5")):
    body = _strip(text)
    if not body:
        raise UsageError(f"{flag} is empty", where=flag, expected=what, got=repr(text))
    values = []
    for part in _SEP.split(body):
        if allow_none and part.lower() == "none":
            values.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            raise UsageError(
                f"{flag} expects {what}, got {text!r}",
                where=flag,
                expected=what,
                got=text,
                hint="write e.g. " + " or ".join(f"{flag} {e}" for e in examples),
            ) from None
        if minimum is not None and value < minimum:
            raise UsageError(
                f"{flag} must be ≥ {minimum}, got {value}",
                where=flag,
                expected=f"integers ≥ {minimum}",
                got=text,
            )
        values.append(value)
    return tuple(values)


def name_list(text: Optional[str], flag: str, what: str, example: str) -> Optional[List[str]]:
    """``a,b`` → ``["a", "b"]`` (``None`` stays ``None``); nothing but commas is a usage error."""
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise UsageError(f"{flag} needs at least one {what}", where=flag, hint=f"{flag} {example}")
    return names


def int_tuple(text: str, flag: str, *, minimum: Optional[int] = None, what: str = "an integer or a tuple like 3x5",
              examples: Tuple[str, ...] = ("3", "3x5")) -> Union[int, Tuple[int, ...]]:
    """``'3'`` → 3, ``'3x5'`` → (3, 5); errors name ``flag`` (and show ``what`` / ``examples``)."""
    values = _ints(text, flag, minimum=minimum, what=what, examples=examples)
    return values[0] if len(values) == 1 and not text.strip().startswith("(") else values


def output_size(text: str, flag: str) -> Union[int, None, Tuple[Optional[int], ...]]:
    """Adaptive output sizes: ``'7'``, ``'7x7'``, ``'none,7'``."""
    values = _ints(text, flag, allow_none=True, minimum=0, what="integers (or 'none') like 7 or 7x7")
    return values[0] if len(values) == 1 else values


def padding(text: str, flag: str = "--padding") -> Union[str, int, Tuple[int, ...]]:
    body = text.strip().lower()
    if body in ("same", "valid"):
        return body
    if not re.fullmatch(r"[\s\d,x×()\[\]*-]+", body):
        raise UsageError(
            f"{flag} expects an integer, a tuple like 1x2, 'same' or 'valid', got {text!r}",
            where=flag,
            expected="int, tuple, 'same' or 'valid'",
            got=text,
            hint=f"e.g. {flag} 1, {flag} 1x2 or {flag} same",
        )
    return int_tuple(text, flag, minimum=0)


def positive_float(text: str, flag: str) -> Union[float, Tuple[float, ...]]:
    parts = _SEP.split(_strip(text))
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise UsageError(f"{flag} expects a number like 2 or 1.5, got {text!r}", where=flag, got=text) from None
    if any(not v > 0 for v in values):
        raise UsageError(f"{flag} must be > 0, got {text!r}", where=flag, expected="positive numbers", got=text)
    return values[0] if len(values) == 1 else values


@dataclass(frozen=True)
class SizeArg:
    """A parsed ``--input``: either spatial sizes only, or a full tensor shape."""

    dims: Tuple[int, ...]
    full: bool


def size_arg(text: str, flag: str = "--input") -> SizeArg:
    """``32`` / ``32x48`` → spatial; ``2,3,32,32`` → a full shape (commas mean 'as torch prints it')."""
    full = "," in text
    what = "sizes ≥ 1 like 32, 32x48, or a full shape like 2,3,32,32"
    dims = _ints(text, flag, minimum=0 if full else 1, what=what)
    if full and len(dims) < 2:
        raise UsageError(f"{flag}: a full shape needs at least 2 dims, got {text!r}", where=flag, got=text)
    if not full and len(dims) > 3:
        raise UsageError(
            f"{flag}: at most 3 spatial sizes (D x H x W), got {len(dims)}",
            where=flag,
            got=text,
            hint="for a full tensor shape use commas: --input 2,3,32,32",
        )
    return SizeArg(dims=dims, full=full)
