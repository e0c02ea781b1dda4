"""Where the forward pins the batch size: the line torch.export's message leaves out.

torch.export refuses a ``Dim("batch")`` that the code specialised ("You marked batch as dynamic
but your code specialized it to be a constant (4)") without saying where. torch's shape
environment logs every guard it adds (logger ``torch.fx.experimental.symbolic_shapes``, INFO:
``eval Eq(s77, 4) [guard added] …``), synchronously, from inside the op that added it. A handler
on that logger, while the export runs, looks at the Python stack at the first guard that equates
a symbol with the batch size and keeps the innermost frame outside torch, layerlab and logging:
the user's line (``model.py:41``), or the library's line for a model the user did not write.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Callable, Optional, Tuple

from layerlab.deploy.messages import in_torch, short_path

_GUARDS = "torch.fx.experimental.symbolic_shapes"
_PINNED = re.compile(r"\bEq\(s\d+, (\d+)\) \[guard added\]")
_SKIP = tuple(os.path.dirname(m.__file__) + os.sep for m in (logging,) if m.__file__)
_LAYERLAB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _outside_libraries(filename: str) -> bool:
    if filename.startswith("<") or filename.startswith(_LAYERLAB) or filename.startswith(_SKIP):
        return False
    return not in_torch(filename)


class _Watch(logging.Handler):
    def __init__(self, batch: int) -> None:
        super().__init__(logging.INFO)
        self.batch, self.where = batch, None

    def emit(self, record: logging.LogRecord) -> None:
        if self.where is not None:
            return
        try:
            found = _PINNED.search(record.getMessage())
        except Exception:  # a record we cannot format says nothing about the batch
            return
        if found is None or int(found.group(1)) != self.batch:
            return
        frame = sys._getframe(1)
        while frame is not None and not _outside_libraries(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            self.where = f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def export_pinning(export: Callable[[], object], batch: int) -> Tuple[Optional[BaseException], Optional[str]]:
    """Run ``export()`` (a torch.export with the batch dims dynamic): ``(its exception or None,
    the line that pinned the batch to ``batch`` or None)``. Logging is restored as it was."""
    log = logging.getLogger(_GUARDS)
    watch = _Watch(batch)
    saved = (logging.root.manager.disable, log.level, log.propagate, log.handlers)
    logging.disable(logging.NOTSET)  # quiet() may have disabled all logging: this one logger must speak
    log.setLevel(logging.INFO)
    log.propagate = False  # to our handler only: not to torch's own stderr handlers, here or above
    log.handlers = [watch]
    try:
        export()
        raised = None
    except Exception as exc:
        raised = exc
    finally:
        log.handlers = saved[3]
        logging.disable(saved[0])
        log.setLevel(saved[1])
        log.propagate = saved[2]
    return raised, watch.where
