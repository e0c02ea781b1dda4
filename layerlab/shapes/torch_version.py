"""Which torch the shape rules speak for, and the few places where torch versions disagree.

shape_rules.md describes torch 2.13.0. A later torch changed some messages and exception types
(and, with them, a little behaviour); rather than pinning torch, each such change is one row of
:data:`CHANGES` — the first version that has it — and the rule that depends on it asks
``rules.has("…")``. Versions before ``since`` keep the documented behaviour.

The version is the *installed* torch's, read from its package metadata: ``explain-shape`` never
imports torch (start-up time, and it must work where torch is missing). Every public entry point
takes ``torch_version="2.14.1"`` to ask about another torch (tests use it to check both sides of
every change under either torch).

Guarantees on the way out: :class:`TorchRules` says which version it describes, where that
version came from (``installed``, ``given``, or ``assumed`` when torch is not installed — then the
newest measured version is assumed), and whether that exact version was one the rules were
measured on (:data:`MEASURED`). A version between or after measured ones uses the rows whose
``since`` it has reached: the best guess, and said so (``measured=False``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Optional, Tuple

from layerlab.errors import UsageError

Version = Tuple[int, int, int]

#: torch versions every rule and every row below was checked against (tests/shapes, real CPU ops).
MEASURED: Tuple[str, ...] = ("2.13.0", "2.14.1")


@dataclass(frozen=True)
class Change:
    """One place where torch's shape behaviour changed; ``since`` is the first version that has it.

    ``since`` is the first *release* after the last version measured without the change (2.14.0
    was not measured itself: 2.13.0 is without it, 2.14.1 with it).
    """

    since: Version
    before: str
    after: str


CHANGES: Dict[str, Change] = {
    # F.pad → replication_pad2d/3d (shape_rules.md §1.6; fpad.py rule 5).
    "replicate-pad-every-dim": Change(
        since=(2, 14, 0),
        before="replicate padding of 2/3 dims fails only when EVERY padded size is < 1 ('input (H: 2, W: 2 ) is "
               "too small. Calculated output H: -1 W: -1'); a size of 0 next to a positive one gives an empty "
               "tensor, a negative one fails when the tensor is allocated",
        after="replicate padding of 2/3 dims fails when ANY padded size is < 1: 'Calculated output H: -1 W: -1 "
              "must be >= 1 in every dimension (input H: 2, W: 2)' (1 padded dim keeps the old wording)",
    ),
    # nn.LPPool{1,2,3}d (shape_rules.md §5; pool.py _lp_pool).
    "lp-pool-zero-norm-valueerror": Change(
        since=(2, 14, 0),
        before="norm_type=0 is accepted at construction; the forward pools, then fails on 1/norm_type with "
               "ZeroDivisionError: float division by zero",
        after="norm_type=0 fails at construction, before any other check: ValueError: norm_type must be a "
              "non-zero value, but got 0",
    ),
}

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> Version:
    """``"2.14.1+cu130"`` → ``(2, 14, 1)``; local tags and pre-release suffixes are dropped
    (a ``2.15.0a0`` nightly already behaves like the release it leads to)."""
    m = _VERSION.match(str(text))
    if m is None:
        raise UsageError(f"not a torch version: {text!r}", where="torch_version", expected="e.g. '2.14.1'",
                         got=text)
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True)
class TorchRules:
    """The torch version the shape rules describe. ``has(name)``: does it have the change ``name``?"""

    version: str
    source: str  # installed | given | assumed

    @property
    def parsed(self) -> Version:
        return parse_version(self.version)

    @property
    def measured(self) -> bool:
        return any(parse_version(v) == self.parsed for v in MEASURED)

    def has(self, name: str) -> bool:
        return self.parsed >= CHANGES[name].since

    def to_dict(self) -> dict:
        return {"version": self.version, "from": self.source, "measured": self.measured}


@lru_cache(maxsize=1)
def installed_torch_version() -> Optional[str]:
    """The installed torch's version from its metadata, without importing torch; None if absent.

    Cached: the installed package does not change under a running process (and the metadata
    scan costs about a millisecond, once per ``explain`` otherwise).
    """
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def torch_rules(torch_version: Optional[str] = None) -> TorchRules:
    """The rules of ``torch_version`` if given, else of the installed torch, else the newest measured."""
    if torch_version is not None:
        parse_version(torch_version)  # a clear UsageError now, not a confusing one later
        return TorchRules(str(torch_version).strip(), "given")
    installed = installed_torch_version()
    if installed is not None:
        parse_version(installed)
        return TorchRules(installed, "installed")
    return TorchRules(MEASURED[-1], "assumed")
