"""What the user's code may do to a run besides raising an ``Exception``: exit, interrupt, never return.

One guard for every command, in the Python API (:mod:`layerlab.target.entry`) and in the CLI's
error boundary alike::

    with run_guard("train-check", timeout=30):
        ...

* ``sys.exit(3)`` (or ``raise SystemExit``) in the model's code ends the *check*, not the program:
  :class:`~layerlab.errors.CheckFailed` "the model called sys.exit(3)", ``where`` the line that
  called it (``model.py:12``), exit 1.
* ``KeyboardInterrupt`` raised by the model's code is the same kind of failure; a real Ctrl-C stays
  an interruption (the CLI exits 130). They are told apart by a SIGINT handler installed for the
  run (main thread, while Python's default handler is in place) that notes the signal before
  raising: a ``KeyboardInterrupt`` with no signal noted was raised by code.
* ``timeout``: the run stops after that many seconds with :class:`TimedOut` (exit 1) naming the step
  it was in (:func:`step`, set by the commands' loops) and the module whose code was running
  ("stopped after 30 s in train-check step 3 (forward of encoder.layer.2)"). In the main thread a
  ``SIGALRM`` timer raises inside the running Python code (it also wakes a ``time.sleep``); in
  another thread an asynchronous exception does. Either reaches a forward stuck in a Python loop;
  a single C++ kernel that never returns is out of any Python code's reach (the CLI then ends the
  process: :func:`run_guard`'s ``hard_exit``).

The guard raises inside the user's code a :class:`Deadline`, a ``BaseException``, so neither the
model's nor layerlab's own ``except Exception`` (which turns a model's exception into a finding)
swallows it. A model nested deeper than Python's recursion limit is reported as such (its
``RecursionError`` would otherwise surface wherever torch first walks the module tree).

This module sits beside :mod:`layerlab.errors` (the spec builder notes its steps here too) and
never imports torch: it reads ``sys.modules`` when it names a module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import sysconfig
import threading
import time
from typing import Any, Iterator, Optional

from layerlab.errors import CheckFailed, UsageError

__all__ = ["run_guard", "step", "watch_model", "TimedOut", "Deadline", "check_timeout", "MAX_TIMEOUT"]

#: The longest --timeout accepted: a week (a timer beyond that is a typo, and overflows some clocks).
MAX_TIMEOUT = 7 * 24 * 3600.0
#: After the deadline, how long the CLI waits for Python code to notice before it ends the process.
HARD_EXIT_GRACE_S = 10.0


class TimedOut(CheckFailed):
    """The run took longer than ``timeout`` seconds (exit 1)."""

    kind = "timeout"


class Deadline(BaseException):
    """Raised inside the running code when the time is up (a BaseException: no ``except Exception`` stops it)."""


_state = threading.local()
_latest_step: Optional[str] = None  # the last step any thread noted (what the CLI's hard exit can read)


def step(name: Optional[str]) -> Optional[str]:
    """Note the step the run is in ("step 3", "timed round 7", "backward"): a timeout names it.
    Returns the step it replaces (to put back after a phase inside another)."""
    global _latest_step
    previous = getattr(_state, "step", None)
    _state.step = _latest_step = name or None
    return previous


def watch_model(module: Any) -> None:
    """Note a model being run (the user's, or a copy a check runs): a timeout names the submodule
    whose code was running by its path. Outside a guard it is not kept (the reference would keep
    the model alive after the run); the last few are kept (a check alternates the model and copies)."""
    if not getattr(_state, "guards", 0) or module is None:
        return
    _state.model = module
    models = getattr(_state, "models", None) or []
    _state.models = [m for m in models if m is not module][-7:] + [module]


def check_timeout(value: Any, where: str = "timeout") -> Optional[float]:
    """``None`` or a number of seconds in (0, a week]; anything else is a :class:`UsageError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT \
            or value != value:
        raise UsageError("the timeout is a number of seconds > 0", where=where,
                         expected=f"0 < seconds ≤ {MAX_TIMEOUT:g} (a week)", got=value,
                         hint="--timeout 300 stops the run after five minutes")
    return float(value)


@contextlib.contextmanager
def run_guard(command: str, timeout: Optional[float] = None, *, hard_exit: bool = False) -> Iterator[None]:
    """Run the body under the rules of the module docstring; ``hard_exit`` (the CLI only): when the
    code does not stop within :data:`HARD_EXIT_GRACE_S` of the deadline, print the message and end
    the process with exit 1."""
    timeout = check_timeout(timeout)
    outer = getattr(_state, "guards", 0)
    _state.guards = outer + 1
    if not outer:
        step("while preparing the run (importing torch, building the model)")
        _state.model, _state.models = None, []
    start = time.monotonic()
    watch = _SigintWatch()
    try:
        with _sigint_noted() as watch, _time_limit(timeout, command, start, hard_exit):
            yield
    except Deadline as exc:
        if timeout is None:  # an outer guard's deadline: it reports it
            raise
        raise TimedOut(_stopped_message(command, timeout, exc), where=_where(exc),
                       hint="the code named above may loop forever or wait on something that never comes; "
                            "raise the timeout for a model that is only slow") from None
    except SystemExit as exc:
        site = _where(exc)
        if site is None or isinstance(exc.__context__, BrokenPipeError):  # not the user's code (Rich's answer
            raise                                                          # to a closed stdout): the CLI's
        raise CheckFailed(f"the model called sys.exit({exc.code!r})", where=site,
                          hint="a model must raise an exception, not exit the program") from None
    except KeyboardInterrupt as exc:
        if watch.seen or not watch.watching:
            raise  # a real Ctrl-C (or one we could not tell apart): an interruption
        raise CheckFailed("the model raised KeyboardInterrupt (no Ctrl-C was pressed)",
                          where=_where(exc), hint="a model must not raise KeyboardInterrupt") from None
    except RecursionError as exc:
        depth = _nesting(getattr(_state, "model", None))
        if depth is None or depth < 200:
            raise
        raise CheckFailed(f"the model nests submodules {depth} deep: running it needs more than Python's "
                          f"recursion limit ({sys.getrecursionlimit()}) of nested calls",
                          where=type(_state.model).__name__, expected="fewer nested submodules",
                          got=f"{depth} levels",
                          hint=f"keep the blocks in one nn.ModuleList looped over in forward instead of nesting "
                               f"each inside the previous; from Python, sys.setrecursionlimit({depth * 10}) "
                               "before the call lets it run as it is") from None
    finally:
        _state.guards = outer
        if not outer:  # the run is over: keep no reference to the model
            _state.step, _state.model, _state.models = None, None, []


def _nesting(module: Any) -> Optional[int]:
    """How deep ``module``'s submodules nest (walked without recursion)."""
    if module is None or not hasattr(module, "_modules"):
        return None
    deepest, stack, seen = 0, [(module, 0)], set()
    while stack:
        m, d = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in m._modules.values() if c is not None)
    return deepest


class _SigintWatch:
    """Whether a SIGINT handler that notes the signal was in place (``watching``), and whether it fired."""

    def __init__(self) -> None:
        self.watching = False
        self.seen = False


_sigint_watch: Optional[_SigintWatch] = None


@contextlib.contextmanager
def _sigint_noted() -> Iterator[_SigintWatch]:
    """Install a SIGINT handler that notes the signal, then raises as Python's own does (the main
    thread, while Python's default handler is in place; an outer guard's watch is shared)."""
    global _sigint_watch
    if _sigint_watch is not None:
        yield _sigint_watch
        return
    watch = _SigintWatch()
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.signal(signal.SIGINT, _on_sigint)
                watch.watching = True
        except (ValueError, OSError):  # not the main interpreter
            pass
    _sigint_watch = watch
    try:
        yield watch
    finally:
        _sigint_watch = None
        if watch.watching:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _on_sigint(signum: int, frame: Any) -> None:
    if _sigint_watch is not None:
        _sigint_watch.seen = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def _time_limit(timeout: Optional[float], command: str, start: float, hard_exit: bool) -> Iterator[None]:
    if timeout is None or getattr(_state, "deadline", None) is not None:  # none asked, or an outer one runs
        yield
        return
    _state.deadline = start + timeout
    main = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    alarm = _Alarm(command, timeout, hard_exit, threading.get_ident(), main)
    previous = None
    if main:
        previous = signal.signal(signal.SIGALRM, alarm.on_signal)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    else:
        alarm.schedule(timeout)
    if hard_exit:
        alarm.arm_hard_exit(timeout + HARD_EXIT_GRACE_S)
    try:
        yield
    finally:
        _state.deadline = None
        alarm.cancel()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


class _Alarm:
    """Raises :class:`Deadline` in the running code, never inside an import (an import cut short leaves a
    half-initialised module, torch's included: it waits until the import is done), and, for the CLI,
    ends the process when the code does not stop within :data:`HARD_EXIT_GRACE_S`."""

    def __init__(self, command: str, timeout: float, hard_exit: bool, thread_id: int, main: bool) -> None:
        self.command, self.timeout, self.hard_exit, self.thread_id, self.main = command, timeout, hard_exit, \
            thread_id, main
        self.timer: Optional[threading.Timer] = None
        self.killer: Optional[threading.Timer] = None
        self.active = True

    def on_signal(self, signum: int, frame: Any) -> None:
        if not self.active:
            return
        if _importing(frame):
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        self._fire()

    def schedule(self, seconds: float) -> None:
        self.timer = threading.Timer(seconds, self._from_thread)
        self.timer.daemon = True
        self.timer.start()

    def _from_thread(self) -> None:
        if not self.active:
            return
        if _importing(sys._current_frames().get(self.thread_id)):
            self.schedule(0.05)
            return
        self._fire()
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), ctypes.py_object(Deadline))

    def arm_hard_exit(self, seconds: float) -> None:
        """From another thread: the signal may never reach Python code (a native call, a blocked signal)."""
        self.killer = threading.Timer(seconds, lambda: _hard_exit(self.command, self.timeout, _latest_step))
        self.killer.daemon = True
        self.killer.start()

    def _fire(self) -> None:
        if self.main:
            raise Deadline()

    def cancel(self) -> None:
        self.active = False
        for timer in (self.timer, self.killer):
            if timer is not None:
                timer.cancel()


def _importing(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _hard_exit(command: str, timeout: float, where: Optional[str]) -> None:
    """The code did not stop (a C++ kernel that never returns): tell the user and end the process."""
    sys.stderr.write(f"error: stopped after {timeout:g} s in {command}" + (f" {where}" if where else "") +
                     " (inside a native call that does not return; the process was ended)\n")
    sys.stderr.flush()
    os._exit(1)


def _stopped_message(command: str, timeout: Optional[float], exc: BaseException) -> str:
    where = getattr(_state, "step", None)
    text = f"stopped after {timeout:g} s in {command}" + (f" {where}" if where else "")
    inside = _module_frame(exc)
    return text + (f" ({inside})" if inside else "")


def _module_frame(exc: BaseException) -> Optional[str]:
    """``forward of encoder.layer.2``: the innermost frame of the traceback whose ``self`` is a module
    of the watched model (by its path), or any module (by its class)."""
    nn = sys.modules.get("torch.nn")
    module_type = getattr(nn, "Module", None) if nn is not None else None
    if module_type is None:  # torch not (fully) imported: no module's code can have been running
        return None
    paths = {}
    for model in getattr(_state, "models", None) or []:
        if isinstance(model, module_type):
            try:
                paths.update({id(m): p or "(root)" for p, m in model.named_modules(remove_duplicate=False)})
            except RecursionError:
                pass
    found = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(owner, module_type) and not _ours(frame.f_code.co_filename):
            name = paths.get(id(owner), type(owner).__name__)
            found = f"{frame.f_code.co_name} of {name}" if frame.f_code.co_name == "forward" else \
                f"{name}.{frame.f_code.co_name}"
        tb = tb.tb_next
    return found


def _where(exc: BaseException) -> Optional[str]:
    """The innermost ``file:line`` of the user's code in ``exc``'s traceback; none when only layerlab,
    torch, the standard library or the CLI's libraries ran."""
    tb = exc.__traceback__
    site = None
    while tb is not None:
        if not _ours(tb.tb_frame.f_code.co_filename):
            site = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def _ours(filename: str) -> bool:
    """A frame of torch, layerlab, the standard library or the CLI's libraries (not the user's code)."""
    import layerlab

    roots = [m for m in (layerlab, *(sys.modules.get(n) for n in ("torch", "typer", "click", "rich")))
             if getattr(m, "__file__", None)]
    dirs = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in roots) + \
        tuple(p + os.sep for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p)
    return os.path.abspath(filename).startswith(dirs) or filename.startswith("<frozen")
