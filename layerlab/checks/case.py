"""The thing being verified, and the small tensor helpers every check shares.

A :class:`Case` is a module, its inputs (each named, passed by position or by keyword), the claims
it makes (``causal``, ``recurrent``, ``mixes_batch``, ``stochastic``), and the reference it should
equal, already carrying the module's weights (see :mod:`layerlab.checks.reference`).

A Case is the checks' view of a :class:`~layerlab.target.Target`, with the reference aligned
(:func:`layerlab.checks.run.verify_args` makes one from a Target's fields): the arguments
(:class:`~layerlab.target.bind.Arg`) and the tensor walk are the Target's, from :mod:`layerlab.target.bind`.

Checks never touch ``case.module`` itself: they work on copies (:func:`module_copy`), so running
``layerlab gradcheck`` leaves the user's module, its mode and its buffers as they were.

Legend: B batch · T time (sequence position) · E features.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks import layout
# re-exported: deploy and profiling import them from here
from layerlab.checks.layout import STATE_NAMES, has_batch_first, is_mask_name, seq_first  # noqa: F401
# the thing under test is the Target's; the checks' names for it are kept so checks read as before
from layerlab.target.bind import (Arg, accepts, call, class_path, flatten, forward_params,  # noqa: F401
                                  input_tensors, map_args, map_tensors, positional_names)
from layerlab.target.copying import copy_model

#: argument names a loss module's target goes by: data to compare with, never differentiated
TARGET_NAMES = ("target", "targets", "label", "labels", "y")


@dataclass
class Case:
    """A module with inputs, claims and (optionally) an aligned reference.

    Attributes:
        module: the layer under test (never modified by a check).
        args: the forward arguments, in order.
        target: what the user named (registry name, spec path, class name).
        reference: an ``nn.Module`` carrying ``module``'s weights, a plain callable, or ``None``.
        param_map: our parameter name → the reference's, for per-parameter gradient parity.
        reference_note: how the weights were copied (shown in reports).
        reference_error: why no reference could be aligned (parity checks then fail with it).
        reference_auto: how an automatic reference was built (:mod:`layerlab.checks.auto_reference`).
        tags: claims the checks rely on: ``causal``, ``recurrent``, ``mixes_batch``, ``stochastic``.
        seed: seeds every random tensor a check draws (grad_outputs, directions, perturbations).
        batch_dims: input name → its batch dim (``None``: no batch dim); overrides the guess.
    """

    module: nn.Module
    args: List[Arg]
    target: str
    reference: Any = None
    param_map: Dict[str, str] = field(default_factory=dict)
    reference_note: str = ""
    reference_error: Optional[str] = None
    reference_auto: str = ""  # how layerlab built the reference itself (empty: the user named it)
    reference_suspect: str = ""  # no reference, but building one showed something wrong (parity warns)
    tags: FrozenSet[str] = frozenset()
    seed: int = 0
    batch_dims: Dict[str, Optional[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.args = grad_selection(self.module, self.args)


def grad_selection(module: nn.Module, args: Sequence[Arg]) -> List[Arg]:
    """``args`` with ``no_grad`` decided: which floating inputs the checks may differentiate and perturb.

    When the caller marked inputs with ``requires_grad`` (any one), exactly those are checked, as
    torch's own module tests do (a loss target, a label, an index is passed without it). Otherwise
    every floating non-mask input is, except a loss module's target (``target``, ``label(s)``,
    ``y``): a BCE target nudged outside [0, 1] raises, and most losses are not differentiable in it.
    Already decided arguments (copies of a case's own) are kept as they are.
    """
    if any(a.no_grad is not None for a in args):
        return list(args)
    floating = {a.name: [(p, t) for p, t in flatten(a.value, a.name) if t.is_floating_point()] for a in args}
    flagged = any(t.requires_grad for ts in floating.values() for _, t in ts)
    loss = isinstance(module, nn.modules.loss._Loss)

    def frozen(a: Arg) -> FrozenSet[str]:
        if flagged:
            return frozenset(p for p, t in floating[a.name] if not t.requires_grad)
        if loss and a.name.lower() in TARGET_NAMES:
            return frozenset(p for p, _ in floating[a.name])
        return frozenset()

    return [Arg(a.name, a.value, a.keyword, frozen(a)) for a in args]


# -- tensors ---------------------------------------------------------------------------------------

def cast_args(args: Sequence[Arg], dtype: Optional[torch.dtype], requires_grad: bool = False) -> List[Arg]:
    """Detached copies; floating tensors cast to ``dtype`` (``None`` keeps it). Differentiable
    inputs (:func:`grad_inputs`) get ``requires_grad`` when asked."""
    grad_ids = {id(t) for _, t in grad_inputs(args)}

    def conv(t: Tensor) -> Tensor:
        out = t.detach()
        if out.is_floating_point() and dtype is not None:
            out = out.to(dtype)
        out = out.clone()
        if requires_grad and id(t) in grad_ids:
            out.requires_grad_(True)
        return out

    return map_args(args, conv)


def grad_inputs(args: Sequence[Arg]) -> List[Tuple[str, Tensor]]:
    """``(name, tensor)`` of every differentiable input tensor (nested state tuples flattened),
    each distinct tensor once: floating, not a mask, not frozen by :func:`grad_selection`."""
    out, seen = [], set()
    for a in args:
        if is_mask_name(a.name):
            continue
        frozen = a.no_grad or frozenset()
        for path, t in flatten(a.value, a.name):
            if t.is_floating_point() and id(t) not in seen and path not in frozen:
                seen.add(id(t))
                out.append((path, t))
    return out


def float_leaves(output: Any) -> List[Tuple[str, Tensor]]:
    return [(p, t) for p, t in flatten(output) if t.is_floating_point()]


class ComplexState(Exception):
    """The layer holds complex parameters or buffers: a cast to a real dtype would drop their imaginary
    parts (``nn.Module.to`` does, with a warning), so a check on the copy would check another layer."""

    def __init__(self, names: List[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


def module_copy(module: nn.Module, dtype: Optional[torch.dtype] = None, train: Optional[bool] = None) -> nn.Module:
    """A deep copy, cast to ``dtype`` (floating parameters and buffers only) and set to train/eval.

    Raises :class:`ComplexState` when ``dtype`` is real and the layer holds complex tensors."""
    if dtype is not None and not dtype.is_complex:
        held = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_complex()]
        if held:
            raise ComplexState(held)
    m = copy_model(module)
    if dtype is not None:
        m = m.to(dtype)
    if train is not None:
        m.train(train)
    return m


def reference_copy(ref: Any, dtype: Optional[torch.dtype] = None, train: Optional[bool] = None) -> Any:
    return module_copy(ref, dtype, train) if isinstance(ref, nn.Module) else ref


def trainable(module: nn.Module) -> List[Tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def user_dtype(case: Case) -> torch.dtype:
    """The dtype the user runs in: the first floating input's, else the first floating parameter's."""
    for a in case.args:
        for _, t in flatten(a.value):
            if t.is_floating_point():
                return t.dtype
    for p in case.module.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.get_default_dtype()


def seed_for(seed: int, salt: int = 0) -> int:
    """The case seed and a per-check salt as one seed in ``manual_seed``'s range: any Python int
    works (``seed * 7919`` alone overflows a 64-bit seed for seeds from about 1.2e15 on); seeds
    below that give the values they always gave."""
    return (int(seed) * 7919 + int(salt)) % (2 ** 63)


def generator(seed: int, salt: int = 0) -> torch.Generator:
    """A CPU generator seeded from the case seed and a per-check salt: no global RNG state touched."""
    return torch.Generator().manual_seed(seed_for(seed, salt))


def randn_like(t: Tensor, gen: torch.Generator) -> Tensor:
    """Standard normal values shaped like ``t`` (drawn on the CPU generator, then moved to ``t``'s device)."""
    return torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device)


def rand_like(t: Tensor, gen: torch.Generator) -> Tensor:
    """Uniform [0, 1) values shaped like ``t`` (CPU generator, moved to ``t``'s device)."""
    return torch.rand(t.shape, generator=gen, dtype=t.dtype).to(t.device)


def is_stochastic(module: nn.Module, tags: FrozenSet[str] = frozenset(), reference: Any = None) -> bool:
    """True when train-mode forward draws random numbers (dropout with p > 0, or a ``stochastic`` tag).

    Besides torch's dropout modules, a float attribute > 0 whose name says "drop" is a rate the
    forward draws against: ``dropout``/``attention_dropout`` passed to ``F.dropout``, stochastic
    depth (Hugging Face's ``SwinDropPath.drop_prob``, timm's ``DropPath``), ``layerdrop``. A layer
    whose ``reference`` is (or holds) torch dropout with p > 0 claims to be dropout whatever its
    rate is called (a hand-written dropout's ``self.p``). The remaining case, a random train-mode
    forward that none of these names, is found by probing (:mod:`layerlab.checks.repeatable`)."""
    if "stochastic" in tags:
        return True
    if isinstance(reference, nn.Module) and any(
            isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in reference.modules()):
        return True
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        for name, p in vars(m).items():
            if "drop" in name and isinstance(p, float) and p > 0:
                return True
    return False


def parity_mode(case: Case) -> Optional[bool]:
    """The mode comparisons run in: ``None`` keeps every submodule's own train/eval flag; ``False``
    (eval) when a train-mode forward would draw random numbers (dropout), which no reference repeats."""
    return False if case.module.training and is_stochastic(case.module, case.tags, case.reference) else None


def mode_name(case: Case, mode: Optional[bool]) -> str:
    if mode is None:
        return "train" if case.module.training else "eval"
    return "train" if mode else "eval"


def input_batch_dim(case: Case, arg_name: str, t: Tensor) -> Optional[int]:
    """The batch dim of one input tensor by the contract alone (``None``: shared by every sample);
    ``batch_dims`` wins. :func:`batch_layout` adds the shape evidence."""
    if arg_name in case.batch_dims:
        return case.batch_dims[arg_name]
    return layout.contract_dim(case.module, arg_name, t)


def batch_layout(case: Case, args: Sequence[Arg]) -> Tuple[int, Dict[int, Optional[int]]]:
    """``(B, {id(tensor): batch dim or None})`` for every input tensor; ``B = 0`` if none is batched
    (an unbatched call included). Decided from the module's contract and the shapes, ``batch_dims``
    first: see :mod:`layerlab.checks.layout`."""
    return layout.layout(case.module, input_tensors(args), case.batch_dims)


def unbatched_reason(case: Case, args: Sequence[Arg]) -> Optional[str]:
    """Why the call has no batch (``None``: it has one, or ``batch_dims`` says where)."""
    return layout.unbatched_reason(case.module, input_tensors(args), case.batch_dims)


def time_dim(module: nn.Module, t: Tensor) -> Optional[int]:
    """The time dim of a sequence tensor: ``(B, T, E)`` → 1, ``(T, B, E)`` → 0, a 1-D conv's
    ``(B, C, L)`` → 2, unbatched ``(T, E)`` → 0."""
    if t.dim() < 2:
        return 0 if t.dim() == 1 else None
    if t.dim() == 3 and any(isinstance(m, nn.Conv1d) for m in module.modules()):
        return 2
    if t.dim() == 2:
        return 0 if t.is_floating_point() else 1
    return 0 if seq_first(module) else 1


def short_dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def has_inference_fast_path(module: nn.Module) -> bool:
    """Does it hold a torch layer with an inference-only fast path (eval mode, no grad needed:
    MultiheadAttention, TransformerEncoderLayer, TransformerEncoder's nested tensors)?"""
    fast = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)
    return any(isinstance(m, fast) and not m.training for m in module.modules())
