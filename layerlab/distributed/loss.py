"""The loss every rank and the single process minimise: the default per-sample mean, or the user's.

Why a per-sample *mean*: DistributedDataParallel averages gradients over ranks. With equal shards,
the average of the ranks' means is the mean over the whole batch, so a correct DDP step gives the
gradient one process gets on the whole batch. The default loss is

    loss = Σ_outputs mean(output · w)          w ~ N(0, 1), seeded, the whole batch's output shape

where rank r multiplies its output by its own slice of ``w`` (the samples it holds). ``w`` makes
every output element matter (a plain ``mean(output)`` has zero gradient through a softmax).

An output may split with the batch on several dims at once: a dual encoder's (CLIP, SigLIP)
``logits_per_image`` is (B, B) for the whole batch and (B/N, B/N) on a rank, which computes the
similarities of its own images and texts only — the block of the whole batch's matrix on the
diagonal. The loss then reads the whole batch's output block by block, as the ranks do:

    loss = 1/N · Σ_r mean(block_r(output) · block_r(w))

so DDP's average over ranks still equals one process; the pairs across shards are left out (no
rank computes them unless the model all-gathers) and the report says so. Leaving the output out
instead would cut the parameters only it reaches (``logit_scale``, ``logit_bias``) from the loss,
and they would be reported unused although every DDP step trains them.

Outputs that do not split with the batch at all (no dim is the whole batch's size / world size: a
scalar the model computed, a table shared by every sample) are left out and said so.

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
        self.dims = {p: batch_dims(s, self.shard.get(p, ()), self.world) if self.world > 1 else ()
                     for p, s in self.full.items()}

    @property
    def left_out(self) -> List[str]:
        """Outputs the loss leaves out: they do not split with the batch."""
        return [p for p, d in self.dims.items() if d is None]

    @property
    def blockwise(self) -> Dict[str, Tuple[int, ...]]:
        """Outputs read block by block on the diagonal (they split with the batch on several dims)."""
        return {p: d for p, d in self.dims.items() if d is not None and len(d) > 1}

    def _weights(self, path: str) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed + sum(map(ord, path)))
        return torch.randn(self.full[path], generator=gen, dtype=torch.float64)

    def __call__(self, output: Any, inputs: Dict[str, Any], rank: Optional[int], world: int) -> torch.Tensor:
        total = None
        for path, t in loss_outputs(output):
            dims = self.dims.get(path)
            if dims is None:
                continue
            w = self._weights(path)
            if rank is not None and world > 1:
                want = list(self.full[path])
                for d in dims:
                    want[d] //= world
                if list(t.shape) != want:
                    raise CheckFailed(f"{path} is {list(t.shape)} on rank {rank}, but a 1/{world} shard of the batch "
                                      f"gives {want} in one process", where=path,
                                      hint="the model's output shape depends on the rank")
                term = _weighted_mean(t, _block(w, dims, rank, world))  # t is the rank's block already
            elif len(dims) > 1 and world > 1:  # the whole batch, read as the ranks read it (module docstring)
                term = sum(_weighted_mean(_block(t, dims, r, world), _block(w, dims, r, world))
                           for r in range(world)) / world
            else:
                term = _weighted_mean(t, w)
            total = term if total is None else total + term
        if total is None:
            raise CheckFailed("no output splits with the batch, so the default per-sample loss has nothing to "
                              "average", hint="give the spec a loss: ddp: {loss: ./losses.py:my_loss} (fn(output, "
                              "inputs) -> scalar)")
        return total


def _weighted_mean(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (t * w.to(device=t.device, dtype=t.dtype)).mean()


def _block(t: torch.Tensor, dims: Tuple[int, ...], rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s part of a whole-batch tensor: its slice on every batch dim."""
    for d in dims:
        size = t.shape[d] // world
        t = t.narrow(d, rank * size, size)
    return t


def batch_dims(full: Shape, shard: Shape, world: int) -> Optional[Tuple[int, ...]]:
    """The dims along which ``shard`` is one of ``world`` equal parts of ``full`` (every other dim the
    same size); ``None`` when there is none, or a dim that neither splits nor stays."""
    if len(full) != len(shard):
        return None
    dims = []
    for d, (f, s) in enumerate(zip(full, shard)):
        if f == s * world and f != s:
            dims.append(d)
        elif f != s:
            return None
    return tuple(dims) or None


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
