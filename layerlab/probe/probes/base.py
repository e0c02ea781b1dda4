"""The probe protocol: small observers that ``layerlab.inspect`` runs beside its own recording.

A probe watches one run of the model (forward hooks, tensor hooks, a ``TorchFunctionMode``) and
returns a :class:`ProbeResult`: rows of numbers per module (or per parameter, or per time step),
findings, and a summary. Probes never change the model's results: they read tensors (under
``torch.no_grad`` where they compute), never write to them, and every hook they add is removed by
:class:`ProbeRun` on the way out, also when the model raises.

The life of a probe in one ``inspect`` run::

    probe.attach(run)            # before the forward: add hooks with run.forward_hook(...) etc.
    ...forward...                # (run.contexts() are entered around the forward)
    probe.after_forward(run, output)
    ...backward...
    probe.after_backward(run)    # only when backward ran
    result = probe.result(report)  # the assembled InspectReport (calls, params) is at hand

With no probes asked for, none of this runs: inspect's cost is unchanged.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple

from layerlab.errors import Problem

__all__ = ["Probe", "ProbeRow", "ProbeResult", "ProbeRun", "quiet"]


@dataclass
class ProbeRow:
    """One line of a probe's table.

    ``path`` is a module path (``""`` for the root), a parameter name, or a label such as
    ``"t=3"``; ``call`` the n-th call of that module (1-based) when the row is per call.
    ``values`` are the numbers shown as columns (``None`` where not measured); ``series`` are
    sequences (per head, per time step, per depth) shown as sparklines and kept whole in JSON.
    """

    path: str
    class_name: str = ""
    call: Optional[int] = None
    values: Dict[str, Optional[float]] = field(default_factory=dict)
    series: Dict[str, List[float]] = field(default_factory=dict)
    flags: List[str] = field(default_factory=list)


@dataclass
class ProbeResult:
    """What one probe found. ``columns`` orders the keys of the rows' ``values`` for display
    (with a readable header per key); ``findings`` are warnings or notes (:class:`Problem`) that
    also go to the report's problems/notes; ``summary`` holds run-level numbers."""

    name: str
    title: str
    columns: Dict[str, str] = field(default_factory=dict)
    rows: List[ProbeRow] = field(default_factory=list)
    findings: List[Problem] = field(default_factory=list)
    summary: Dict[str, Any] = field(default_factory=dict)
    note: Optional[str] = None

    def row(self, path: str, call: Optional[int] = None) -> ProbeRow:
        """The row for ``path`` (its ``call``-th call when given); ``KeyError`` if absent."""
        for r in self.rows:
            if r.path == path and (call is None or r.call in (None, call)):
                return r
        raise KeyError(f"probe {self.name!r} has no row {path!r}")


class ProbeRun:
    """What a probe sees of the run, and the one place its hooks are kept (and removed).

    ``module`` is the model, ``named_modules`` its ``named_modules()`` list, ``inputs`` and
    ``kwargs`` the forward arguments, ``backward`` whether a backward pass will run.
    """

    def __init__(self, module: Any, named_modules: List[Tuple[str, Any]], inputs: tuple, kwargs: dict,
                 backward: bool, seed: Optional[int]) -> None:
        self.module = module
        self.named_modules = named_modules
        self.inputs = inputs
        self.kwargs = kwargs
        self.backward = backward
        self.seed = seed
        self.path_of: Dict[int, str] = {id(m): name for name, m in named_modules}
        self._handles: List[Any] = []
        self._contexts: List[Callable[[], Any]] = []
        self._calls: Dict[int, int] = {}
        self._counted: set = set()

    def forward_hook(self, module: Any, fn: Callable, *, pre: bool = False, with_kwargs: bool = False) -> None:
        """Register a forward (pre-)hook on ``module``; it is removed when the run ends.

        An exception inside ``fn`` is layerlab's bug, not the model's: it is re-raised as
        :class:`~layerlab.probe.hooks.ProbeBug` so that inspect never blames the model for it.
        A probe's hook must return ``None`` (it observes; it never replaces inputs or outputs).
        """
        if id(module) not in self._counted:  # one counter per module, shared by every probe's hooks
            self._counted.add(id(module))
            self._handles.append(module.register_forward_pre_hook(self._count))
        register = module.register_forward_pre_hook if pre else module.register_forward_hook
        self._handles.append(register(_guarded(fn), with_kwargs=with_kwargs))

    def _count(self, module: Any, args: Any) -> None:
        self._calls[id(module)] = self._calls.get(id(module), 0) + 1

    def tensor_hook(self, tensor: Any, fn: Callable) -> None:
        """Register a gradient hook on ``tensor`` (removed when the run ends); like
        :meth:`forward_hook`, its errors are layerlab's and it must return ``None``."""
        self._handles.append(tensor.register_hook(_guarded(fn)))

    def context(self, factory: Callable[[], Any]) -> None:
        """Enter ``factory()`` (e.g. a ``TorchFunctionMode``) around the forward pass."""
        self._contexts.append(factory)

    def call_number(self, module: Any) -> int:
        """The number (1-based) of the call of ``module`` now running, as the report's
        ``CallRecord.call`` counts them. For a module hooked with :meth:`forward_hook` it is counted
        once per call whatever the number of probes and hooks (ask as often as needed); for any
        other module each ask counts one more call."""
        if id(module) in self._counted:
            return self._calls.get(id(module), 0)
        n = self._calls.get(id(module), 0) + 1
        self._calls[id(module)] = n
        return n

    @contextlib.contextmanager
    def around_forward(self):
        with contextlib.ExitStack() as stack:
            for factory in self._contexts:
                stack.enter_context(factory())
            yield

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _guarded(fn: Callable) -> Callable:
    def hook(*args: Any, **kwargs: Any) -> None:
        from layerlab.probe.hooks import ProbeBug

        try:
            fn(*args, **kwargs)
        except Exception as exc:
            raise ProbeBug(exc) from exc
        return None

    return hook


@contextlib.contextmanager
def quiet():
    """Where a probe computes: no autograd graph, and no ``TorchFunctionMode`` sees its ops (the
    op trace records the model's ops, not layerlab's; another probe's mode must not count them)."""
    import torch

    with torch.no_grad(), torch._C.DisableTorchFunction():
        yield


class Probe:
    """Base class of a probe; subclasses set ``name`` and ``title`` and override what they need."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    #: whether the probe needs the backward pass (it then says so in its result when none ran)
    needs_backward: ClassVar[bool] = False

    def attach(self, run: ProbeRun) -> None:
        """Add hooks before the forward pass."""

    def after_forward(self, run: ProbeRun, output: Any) -> None:
        """Called after a forward pass that did not raise."""

    def after_backward(self, run: ProbeRun) -> None:
        """Called after a backward pass that ran and did not raise."""

    def result(self, report: Any) -> ProbeResult:
        """The findings, given the assembled :class:`~layerlab.probe.report.InspectReport`."""
        return ProbeResult(name=self.name, title=self.title)
