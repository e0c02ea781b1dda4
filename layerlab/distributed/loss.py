"""The loss every rank and the single process minimise: the default per-sample mean, or the user's.

Why a per-sample *mean*: DistributedDataParallel averages gradients over ranks. With equal shards,
the average of the ranks' means is the mean over the whole batch, so a correct DDP step gives the
gradient one process gets on the whole batch. The default loss is

    loss = Σ_outputs mean(output · w)          w ~ N(0, 1), seeded, the whole batch's output shape

where rank r multiplies its output by its own slice of ``w`` (the samples it holds). ``w`` makes
every output element matter (a plain ``mean(output)`` has zero gradient through a softmax). Outputs
that do not split with the batch (no dim is the whole batch's size / world size) are left out and
said so.

A user's loss (``ddp: loss: pkg.mod:fn``) is called as ``fn(output, inputs)`` — ``inputs`` the
forward arguments by name, the rank's shard of them on a rank — and must return a scalar. It is
resolved by import path in each process (so a function in a spec's ``./file.py`` works on every
rank), with the same ``--allow-import`` rule as a spec's layers.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from layerlab.errors import CheckFailed, SpecError
from layerlab.target.bind import flatten

__all__ = ["Loss", "MeanLoss", "UserLoss", "loss_outputs"]

Shape = Tuple[int, ...]


def loss_outputs(output: Any) -> List[Tuple[str, torch.Tensor]]:
    """The outputs a loss can reach: floating tensors that require grad."""
    return [(p, t) for p, t in flatten(output) if t.is_floating_point() and t.requires_grad]


class Loss:
    """``loss(output, inputs, rank, world)`` → a scalar tensor; ``rank=None``: the whole batch."""

    description = ""

    def expect_shard(self, output: Any, world: int) -> None:
        """Called with one shard's output (one process), before :meth:`observe`."""

    def observe(self, output: Any) -> None:
        """Called with the whole batch's output before its loss (the default loss learns its shapes)."""

    def __call__(self, output: Any, inputs: Dict[str, Any], rank: Optional[int], world: int) -> torch.Tensor:
        raise NotImplementedError


class MeanLoss(Loss):
    """The default: ``Σ mean(output · w)`` (see the module docstring).

    Which outputs split with the batch is settled once, from one shard's output shapes
    (:meth:`expect_shard`) and the whole batch's (:meth:`observe`), so the whole batch and every
    rank average the same outputs."""

    description = "mean(output · w), w ~ N(0, 1) seeded: a per-sample mean"

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.world = 1
        self.shard: Dict[str, Shape] = {}
        self.full: Dict[str, Shape] = {}
        self.dims: Dict[str, Optional[int]] = {}

    def expect_shard(self, output: Any, world: int) -> None:
        self.world = world
        # run without grad: every floating output, the whole batch's observe() picks those with grad
        self.shard = {p: tuple(t.shape) for p, t in flatten(output) if t.is_floating_point()}

    def observe(self, output: Any) -> None:
        self.full = {p: tuple(t.shape) for p, t in loss_outputs(output)}
        self.dims = {p: batch_dim(s, self.shard.get(p, ()), self.world) if self.world > 1 else 0
                     for p, s in self.full.items()}

    @property
    def left_out(self) -> List[str]:
        """Outputs the loss leaves out: they do not split with the batch."""
        return [p for p, d in self.dims.items() if d is None]

    def _weights(self, path: str) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed + sum(map(ord, path)))
        return torch.randn(self.full[path], generator=gen, dtype=torch.float64)

    def __call__(self, output: Any, inputs: Dict[str, Any], rank: Optional[int], world: int) -> torch.Tensor:
        total = None
        for path, t in loss_outputs(output):
            dim = self.dims.get(path)
            if dim is None:
                continue
            w = self._weights(path)
            if rank is not None and world > 1:
                want = list(self.full[path])
                want[dim] //= world
                if list(t.shape) != want:
                    raise CheckFailed(f"{path} is {list(t.shape)} on rank {rank}, but a 1/{world} shard of the batch "
                                      f"gives {want} in one process", where=path,
                                      hint="the model's output shape depends on the rank")
                size = t.shape[dim]
                w = w.narrow(dim, rank * size, size)
            term = (t * w.to(device=t.device, dtype=t.dtype)).mean()
            total = term if total is None else total + term
        if total is None:
            raise CheckFailed("no output splits with the batch, so the default per-sample loss has nothing to "
                              "average", hint="give the spec a loss: ddp: {loss: ./losses.py:my_loss} (fn(output, "
                              "inputs) -> scalar)")
        return total


def batch_dim(full: Shape, shard: Shape, world: int) -> Optional[int]:
    """The dim along which ``shard`` is one of ``world`` equal parts of ``full`` (the first such dim)."""
    if len(full) != len(shard):
        return None
    for d, (f, s) in enumerate(zip(full, shard)):
        if f == s * world and all(a == b for i, (a, b) in enumerate(zip(full, shard)) if i != d):
            return d
    return None


class UserLoss(Loss):
    """``fn(output, inputs)`` named by an import path (resolved in each process) or given as a callable."""

    def __init__(self, ref: Any, *, allow_import: bool = False, base_dir: Optional[str] = None,
                 where: Optional[str] = None) -> None:
        self.ref = ref
        self.allow_import = allow_import
        self.base_dir = base_dir
        self.where = where
        self._fn: Optional[Callable] = None
        self.description = ref if isinstance(ref, str) else getattr(ref, "__qualname__", repr(ref))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if isinstance(self.ref, str):
            state["_fn"] = None  # a function from ./file.py is re-imported there, never pickled
        return state

    def load(self) -> Callable:
        if self._fn is None:
            if callable(self.ref):
                self._fn = self.ref
            else:
                from layerlab.spec.resolve import resolve_callable

                self._fn = resolve_callable(self.ref, where=self.where or "ddp: loss", allow_import=self.allow_import,
                                            base_dir=self.base_dir).cls
                if isinstance(self._fn, type):
                    raise SpecError(f"ddp: loss {self.ref!r} names a class; name a function fn(output, inputs)",
                                    where=self.where)
        return self._fn

    def __call__(self, output: Any, inputs: Dict[str, Any], rank: Optional[int], world: int) -> torch.Tensor:
        value = self.load()(output, inputs)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise CheckFailed(f"the loss {self.description} returned {type(value).__name__}"
                              f"{list(value.shape) if isinstance(value, torch.Tensor) else ''}, not a scalar tensor",
                              where=self.where, hint="return one number: loss.mean(), not the per-sample losses")
        return value.reshape(())
