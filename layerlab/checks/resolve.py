"""Moved: building the thing under test is :mod:`layerlab.target` (one Target for every command).

These names stay importable for code written against the old place; new code imports from
:mod:`layerlab.target.build` and :mod:`layerlab.target.core`.
"""

from layerlab.target.build import SPEC_KEYS, for_each_entry, from_entry as resolve_entry, from_spec as resolve_spec  # noqa: F401
from layerlab.target.build import is_spec_path  # noqa: F401
from layerlab.target.core import Target as Resolved, to_device  # noqa: F401
from layerlab.target.references import REFERENCE_OUTPUT  # noqa: F401

__all__ = ["Resolved", "resolve_entry", "resolve_spec", "is_spec_path", "to_device", "for_each_entry", "SPEC_KEYS",
           "REFERENCE_OUTPUT"]
