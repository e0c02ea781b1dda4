"""Sending the job to the ranks this package starts: one pickle and one file of tensor bytes.

The launcher writes the :class:`~layerlab.distributed.worker.RankJob` (the model, its state, the
batch) into its private temporary folder as two files, and each rank reads them back:

* ``job.pkl`` — the job pickled with every tensor storage replaced by a reference
  (``persistent_id``, as ``torch.save`` does): an index, its dtype, size and device;
* ``job.bin`` — the storages' bytes, one after another; a rank reads each into a storage of its own.

Why not ``torch.multiprocessing``'s pickling of the arguments, as before: it moves every storage
into shared memory and sends one file descriptor per tensor, and a fork server passes at most 256
descriptors per process (``ValueError: too many fds`` on any model with ≳ 254 parameters and
buffers: MobileViT, ResNet-50, BERT, GPT-2). The alternatives each leave something behind:

* the ``file_system`` sharing strategy is process-wide (it would change the user's own
  ``torch.multiprocessing`` setting), and its ``/dev/shm`` files outlive a rank killed mid-run;
* any shared-memory route fails on a small ``/dev/shm`` (64 MB in a default Docker container: a
  124M-parameter model is 500 MB) and makes the ranks share one copy of the weights.

A file in the launcher's folder has none of these: nothing outside that folder, which the launcher
removes when the run ends (whatever the ranks did); no descriptor per tensor; every rank gets its
own copy. Writing and reading ~500 MB costs well under a second next to a step of such a model.

The pickle is the launcher's own, read only by the ranks it starts, from a folder only this user
can open (``tempfile.mkdtemp``): the same trust as ``multiprocessing``'s pipe it replaces.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Dict, Tuple

import torch

__all__ = ["write_job", "read_job"]

PICKLE, BYTES = "job.pkl", "job.bin"


class _Writer(pickle.Pickler):
    """A pickler that sends each storage's bytes to ``data`` once and pickles a reference to them."""

    def __init__(self, file: Any, data: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.data = data
        self.offset = 0
        self.index: Dict[int, Tuple[int, int, int, str]] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.storage.TypedStorage):
            untyped, dtype = obj._untyped_storage, obj.dtype
        elif isinstance(obj, torch.UntypedStorage):
            untyped, dtype = obj, None
        else:
            return None
        key = untyped._cdata
        if key not in self.index:  # views of one storage share it in the rank too
            self.index[key] = self._write(untyped)
        return ("storage", *self.index[key], None if dtype is None else str(dtype).replace("torch.", ""))

    def _write(self, untyped: torch.UntypedStorage) -> Tuple[int, int, int, str]:
        nbytes = untyped.nbytes()
        if nbytes:
            flat = torch.empty(0, dtype=torch.uint8, device=untyped.device).set_(untyped).cpu()
            self.data.write(memoryview(flat.numpy()))
        where = (len(self.index), self.offset, nbytes, str(untyped.device))
        self.offset += nbytes
        return where


class _Reader(pickle.Unpickler):
    def __init__(self, file: Any, data: Any) -> None:
        super().__init__(file)
        self.data = data
        self.storages: Dict[int, torch.UntypedStorage] = {}

    def persistent_load(self, pid: Any) -> Any:
        kind, index, offset, nbytes, device, dtype = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unknown reference {kind!r} in the job file")
        if index not in self.storages:
            flat = torch.empty(nbytes, dtype=torch.uint8)
            if nbytes:
                self.data.seek(offset)
                self.data.readinto(memoryview(flat.numpy()))
            self.storages[index] = flat.untyped_storage() if device == "cpu" else \
                flat.to(_local(device)).untyped_storage()
        untyped = self.storages[index]
        if dtype is None:
            return untyped
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=getattr(torch, dtype), _internal=True)


def _local(device: str) -> torch.device:
    """A CUDA storage lands on this rank's GPU (``LOCAL_RANK``), as the rank's model will."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(device)


def write_job(job: Any, folder: str) -> str:
    """Write ``job`` into ``folder``; return the path a rank passes to :func:`read_job`."""
    with open(os.path.join(folder, PICKLE), "wb") as meta, open(os.path.join(folder, BYTES), "wb") as data:
        _Writer(meta, data).dump(job)
    return folder


def read_job(folder: str) -> Any:
    """The job :func:`write_job` wrote, with storages of this process's own."""
    with open(os.path.join(folder, PICKLE), "rb") as meta, open(os.path.join(folder, BYTES), "rb") as data:
        return _Reader(meta, data).load()

