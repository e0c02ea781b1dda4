"""Run ``layerlab`` commands as separate processes under a memory cap and a wall-clock limit.

Two ways to start a run, the same guarantees on the way out:

* ``exec``: each run is ``python -m layerlab ARGS`` (fork + exec), exactly what a user starts.
  Start-up with torch costs 1.5–3 s, too slow for the whole corpus in CI.
* ``fork``: a server process imports torch and layerlab's CLI once, then forks one child per run;
  the child calls ``layerlab.cli.app.main(ARGS)`` the way ``python -m layerlab`` does (an escaping
  exception prints its traceback and exits 1). Nothing torch-related runs in the server before
  the fork, so the child starts from the same state as a fresh process, in milliseconds.
  ``test_hostile_specs.py`` checks that both ways give the same exit codes on a sample.

Every child runs in its own process group with ``RLIMIT_AS`` = ``cap`` bytes (torch needs
about 1 GB of address space to import and run a tiny layer), stdin from ``/dev/null``, stdout
and stderr to files, and is killed (the whole group) after ``timeout`` seconds. Its peak
resident memory comes from ``wait4``'s rusage. The server reads jobs as JSON and writes the
outcomes as JSON, so the caller (pytest, ``measure.py``) never forks a process that holds torch.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
CAP_BYTES = 3 * 2**30
TIMEOUT_S = 60.0
KEEP_BYTES = 256 * 1024  # how much of each stream an outcome carries (sizes are kept in full)
ENV = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "100", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
       "PYTHONHASHSEED": "0"}


@dataclass
class Job:
    """One command line: ``argv`` after ``layerlab``, run in ``cwd``."""

    id: str
    argv: List[str]
    cwd: str


@dataclass
class Outcome:
    id: str
    rc: Optional[int]          # exit status; None when killed by a signal
    signal: Optional[int]      # the signal that ended it (SIGKILL after a timeout or for memory)
    timed_out: bool
    seconds: float
    maxrss_kb: int             # peak resident memory of the child (wait4's ru_maxrss)
    stdout: str                # first KEEP_BYTES, decoded with errors="replace"
    stderr: str
    stdout_bytes: int
    stderr_bytes: int


def child_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LAYERLAB_DEBUG"}
    env.update(ENV)
    return env


def _child(job: Job, out_path: str, err_path: str, cap: int, mode: str) -> None:
    """In the forked child: limits, redirections, then exec or run the CLI. Never returns."""
    rc = 1
    try:
        os.setpgid(0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        os.chdir(job.cwd)
        if mode == "exec":
            os.execve(sys.executable, [sys.executable, "-m", "layerlab", *job.argv], child_env())
        rc = _run_main(job.argv)
    finally:
        os._exit(rc)


def _run_main(argv: List[str]) -> int:
    """What ``raise SystemExit(main())`` in ``python -m layerlab`` does, without the interpreter exit."""
    import traceback

    sys.argv = ["layerlab", *argv]
    try:
        from layerlab.cli.app import main

        result = main(list(argv))
        rc = result if isinstance(result, int) else (0 if result is None else 1)
    except SystemExit as exc:
        code = exc.code
        rc = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the interpreter prints any escaping exception
        traceback.print_exc()
        rc = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - the interpreter exits 120 when the final flush fails
        rc = 120
    return rc


def _read(path: str) -> tuple:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read(KEEP_BYTES)
    return data.decode("utf-8", errors="replace"), size


def run_jobs(jobs: List[Job], *, mode: str = "fork", workers: int = 2, cap: int = CAP_BYTES,
             timeout: float = TIMEOUT_S, scratch: Optional[str] = None) -> List[Outcome]:
    """Run every job (``workers`` at a time) and return their outcomes in the order given.

    Call it from a process that has not run torch (the server, or ``measure.py``): in ``fork``
    mode it imports layerlab's CLI (and torch) here, once, before forking.
    """
    import tempfile

    if mode == "fork":
        os.environ.update(ENV)
        os.environ.pop("LAYERLAB_DEBUG", None)
        import torch  # noqa: F401 - loaded once, shared copy-on-write by every child
        import layerlab.cli.app  # noqa: F401
        import layerlab.spec  # noqa: F401
    scratch = scratch or tempfile.mkdtemp(prefix="layerlab-hostile-")
    pending = list(enumerate(jobs))
    running: Dict[int, tuple] = {}
    results: Dict[int, Outcome] = {}
    while pending or running:
        while pending and len(running) < workers:
            index, job = pending.pop(0)
            out_path, err_path = f"{scratch}/{index}.out", f"{scratch}/{index}.err"
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(job, out_path, err_path, cap, mode)
            running[pid] = (index, job, time.monotonic(), out_path, err_path, False)
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for child, (index, job, start, out_path, err_path, killed) in list(running.items()):
                if not killed and now - start > timeout:
                    try:
                        os.killpg(child, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    running[child] = (index, job, start, out_path, err_path, True)
            time.sleep(0.005)
            continue
        index, job, start, out_path, err_path, killed = running.pop(pid)
        try:
            os.killpg(pid, signal.SIGKILL)  # grandchildren left behind (compile workers)
        except (ProcessLookupError, PermissionError):
            pass
        stdout, out_size = _read(out_path)
        stderr, err_size = _read(err_path)
        results[index] = Outcome(
            id=job.id, rc=os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, timed_out=killed,
            seconds=time.monotonic() - start, maxrss_kb=usage.ru_maxrss, stdout=stdout, stderr=stderr,
            stdout_bytes=out_size, stderr_bytes=err_size,
        )
        os.unlink(out_path)
        os.unlink(err_path)
    return [results[i] for i in range(len(jobs))]


def run_via_server(jobs: List[Job], *, mode: str = "fork", workers: int = 2, cap: int = CAP_BYTES,
                   timeout: float = TIMEOUT_S) -> List[Outcome]:
    """:func:`run_jobs` in a fresh server process (safe to call from a process that holds torch)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="layerlab-hostile-server-") as scratch:
        request = Path(scratch) / "jobs.json"
        reply = Path(scratch) / "outcomes.json"
        request.write_text(json.dumps({"jobs": [asdict(j) for j in jobs], "mode": mode, "workers": workers,
                                       "cap": cap, "timeout": timeout}))
        budget = timeout * len(jobs) / max(workers, 1) + 120
        subprocess.run([sys.executable, "-m", "tests.hostile.harness", str(request), str(reply)],
                       cwd=str(REPO), env=child_env(), check=True, timeout=budget)
        return [Outcome(**o) for o in json.loads(reply.read_text())]


def _serve(request: str, reply: str) -> None:
    spec = json.loads(Path(request).read_text())
    jobs = [Job(**j) for j in spec["jobs"]]
    outcomes = run_jobs(jobs, mode=spec["mode"], workers=spec["workers"], cap=spec["cap"], timeout=spec["timeout"],
                        scratch=str(Path(request).parent))
    Path(reply).write_text(json.dumps([asdict(o) for o in outcomes]))


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
