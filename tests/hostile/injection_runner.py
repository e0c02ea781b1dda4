"""Run layerlab command lines on a pipe and on a pseudo-terminal, torch imported once.

``python tests/hostile/injection_runner.py JOBS.json RESULTS.json`` (the ``layerlab`` imported is
the one on ``PYTHONPATH``, so the same jobs measure another checkout): the server imports torch and
layerlab's CLI, then forks one child per job. The child puts its stdout and stderr on pipes
(``"tty": false``) or on the slave side of a pty (``"tty": true``: ``isatty()`` is true, Rich
colours and draws as on a terminal; stdout and stderr are one stream there), sets the job's
environment and runs ``layerlab.cli.app.main(argv)`` — or, for ``"python"`` jobs, runs that code —
as ``python -m layerlab`` would (``"save_stdout"``: its stdout is also kept in that file, for a later
job). The parent reads what comes out and kills a child (its whole
process group) after ``timeout`` seconds, so nothing hangs. Results carry the raw bytes (latin-1
decoded, so every byte survives JSON) and the exit code.

Nothing torch-related runs in the server before a fork: the child starts from a fresh import.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback

TIMEOUT_S = 120.0


def _child(job: dict, out_fd: int, err_fd: int) -> None:
    if not job.get("tty"):  # its own process group, killed whole after a timeout (a pty child has one already)
        os.setsid()
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.chdir(job["cwd"])
    os.environ.update(job.get("env", {}))
    for key in job.get("unset", []):
        os.environ.pop(key, None)
    sys.argv = ["layerlab", *job.get("argv", [])]
    code = 1
    try:
        if "python" in job:
            exec(compile(job["python"], "<job>", "exec"), {"__name__": "__main__"})
            code = 0
        else:
            from layerlab.cli.app import main

            code = main(job["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # what python -m layerlab shows for an escaping exception
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # the interpreter's own last flush would fail the same way: say so, as it would
            if stream is sys.stdout:
                os.write(2, b"Exception ignored on flushing sys.stdout\n")
            code = 120
    os._exit(code)


def _read_all(fds: list, pid: int, timeout: float) -> tuple:
    chunks = {fd: [] for fd in fds}
    open_fds = list(fds)
    deadline = time.monotonic() + timeout
    status = None
    timed_out = False
    while True:
        if open_fds:
            ready, _, _ = select.select(open_fds, [], [], 0.2)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the pty's slave side is closed
                    data = b""
                if data:
                    chunks[fd].append(data)
                else:
                    open_fds.remove(fd)
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                deadline = min(deadline, time.monotonic() + 2.0)  # drain what is left, briefly
        if status is not None and not open_fds:
            break
        if time.monotonic() > deadline:
            if status is None:
                timed_out = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
            break
    return {fd: b"".join(c) for fd, c in chunks.items()}, status, timed_out


def run(job: dict) -> dict:
    start = time.monotonic()
    if job.get("tty"):
        import termios
        import struct
        import fcntl

        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 1000, 0, 0))
        pid = os.fork()
        if pid == 0:
            os.close(master)
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            _child({**job, "tty": True}, slave, slave)
        os.close(slave)
        data, status, timed_out = _read_all([master], pid, job.get("timeout", TIMEOUT_S))
        os.close(master)
        out, err = data[master], b""
    else:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(err_r)
            _child(job, out_w, err_w)
        os.close(out_w)
        os.close(err_w)
        data, status, timed_out = _read_all([out_r, err_r], pid, job.get("timeout", TIMEOUT_S))
        os.close(out_r)
        os.close(err_r)
        out, err = data[out_r], data[err_r]
    rc = os.waitstatus_to_exitcode(status) if status is not None else None
    if job.get("save_stdout"):  # a later job reads it (diff's JSON reports)
        with open(os.path.join(job["cwd"], job["save_stdout"]), "wb") as f:
            f.write(out)
    return {"id": job["id"], "rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - start, 2),
            "stdout": out.decode("latin-1"), "stderr": err.decode("latin-1")}


def main(argv: list) -> int:
    jobs = json.loads(open(argv[0], encoding="utf-8").read())
    import torch  # noqa: F401 - once, before the forks
    import layerlab.cli.app  # noqa: F401

    results = [run(job) for job in jobs]
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
