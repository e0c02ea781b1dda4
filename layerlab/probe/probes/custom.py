"""Custom probes: a function ``(module, inputs, output) -> {name: number}`` run on module calls.

    >>> import torch, layerlab
    >>> def mean_abs(module, inputs, output):
    ...     return {"mean |out|": output.abs().mean()}
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    >>> report = layerlab.inspect(model, torch.randn(2, 4), probes=[mean_abs])
    >>> sorted(r.path for r in report.probe("mean_abs").rows)
    ['', '0', '1']

The function runs after each call of every module of the model (or, with ``modules="encoder.*"``,
of those whose path matches the glob; ``""`` is the root), under ``torch.no_grad`` and outside
any ``TorchFunctionMode``. It must only read: ``output`` is the module's real output, and writing
to it would change the model's results. Each value may be a Python number, a bool or a one-element
tensor (kept as a float); ``None`` means "not measured here", and returning ``None`` instead of a
dict skips the call. Anything else, or an exception, stops the run with an error that names the
probe and the module path: the probe is the user's code, not the model.
"""

from __future__ import annotations

import fnmatch
import numbers
from typing import Any, Callable, Dict, List, Optional

from layerlab.errors import UsageError
from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow, ProbeRun, quiet

__all__ = ["CallableProbe"]


def _callable_name(fn: Callable) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return name.replace(".<locals>.", ".")


class CallableProbe(Probe):
    """A probe made of a plain function (see the module docstring).

    Args:
        fn (callable): ``fn(module, inputs, output) -> dict of numbers`` (or ``None``).
        modules (str, optional): a glob over module paths (``"encoder.*"``, ``"*.attn"``); the
            root's path is ``""``. Default: every module.
        name (str, optional): the probe's name in the report. Default: the function's name.
    """

    title = ""

    def __init__(self, fn: Callable, modules: Optional[str] = None, name: Optional[str] = None) -> None:
        if not callable(fn):
            raise UsageError("a custom probe must be callable", where="probes", expected="(module, inputs, output) -> dict",
                             got=type(fn).__name__)
        if modules is not None and not isinstance(modules, str):
            raise UsageError("modules: is one glob over module paths", where="probes", expected='a string such as "encoder.*"',
                             got=type(modules).__name__)
        self.fn = fn
        self.modules = modules
        self.name = name or _callable_name(fn)
        self.title = f"Custom probe {self.name}" + (f" on {modules}" if modules else "")
        self.rows: List[ProbeRow] = []
        self.columns: Dict[str, str] = {}

    def attach(self, run: ProbeRun) -> None:
        matched = [(p, m) for p, m in run.named_modules if self.modules is None or fnmatch.fnmatchcase(p, self.modules)]
        if not matched:
            paths = [p for p, _ in run.named_modules if p][:6]
            raise UsageError(f"custom probe {self.name!r}: no module path matches {self.modules!r}",
                             where="probes", got=self.modules,
                             hint="module paths look like " + (", ".join(paths) if paths else "'' (the root only)"))
        for path, module in matched:
            run.forward_hook(module, self._hook(run, path))

    def _hook(self, run: ProbeRun, path: str):
        def hook(module, inputs, output):
            call = run.call_number(module)
            where = f"{path or '(root)'} ({type(module).__name__})"
            try:
                with quiet():
                    got = self.fn(module, inputs, output)
            except Exception as exc:
                raise UsageError(
                    f"custom probe {self.name!r} raised {type(exc).__name__} on module {where}: {exc}",
                    where=path or "(root)",
                    hint="the probe is your code, not the model: fix it, or limit it with modules: to the "
                         "modules it understands") from None
            values = self._numbers(got, where, path)
            if values is None:
                return
            for k in values:
                self.columns.setdefault(k, k)
            self.rows.append(ProbeRow(path=path, class_name=type(module).__name__, call=call, values=values))
        return hook

    def _numbers(self, got: Any, where: str, path: str) -> Optional[Dict[str, Optional[float]]]:
        if got is None:
            return None
        if not isinstance(got, dict):
            raise UsageError(f"custom probe {self.name!r} returned {type(got).__name__} on module {where}",
                             where=path or "(root)", expected="a dict {name: number} (or None to skip the call)",
                             got=type(got).__name__)
        values: Dict[str, Optional[float]] = {}
        for key, value in got.items():
            number = _number(value)
            if number is _BAD:
                shown = type(value).__name__
                shape = getattr(value, "shape", None)
                raise UsageError(
                    f"custom probe {self.name!r} returned a non-number for {key!r} on module {where}",
                    where=path or "(root)", expected="an int, float, bool, one-element tensor or None",
                    got=f"{shown} of shape {tuple(shape)}" if shape is not None else shown,
                    hint="reduce it to one number (.mean(), .norm(), .item())")
            values[str(key)] = number
        return values

    def result(self, report: Any) -> ProbeResult:
        return ProbeResult(name=self.name, title=self.title, columns=dict(self.columns), rows=self.rows,
                           summary={"modules": self.modules or "*"},
                           note=None if self.rows else "the probe returned nothing on any module call")


_BAD = object()


def _number(value: Any):
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    numel = getattr(value, "numel", None)
    if callable(numel) and hasattr(value, "item"):
        try:
            if value.numel() == 1 and not value.is_complex():
                return float(value.item())
        except Exception:
            return _BAD
        return _BAD
    if hasattr(value, "item") and getattr(value, "size", None) == 1:  # a numpy scalar or 1-element array
        try:
            return float(value.item())
        except (TypeError, ValueError):
            return _BAD
    return _BAD
