"""Probes for ``layerlab.inspect(..., probes=[...])`` and ``inspect --probe NAME[,NAME]``.

Each built-in probe lives in its own module and is loaded only when asked for (see
:mod:`layerlab.probe.probes.base` for the protocol). A probe can be given as a name, a
:class:`~layerlab.probe.probes.base.Probe` instance, or a plain callable
``(module, inputs, output) -> dict of numbers`` (a custom probe, run on every module call).
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Iterable, List

from layerlab.errors import UsageError

#: probe name -> "module:class", one concept per module
BUILTIN: Dict[str, str] = {
    "attention": "layerlab.probe.probes.attention:AttentionProbe",
    "sparsity": "layerlab.probe.probes.sparsity:SparsityProbe",
    "dead": "layerlab.probe.probes.dead:DeadProbe",
    "rank": "layerlab.probe.probes.rank:RankProbe",
    "init": "layerlab.probe.probes.init:InitProbe",
    "steps": "layerlab.probe.probes.steps:StepsProbe",
    "histogram": "layerlab.probe.probes.histogram:HistogramProbe",
}


def make_probes(probes: Iterable[Any]) -> List[Any]:
    """Probe instances for ``probes`` (names, Probe instances, or callables), in order, once each."""
    from layerlab.probe.probes.base import Probe

    made: List[Any] = []
    seen = set()
    for item in probes:
        if isinstance(item, str):
            name = item.strip()
            target = BUILTIN.get(name)
            if target is None:
                raise UsageError(f"unknown probe {name!r}", where="probes", expected=" | ".join(BUILTIN),
                                 got=name, hint="a custom probe is a Python callable (module, inputs, output) -> dict")
            if name in seen:
                continue
            seen.add(name)
            module_name, _, cls = target.partition(":")
            made.append(getattr(importlib.import_module(module_name), cls)())
        elif isinstance(item, Probe):
            made.append(item)
        elif callable(item):
            from layerlab.probe.probes.custom import CallableProbe

            made.append(CallableProbe(item))
        else:
            raise UsageError("a probe must be a name, a Probe or a callable", where="probes",
                             expected="str | Probe | callable", got=type(item).__name__)
    return made
