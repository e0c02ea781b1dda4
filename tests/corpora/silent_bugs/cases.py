"""The silent-shape-bug corpus: every case, in one list (see case.py for what a case holds).

Run ``python3 tests/corpora/silent_bugs/grade.py`` to see what layerlab reports on each buggy model
and on its correct twin.
"""

from .case import SilentBugCase
from .sequence_cases import SEQUENCE_CASES
from .structured_cases import STRUCTURED_CASES

CASES = [*SEQUENCE_CASES, *STRUCTURED_CASES]

__all__ = ["CASES", "SilentBugCase"]
