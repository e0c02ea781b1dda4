"""One training step's forward + backward, and what it leaves behind: the record both sides compare.

The single process (:mod:`~layerlab.distributed.single`) and every rank
(:mod:`~layerlab.distributed.worker`) run the same :func:`one_step`: seed the RNG (so dropout draws
the same masks for the same shapes on both sides), call the model — the plain module, or its
DistributedDataParallel wrapper — compute the loss, backward, then record per trainable parameter
its gradient (``None``: it got none), per buffer its value, the modules whose forward ran, and the
input and output tensors. Gradients are handed to the record and reset to ``None`` on the
parameters; hooks are removed in ``finally``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from layerlab.distributed.loss import Loss
from layerlab.distributed.report import TensorInfo
from layerlab.target.bind import Arg, flatten, input_tensors

__all__ = ["StepRecord", "one_step", "tensor_info"]


@dataclass
class StepRecord:
    """What one step left: ``grads[name]`` (``None``: no gradient), ``buffers[name]``, ``ran`` module
    paths, the input/output tensors, and the loss value. Tensors are detached, on the CPU, and the
    record's own."""

    grads: Dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    buffers: Dict[str, torch.Tensor] = field(default_factory=dict)
    ran: List[str] = field(default_factory=list)
    inputs: List[TensorInfo] = field(default_factory=list)
    outputs: List[TensorInfo] = field(default_factory=list)
    loss: float = 0.0


def tensor_info(path: str, t: torch.Tensor) -> TensorInfo:
    return TensorInfo(path, str(t.dtype).replace("torch.", ""), list(t.shape))


def one_step(module: nn.Module, args: List[Arg], loss: Loss, *, seed: int, rank: Optional[int], world: int,
             call: Optional[Callable[..., Any]] = None, before_loss: Optional[Callable[[Any], None]] = None
             ) -> StepRecord:
    """Forward ``call`` (default ``module``) on ``args``, ``loss(output, inputs, rank, world)``, backward.

    ``module`` is the plain model (its parameters, buffers and submodule names are recorded; under
    DDP pass the wrapper as ``call``). ``before_loss(output)`` sees the output first (the default
    loss learns the whole batch's shapes there).
    """
    record = StepRecord()
    ran: Dict[str, None] = {}
    handles = [m.register_forward_hook(_ran(ran, name)) for name, m in module.named_modules()]
    pos = [a.value for a in args if not a.keyword]
    kw = {a.name: a.value for a in args if a.keyword}
    devices = [p.device for p in module.parameters() if p.device.type == "cuda"][:1]
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            output = (call or module)(*pos, **kw)
            if before_loss is not None:
                before_loss(output)
            value = loss(output, {a.name: a.value for a in args}, rank, world)
            value.backward()
    finally:
        for h in handles:
            h.remove()
    record.loss = float(value.detach())
    record.ran = list(ran)
    record.inputs = [tensor_info(p, t) for p, t in input_tensors(args)]
    record.outputs = [tensor_info(p, t) for p, t in flatten(output)]
    for name, p in module.named_parameters():
        if p.requires_grad:
            record.grads[name] = None if p.grad is None else _taken(p.grad)
            p.grad = None
    record.buffers = {name: b.detach().to("cpu", copy=True) for name, b in module.named_buffers()}
    return record


def _taken(grad: torch.Tensor) -> torch.Tensor:
    """The gradient as the record keeps it: the tensor itself when it is a CPU tensor of its own (the
    parameter lets go of it right after), else a CPU copy (a GPU gradient, or a view into a bucket of
    DDP's that its next step overwrites). No copy of a 124M-parameter model's gradients per step."""
    grad = grad.detach()
    if grad.device.type == "cpu" and grad._base is None and grad.is_contiguous():
        return grad
    return grad.to("cpu", copy=True)


def _ran(seen: Dict[str, None], name: str):
    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        seen[name] = None

    return hook
