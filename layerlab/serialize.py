"""Turn result objects (dataclasses, tuples, enums, floats) into JSON-ready values.

One place decides how results look in JSON, so every command's ``--json`` follows the same rules:
dataclasses become objects (field order kept), tuples become lists, enums their value, and
non-finite floats the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no literal for them).

:func:`dumps` is where a JSON document leaves layerlab: every string in it (keys included) passes
through :func:`layerlab.text_safety.clean_json`, so a module name, an exception message or a file
name from untrusted code reaches a JSON consumer with its control characters, bidi marks and lone
surrogates shown as escapes and cut to a bounded length (``to_jsonable`` itself keeps the text as it
is, for code that compares values).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any, Optional


def to_jsonable(obj: Any) -> Any:
    """Return a structure of dicts, lists, str, int, float, bool and None equal to ``obj``."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        to_dict = getattr(obj, "to_dict", None)
        if callable(to_dict):
            return to_jsonable(to_dict())
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_jsonable(to_dict())
    return str(obj)


def dumps(obj: Any, indent: Optional[int] = 2) -> str:
    """Serialise ``obj`` with :func:`to_jsonable`, its text made safe to show
    (:func:`~layerlab.text_safety.clean_json`), indented (``indent=None``: one line), keys in their
    natural order."""
    from layerlab.text_safety import clean_json

    return json.dumps(clean_json(to_jsonable(obj)), indent=indent, ensure_ascii=False)
