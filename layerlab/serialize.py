"""Turn result objects (dataclasses, tuples, enums, floats) into JSON-ready values.

One place decides how results look in JSON, so every command's ``--json`` follows the same rules:
dataclasses become objects (field order kept), tuples become lists, enums their value, and
non-finite floats the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no literal for them).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any


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


def dumps(obj: Any) -> str:
    """Serialise ``obj`` with :func:`to_jsonable`, indented, keys in their natural order."""
    return json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False)
