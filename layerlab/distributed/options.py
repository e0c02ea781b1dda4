"""The options of a DDP check: the spec's ``ddp:`` section, then the command line / Python arguments.

    ddp:
      nproc: 2                          # ranks on this machine (``--nproc``)
      loss: ./losses.py:token_nll       # fn(output, inputs) -> scalar; needs --allow-import
      find_unused_parameters: false     # as you pass it to DistributedDataParallel
      broadcast_buffers: true           # idem
      timeout: 60                       # seconds every collective may wait (``--timeout``)

Every value is checked here, before any process starts; a bad one is a
:class:`~layerlab.errors.SpecError` naming the spec line (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from layerlab.errors import SpecError, UsageError

__all__ = ["DdpOptions", "from_section", "KEYS"]

KEYS = ("nproc", "loss", "find_unused_parameters", "broadcast_buffers", "timeout")

#: the most ranks one machine is asked to start: each one is a process importing torch
MAX_NPROC = 64
#: the longest a collective may wait (one day): longer is a hang, and torch's timedelta overflows near 1e14 s
MAX_TIMEOUT = 86_400.0


@dataclass(frozen=True)
class DdpOptions:
    """What the check runs with.

    Attributes:
        nproc: ranks started on this machine (ignored under torchrun, which decides).
        loss: an import path (``pkg.mod:fn``) or a callable ``fn(output, inputs) -> scalar``;
            ``None``: the default per-sample mean (:mod:`layerlab.distributed.loss`).
        find_unused_parameters, broadcast_buffers: DistributedDataParallel's, as the user trains.
        timeout: seconds any collective (and the rendezvous) may wait before the rank raises.
    """

    nproc: int = 2
    loss: Any = None
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    timeout: float = 60.0

    def with_(self, **changes: Any) -> "DdpOptions":
        """These options with the non-``None`` ``changes`` applied (command line over spec)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def check_nproc(n: Any, where: str = "--nproc") -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NPROC:
        raise UsageError(f"nproc must be a whole number of ranks from 1 to {MAX_NPROC}", where=where,
                         expected=f"1 … {MAX_NPROC}", got=n, hint="2 ranks show every DDP pitfall this checks")
    return n


def check_timeout(t: Any, where: str = "--timeout") -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT:
        raise UsageError(f"timeout is a number of seconds > 0 and at most {MAX_TIMEOUT:g} (a day)", where=where,
                         expected=f"0 < seconds ≤ {MAX_TIMEOUT:g}", got=t,
                         hint="a collective that waits longer than this has hung; 60 s is plenty on one machine")
    return float(t)


def from_section(section: Any, marks: Optional[Callable[..., Optional[str]]] = None) -> DdpOptions:
    """``ddp:`` as written → :class:`DdpOptions` (defaults for what it leaves out)."""
    mark = marks or (lambda *keys: None)
    if section is None:
        return DdpOptions()
    if not isinstance(section, dict):
        raise SpecError("ddp: is a mapping of options", where=mark("ddp"), expected=f"keys among {', '.join(KEYS)}",
                        got=section)
    unknown = [k for k in section if k not in KEYS]
    if unknown:
        from layerlab.spec.schema import did_you_mean

        raise SpecError(f"ddp: has no option {unknown[0]!r}", where=mark("ddp", unknown[0]), expected=list(KEYS),
                        got=unknown[0], hint=did_you_mean(str(unknown[0]), KEYS))
    values = {}
    for key in ("find_unused_parameters", "broadcast_buffers"):
        if key in section:
            if not isinstance(section[key], bool):
                raise SpecError(f"ddp: {key} is true or false", where=mark("ddp", key), expected="true | false",
                                got=section[key])
            values[key] = section[key]
    try:
        if "nproc" in section:
            values["nproc"] = check_nproc(section["nproc"], "ddp: nproc")
        if "timeout" in section:
            values["timeout"] = check_timeout(section["timeout"], "ddp: timeout")
    except UsageError as exc:  # the same rule, reported against the spec's line
        raise SpecError(exc.message, where=mark("ddp", exc.where.split()[-1]), expected=exc.expected, got=exc.got,
                        hint=exc.hint) from None
    if "loss" in section:
        loss = section["loss"]
        if not isinstance(loss, str) or ":" not in loss:
            raise SpecError("ddp: loss is an import path to a function fn(output, inputs) -> scalar",
                            where=mark("ddp", "loss"), expected="module:function or ./file.py:function", got=loss)
        values["loss"] = loss
    return DdpOptions(**values)
