"""The single-process side: the step DDP should reproduce, and the same step on each shard alone.

Three kinds of run, each on a fresh copy of the model in its initial state (the user's module is
never touched):

* the whole batch in one process: the gradient a correct DDP step equals (``full``);
* each rank's shard in one process (``shards[r]``): what rank r *should* compute on its own. A rank
  whose own gradient differs from this does something rank-dependent (the rank's id in its control
  flow, a loss scaled per rank); when every rank matches but their average misses ``full``, the
  samples interact across the batch (BatchNorm statistics, a summed loss, dropout);
* shard 0 again with another seed (``stochastic``): whether the step draws random numbers at all.

Before them, one shard's forward (no grad) tells the default loss which outputs split with the batch
(its output shapes are kept: :attr:`SingleRuns.shard_outputs`).

The whole batch runs at once; the shard runs and the seed probe run only when a finding asks for
them (:attr:`SingleRuns.shards`, :attr:`SingleRuns.stochastic`): they explain a difference, and on a
healthy step there is none to explain. On GPT-2 124M that is three forward + backward passes and
three copies of the model less on the way to a verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from layerlab.distributed.loss import Loss
from layerlab.distributed.shard import BatchPlan, shard_args
from layerlab.distributed.report import TensorInfo
from layerlab.distributed.step import StepRecord, one_step, tensor_info
from layerlab.errors import CheckFailed
from layerlab.target.bind import Arg, flatten
from layerlab.target.copying import copy_model

__all__ = ["SingleRuns", "run_single"]


@dataclass
class SingleRuns:
    """``full``: the whole batch; ``shard_outputs``: one shard's outputs (no grad); ``shards`` and
    ``stochastic`` are run on first use (module docstring), from ``pristine``, the initial state."""

    full: StepRecord
    shard_outputs: List[TensorInfo] = field(default_factory=list)
    seconds: float = 0.0
    pristine: Any = None
    args: List[Arg] = field(default_factory=list)
    plan: Any = None
    loss: Any = None
    seed: int = 0
    _shards: Optional[List[StepRecord]] = None
    _stochastic: Optional[bool] = None

    @property
    def shards(self) -> List[StepRecord]:
        """One process on each rank's shard alone."""
        if self._shards is None:
            t0 = time.perf_counter()
            world = self.plan.world
            shards = []
            for r in range(world):
                with _blame(f"on shard {r} of {world}"):
                    shards.append(one_step(copy_model(self.pristine), shard_args(self.args, self.plan, r), self.loss,
                                           seed=self.seed, rank=r, world=world))
            self._shards = shards
            self.seconds += time.perf_counter() - t0
        return self._shards

    @property
    def stochastic(self) -> bool:
        """Whether shard 0 with another seed gives another gradient (the step draws random numbers)."""
        if self._stochastic is None:
            first = self.shards[0]
            t0 = time.perf_counter()
            with _blame("on shard 0 with another seed"):
                again = one_step(copy_model(self.pristine), shard_args(self.args, self.plan, 0), self.loss,
                                 seed=self.seed + 1, rank=0, world=self.plan.world)
            self._stochastic = any(not _same(again.grads[k], first.grads[k]) for k in again.grads)
            self.seconds += time.perf_counter() - t0
        return self._stochastic


def run_single(module: torch.nn.Module, args: List[Arg], plan: BatchPlan, loss: Loss, *, seed: int) -> SingleRuns:
    """The runs above; a model that raises in them is a :class:`~layerlab.errors.CheckFailed` (exit 1)."""
    t0 = time.perf_counter()
    world = plan.world
    pristine = module  # never run itself: every run takes a copy (the caller keeps it unchanged until the report)
    first = shard_args(args, plan, 0)
    with _blame("on one shard (no grad)"), torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        output = copy_model(pristine)(*[a.value for a in first if not a.keyword],
                                      **{a.name: a.value for a in first if a.keyword})
        loss.expect_shard(output, world)
        shard_outputs = [tensor_info(p, t) for p, t in flatten(output)]
        del output
    whole = copy_model(pristine)
    known = _tensor_names(whole)
    with _blame("on the whole batch"):
        full = one_step(whole, args, loss, seed=seed, rank=None, world=world, before_loss=loss.observe)
    _refuse_created_in_forward(whole, known)
    return SingleRuns(full=full, shard_outputs=shard_outputs, seconds=time.perf_counter() - t0, pristine=pristine,
                      args=args, plan=plan, loss=loss, seed=seed)


def _tensor_names(module: torch.nn.Module) -> Dict[str, str]:
    """Every registered parameter's and buffer's name → which of the two it is."""
    return {**{n: "buffer" for n, _ in module.named_buffers()}, **{n: "parameter" for n, _ in module.named_parameters()}}


def _refuse_created_in_forward(module: torch.nn.Module, known: Dict[str, str]) -> None:
    """A parameter (or buffer) the forward registers did not exist when DDP was built: DDP never
    all-reduces its gradient (each rank keeps its own, so the ranks drift apart) nor broadcasts it, and an
    optimizer built before the first step never updates it. Checking the DDP step further would wrap a
    model that already has it, and so hide the bug: stop here with the names."""
    created = {n: kind for n, kind in _tensor_names(module).items() if n not in known}
    if not created:
        return
    names = list(created)
    shown = ", ".join(f"{n} ({created[n]})" for n in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4
                                                                  else "")
    kinds = set(created.values())
    missed = " and ".join(([] if "parameter" not in kinds else ["never all-reduces their gradients (every rank "
                                                                "keeps its own and the replicas drift apart)"]) +
                          ([] if "buffer" not in kinds else ["never broadcasts the buffers"]))
    raise CheckFailed(f"the forward registers new tensors: {shown}. DistributedDataParallel only knows the "
                      f"parameters and buffers that exist when it wraps the model, so it {missed}"
                      + (", and an optimizer built before the first step never updates them" if "parameter" in kinds
                         else ""),
                      where=names[0],
                      hint="create them in __init__ (nn.Parameter / register_buffer with their final shape), or "
                           "use a Lazy module and run one forward on a dummy batch before wrapping the model in DDP")


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)


class _blame:
    """The model raising in a single-process run: exit 1 with its message, not a traceback."""

    def __init__(self, when: str) -> None:
        self.when = when

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, CheckFailed) or not isinstance(exc, Exception):
            return False
        from layerlab.distributed.worker import summarize_exception

        error, frames = summarize_exception(exc)
        if "process group has not been initialized" in error:  # torch.distributed's words for "no group"
            raise CheckFailed(f"the model calls torch.distributed in its forward (dist.get_rank() or a collective) "
                              f"without a process group, so one process cannot run it {self.when}, and there is "
                              f"no single-process step to compare DDP's with: {error}",
                              where=frames[-1] if frames else None,
                              hint="guard it (dist.get_rank() if dist.is_initialized() else 0): then ddp-check "
                                   "runs and shows whether the rank changes what the model computes") from None
        if "can only change requires_grad flags of leaf variables" in error:  # the input's flag, not the model
            raise CheckFailed(f"the model or the loss raised in one process {self.when}: {error}",
                              where=frames[-1] if frames else None,
                              hint="the model sets requires_grad on a tensor it makes from an input that requires "
                                   "grad here (a floating spec input does by default; in training it would not): "
                                   "give that input requires_grad: false") from None
        raise CheckFailed(f"the model or the loss raised in one process {self.when}: {error}",
                          where=frames[-1] if frames else None,
                          hint="the same step would raise in training; the frame above is where") from None
