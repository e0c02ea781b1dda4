"""Joining the process group under torchrun's variables, with a port that may be taken.

When ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` are set and torchrun's agent does not
host the store (``TORCHELASTIC_USE_AGENT_STORE`` unset: the variables were exported by hand, a
notebook, a job script), rank 0 hosts the rendezvous store on ``MASTER_PORT`` itself. A port held by
another program made ``init_process_group`` raise ``DistNetworkError … EADDRINUSE`` as a traceback.

Here, before torch binds it, rank 0 tries the port with a socket of its own (the errno says "in
use", whatever torch's wording):

* one process in all (``WORLD_SIZE=1``): nobody else needs that port, so another one the OS picks
  free is used instead, and said so on stderr;
* several processes: the others will connect to ``MASTER_PORT``, so it cannot move. It is tried
  again for a few seconds (a previous run's store may be closing), then the run stops with one line
  naming the port and the fix (:class:`~layerlab.errors.UsageError`, exit 2).

Any other failure to rendezvous (a peer that never came, an address that does not resolve) is the
same one-line error with torch's first line, not a traceback. With torchrun's agent store (a real
torchrun) the ranks are clients of the agent's store and nothing here binds a port.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from datetime import timedelta

from layerlab.errors import UsageError

__all__ = ["init_group", "RETRY_S"]

#: how long rank 0 waits for a taken port to come free before it says so
RETRY_S = 5.0


def init_group(backend: str, timeout: float, rank: int, world: int) -> None:
    """``init_process_group(backend)`` from torchrun's variables (module docstring)."""
    import torch.distributed as dist

    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() not in ("true", "1")
    if hosts:
        _free_the_port(world)
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    except dist.DistError as exc:
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise UsageError(f"rank {rank} of {world} could not join the process group at {where} "
                         f"(MASTER_ADDR:MASTER_PORT): {type(exc).__name__}: {first}", where="MASTER_PORT",
                         hint="start the check with torchrun (it hosts the rendezvous), or set MASTER_PORT to a "
                              "free port on every process, or unset RANK and WORLD_SIZE so that layerlab starts "
                              "its own ranks (--nproc)") from None


def _free_the_port(world: int) -> None:
    port = _port()
    if port is None or not _in_use(port):
        return
    if world == 1:
        new = _any_free_port()
        os.environ["MASTER_PORT"] = str(new)
        sys.stderr.write(f"layerlab: MASTER_PORT {port} is in use; this single-process group rendezvouses on "
                         f"port {new} instead\n")
        return
    end = time.monotonic() + RETRY_S
    while time.monotonic() < end:
        time.sleep(0.25)
        if not _in_use(port):
            return
    raise UsageError(f"MASTER_PORT {port} is in use on this machine (another program holds it), so rank 0 cannot "
                     f"host the rendezvous of {world} processes there", where="MASTER_PORT",
                     expected="a free port", got=port,
                     hint="set MASTER_PORT to a free port on every process (or start the check with torchrun, "
                          "which picks one), or unset RANK and WORLD_SIZE so that layerlab starts its own ranks")


def _port() -> "int | None":
    try:
        port = int(os.environ.get("MASTER_PORT", ""))
    except ValueError:
        return None
    return port if 0 < port < 65536 else None


def _in_use(port: int) -> bool:
    """Whether binding ``port`` on every address fails with "address in use" (as the store would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # torch's store sets it too
        try:
            s.bind(("", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
