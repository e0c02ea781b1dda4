"""Seeding the global RNG for one run, and putting it back afterwards.

Every command that runs the user's model with a seed (inspect and its fix verification, the
precision check's runs) draws dropout masks and random inits from torch's *global* generators,
so a run is reproducible only if they are seeded first, and the user's own RNG stream is left
alone only if they are restored after (:func:`torch.random.fork_rng`)::

    with seeded(seed, module, inputs):     # dropout masks drawn from seed; the caller's RNG kept
        output = module(*inputs)

Why not ``torch.manual_seed``: it also seeds every CUDA device through ``torch.cuda``'s lazy
call, which on a CPU-only build (or before CUDA starts) queues the seeding with a formatted stack
trace each time: ~0.1 ms, more than a small model's forward. Seeding the CPU generator and the
generators of the devices the run uses draws the very same streams there, and leaves the other
GPUs' generators untouched (they are not forked, so seeding them would change them for good).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, List, Optional, Sequence

import torch

__all__ = ["seeded", "seed_generators", "cuda_devices"]


def cuda_devices(module: Optional[torch.nn.Module], values: Iterable[Any] = ()) -> List[int]:
    """The CUDA device indices of ``module``'s parameters and of the tensors among ``values``
    (none to look for while CUDA is not initialised: no tensor can be there)."""
    if not torch.cuda.is_initialized():
        return []
    params = list(module.parameters()) if module is not None else []
    return sorted({v.device.index or 0 for v in [*params, *values]
                   if isinstance(v, torch.Tensor) and v.device.type == "cuda"})


def seed_generators(seed: int, devices: Sequence[Any] = ()) -> None:
    """Seed the CPU generator and the default generator of each CUDA device in ``devices`` (an index,
    or a ``torch.device``; ``cuda`` without an index is the current device) with ``seed``.

    Call it inside :func:`torch.random.fork_rng` over the same devices, so the caller's RNG state
    comes back afterwards (:func:`seeded` does both)."""
    torch.default_generator.manual_seed(seed)
    if devices:
        torch.cuda.init()  # a no-op once started (fork_rng over these devices has started it)
    for device in devices:
        index = device if isinstance(device, int) else torch.device(device).index
        if index is None:  # "cuda": the current device, as fork_rng forks it
            index = torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


@contextlib.contextmanager
def seeded(seed: Optional[int], module: Optional[torch.nn.Module] = None, values: Iterable[Any] = ()) -> Iterator[None]:
    """Run the body with the CPU generator, and those of the CUDA devices ``module``'s parameters and
    the tensors among ``values`` are on, seeded with ``seed``; then put them back as they were.
    ``seed=None``: the body runs on the RNG as it is, nothing forked."""
    if seed is None:
        yield
        return
    devices = cuda_devices(module, values)
    with torch.random.fork_rng(devices=devices):
        seed_generators(seed, devices)
        yield


@contextlib.contextmanager
def rng_untouched(module: Optional[torch.nn.Module] = None, values: Iterable[Any] = ()) -> Iterator[None]:
    """Run the body and put the CPU generator (and those of the CUDA devices in use) back as they
    were: a check that runs the user's dropout must not move the user's random stream."""
    with torch.random.fork_rng(devices=cuda_devices(module, values)):
        yield
