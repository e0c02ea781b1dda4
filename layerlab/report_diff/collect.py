"""The one place changes are recorded: numbers against the tolerance, everything else by equality."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, List

from layerlab.report_diff.numbers import as_number, differ, score
from layerlab.report_diff.report import Change


class Collector:
    """Collects :class:`Change`\\ s and counts what was compared.

    ``quiet=True`` compares without recording (used to ask "are this call's inputs the same?").
    """

    def __init__(self, rtol: float, atol: float, quiet: bool = False) -> None:
        self.rtol = rtol
        self.atol = atol
        self.quiet = quiet
        self.changes: List[Change] = []
        self.compared: Counter = Counter()

    def quietly(self) -> "Collector":
        return Collector(self.rtol, self.atol, quiet=True)

    def number(self, section: str, where: str, what: str, a: Any, b: Any, scale: float = 0.0) -> bool:
        """Compare two numbers (either may be missing: then nothing is compared); True if they differ."""
        x, y = as_number(a), as_number(b)
        if x is None or y is None:
            if (x is None) != (y is None) and (a is None) != (b is None):
                return self.add(section, where, what, a, b)  # measured in one run only
            return False
        self.compared["numbers"] += 1
        if not differ(x, y, self.rtol, self.atol):
            return False
        if not self.quiet:
            self.changes.append(Change(section, _shown(where), _shown(what), a, b, score=score(x, y, self.atol, scale),
                                       numeric=True))
        return True

    def same(self, section: str, where: str, what: str, a: Any, b: Any) -> bool:
        """Compare two values by equality; True (and recorded as a structural change) if they differ."""
        if a == b:
            return False
        return self.add(section, where, what, a, b)

    def add(self, section: str, where: str, what: str, a: Any, b: Any) -> bool:
        """Record a structural change (score ∞: ranked before every numeric one)."""
        if not self.quiet:
            self.changes.append(Change(section, _shown(where), _shown(what), _shown(a), _shown(b), score=math.inf))
        return True


def _shown(value: Any) -> Any:
    """A string from a report file as it may be echoed: control characters escaped, cut to a few
    hundred characters (a report is user input: it must not drive the terminal or print megabytes)."""
    if not isinstance(value, str):
        return value
    from layerlab.spec.limits import clean_text

    return clean_text(value, 300)
