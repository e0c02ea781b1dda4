"""Result objects of ``layerlab ddp-check``: plain dataclasses, no formatting (see cli/render_ddp).

One report says, for N ranks of DistributedDataParallel against one process on the whole batch:
what each rank ran on and produced (:class:`RankRow`), what happened to each trainable parameter's
gradient (:class:`ParamRow`) and to each buffer (:class:`BufferRow`), and the findings with their
likely cause and fix (:class:`Finding`). Gradient differences are absolute, in the gradient's own
units; ``tolerance`` says what counted as equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from layerlab.report_render import Displayable

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1

#: the checks a finding belongs to, in the issue's order
CHECKS = ("gradients", "unused", "buffers", "shapes", "ranks")


@dataclass
class Finding:
    """One thing found, with what it means for DDP training.

    Attributes:
        check: ``gradients`` | ``unused`` | ``buffers`` | ``shapes`` | ``ranks``.
        severity: ``error`` (the DDP step is wrong, raises or hangs: exit 1), ``warning`` (DDP runs
            but differs from one process in a way users often accept, e.g. per-rank BatchNorm), ``info``.
        title: a few words (``BatchNorm without SyncBatchNorm``); ``message``: what was seen, in numbers.
        where: the parameters, buffers, modules or ranks concerned.
        cause: why, as far as the evidence goes (``None``: seen, cause unknown — said so in the message).
        fix: what to change.
    """

    check: str
    severity: str
    title: str
    message: str
    where: List[str] = field(default_factory=list)
    cause: Optional[str] = None
    fix: Optional[str] = None


@dataclass
class TensorInfo:
    """A tensor as the shapes table shows it: its path, dtype and shape."""

    path: str
    dtype: str
    shape: List[int]


@dataclass
class RankRow:
    """One rank (``rank = -1``: the single process on the whole batch).

    Attributes:
        status: ``ok``, ``raised`` (its exception ended it), ``hung`` (still running when the
            others finished or the deadline passed: stopped), ``killed`` (died by a signal or exit code
            without a Python exception), ``not started``.
        inputs, outputs: the tensors it was called with and returned (DDP step).
        ran: module paths whose forward ran on this rank.
        unused: trainable parameters that got no gradient on this rank (its own step, before DDP).
        seconds: the rank's wall time from start to its result.
        error: the exception's last line (``RuntimeError: …``); ``frames``: ``file:line in function``
            of the user-code frames, innermost last (for a hung rank: where it was when stopped).
    """

    rank: int
    status: str
    inputs: List[TensorInfo] = field(default_factory=list)
    outputs: List[TensorInfo] = field(default_factory=list)
    ran: List[str] = field(default_factory=list)
    unused: List[str] = field(default_factory=list)
    seconds: float = 0.0
    error: Optional[str] = None
    frames: List[str] = field(default_factory=list)


@dataclass
class ParamRow:
    """One trainable parameter's gradient.

    Attributes:
        name: qualified name (``head.weight``); ``shape``.
        unused_on: ranks where it got no gradient in the rank's own step.
        ranks_diff: max |grad_r − grad_0| over ranks after DDP's all-reduce (0 when identical).
        single_diff: max |grad_DDP − grad_single| (rank 0's gradient against one process on the
            whole batch); ``single_scale``: max |grad_single|, for reading it (``None``: one process
            gives it no gradient at all).
        status: ``ok``, ``ranks differ``, ``differs from single``, ``unused``, ``no result``.
    """

    name: str
    shape: List[int]
    unused_on: List[int] = field(default_factory=list)
    ranks_diff: Optional[float] = None
    single_diff: Optional[float] = None
    single_scale: Optional[float] = None
    status: str = "ok"


@dataclass
class BufferRow:
    """One buffer: which ranks changed it in their own step, whether those updates agree
    (``ranks_diff``: max |b_r − b_0|), and whether the ranks still differ after DDP's step
    (``after_diff``; with broadcast_buffers=True DDP hands rank 0's value to every rank)."""

    name: str
    shape: List[int]
    changed_on: List[int] = field(default_factory=list)
    ranks_diff: Optional[float] = None
    after_diff: Optional[float] = None
    status: str = "ok"


@dataclass(repr=False)
class DdpReport(Displayable):
    """``layerlab.ddp_check``'s result; ``ok`` is False when a finding is an error. ``print(report)``
    shows the CLI's tables (:func:`layerlab.render`).

    Attributes:
        target, model: what was checked (spec path / class path).
        world_size, backend, device: the run (``gloo`` on CPU, ``nccl`` on CUDA).
        launcher: ``layerlab`` (it started the ranks) or ``torchrun`` (each process was one rank).
        batch: the whole batch's size; ``batch_dims``: input path → its batch dim (``None``: shared).
        loss: how the loss was made (``mean of output·w``, or the spec's ``ddp: loss:``).
        options: DDP's options as run (``find_unused_parameters``, ``broadcast_buffers``) and the
            collective ``timeout_s``.
        tolerance: ``{"rtol", "atol"}`` of the gradient comparison (atol relative to the largest
            single-process gradient of the parameter).
        seconds: ``{"single", "ranks", "total"}`` wall times.
    """

    target: str
    model: str
    world_size: int
    backend: str
    device: str
    launcher: str
    batch: int
    batch_dims: Dict[str, Optional[int]]
    loss: str
    options: Dict[str, Any]
    tolerance: Dict[str, float]
    ranks: List[RankRow] = field(default_factory=list)
    params: List[ParamRow] = field(default_factory=list)
    buffers: List[BufferRow] = field(default_factory=list)
    findings: List[Finding] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    seconds: Dict[str, float] = field(default_factory=dict)
    #: per-rank raw results (``--ranks-json``): norms and sums, never whole tensors
    raw: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def finding(self, title: str) -> Finding:
        """The first finding with this title (``KeyError`` if none)."""
        for f in self.findings:
            if f.title == title:
                return f
        raise KeyError(f"no finding {title!r}; there are {[f.title for f in self.findings]}")

    def titles(self) -> List[str]:
        return [f.title for f in self.findings]

    def param(self, name: str) -> ParamRow:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"no parameter {name!r}")

    def to_dict(self) -> dict:
        from layerlab.serialize import to_jsonable

        return {
            "schema": SCHEMA_VERSION,
            "kind": "ddp-check-report",
            "ok": self.ok,
            "target": self.target,
            "model": self.model,
            "world_size": self.world_size,
            "backend": self.backend,
            "device": self.device,
            "launcher": self.launcher,
            "batch": self.batch,
            "batch_dims": dict(self.batch_dims),
            "loss": self.loss,
            "options": to_jsonable(self.options),
            "tolerance": dict(self.tolerance),
            "findings": to_jsonable(self.findings),
            "ranks": to_jsonable(self.ranks),
            "params": to_jsonable(self.params),
            "buffers": to_jsonable(self.buffers),
            "notes": list(self.notes),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }
