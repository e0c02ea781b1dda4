"""Which dim of each input indexes the samples: the module's contract first, then the shapes.

Every batch-aware step (batch independence and consistency, the masks check, export with a dynamic
batch, deploy's batch variant, profiling's per-sample numbers) needs, for each input tensor, the dim
that indexes samples, or ``None`` when every sample shares the tensor (a causal mask, a position
table). Names alone mislead: Hugging Face's ``attention_mask`` is ``(B, S)``, one row per sample,
while torch's ``attn_mask`` is ``(L, S)`` and shared. So the layout is decided in this order:

1. ``batch_dims`` from the user: always wins (its tensors also set ``B`` first).
2. An unbatched call has no batch at all. torch.nn modules that document an unbatched form (RNNs
   and cells, attention, transformers, the conv / pool / pad / instance-norm families, Softmax2d)
   take their first input with one dim less than batched; a floating 1-D input is one feature
   vector, and a 2-D one a ``(T, E)`` sequence of a module with a ``batch_first`` switch.
3. The main inputs (floating tensors and integer ids; not masks, states or bool flags) follow the
   usual contract: dim 0, dim 1 for ``batch_first=False`` sequences. The first one sets ``B``; a
   main input whose size there differs is shared.
4. Every other tensor (masks, recurrent states, bool flags) is batched along its candidate dim (the
   contract's guess, else dim 0) when that dim is ``B`` long, whatever its name says. When ``B`` is
   also the size of another of its dims, or of a non-batch dim of a main input (a ``(T, T)`` mask
   with ``T = B``, an ``(L, S)`` mask with ``L = B``), the shapes cannot tell and the contract
   decides: torch's attention masks are shared, padding masks and ``attention_mask`` are batched.

Legend: B batch · T time · L query length · S key length · E features · C channels.

Knows only torch (shared by checks, deploy and profiling); :mod:`layerlab.checks.case` re-exports it.
"""

from __future__ import annotations

import re
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

#: names of forward arguments that carry recurrent state (batch dim 1: ``[L·D, B, H]``)
STATE_NAMES = ("hx", "h0", "h_0", "c0", "c_0", "state", "hidden")

#: torch.nn families whose spatial rank is the class name's ``Nd`` suffix and that accept an
#: unbatched ``(C, *spatial)`` input (BatchNorm, Upsample and Dropout2d do not: not listed)
_SPATIAL_UNBATCHED = (
    nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd, nn.modules.pooling._LPPoolNd, nn.modules.pooling._MaxUnpoolNd,
    nn.FractionalMaxPool2d, nn.FractionalMaxPool3d,
    nn.modules.padding._ReflectionPadNd, nn.modules.padding._ReplicationPadNd,
    nn.modules.padding._ConstantPadNd, nn.modules.padding._CircularPadNd,
    nn.Dropout1d, nn.Dropout3d,
)
_SEQUENCE_UNBATCHED = (nn.RNNBase, nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder,
                       nn.TransformerDecoder, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)

Tensors = Sequence[Tuple[str, Tensor]]


def base_name(path: str) -> str:
    """``hx[0]`` → ``hx``: the forward argument a tensor path belongs to, lower-cased."""
    return path.split("[", 1)[0].lower()


def is_mask_name(name: str) -> bool:
    return "mask" in name.lower()


def has_batch_first(module: nn.Module) -> bool:
    """Is it a sequence module with torch's ``batch_first`` switch (RNNs, attention, transformers)?"""
    return any(isinstance(getattr(m, "batch_first", None), bool) for m in module.modules())


def seq_first(module: nn.Module) -> bool:
    """Does the module take ``(T, B, E)`` inputs (torch's ``batch_first=False``)?"""
    for m in module.modules():  # the module itself first
        bf = getattr(m, "batch_first", None)
        if isinstance(bf, bool):
            return not bf
    return False


def contract_dim(module: nn.Module, path: str, t: Tensor) -> Optional[int]:
    """The batch dim of one tensor by the usual contracts (names, layouts), before shape evidence."""
    base = base_name(path)
    if t.dim() == 0:
        return None
    if base in STATE_NAMES:
        return 1 if t.dim() == 3 else (0 if t.dim() == 2 and not has_batch_first(module) else None)
    if is_mask_name(base):
        # key_padding_mask is (B, S) in torch; Hugging Face's attention_mask is (B, S) or (B, 1, L, S);
        # torch's attn_mask / src_mask / tgt_mask are (L, S), shared by the batch
        if "padding" in base or base == "attention_mask":
            return 0
        return None if t.dim() <= 2 else 0
    if t.is_floating_point() and (t.dim() == 1 or (t.dim() == 2 and has_batch_first(module))):
        return None  # unbatched: a feature vector, or a (T, E) sequence
    if seq_first(module) and t.dim() >= 3 and t.is_floating_point():
        return 1
    if seq_first(module) and t.dim() == 2 and not t.is_floating_point():
        return 1
    return 0


def is_main(path: str, t: Tensor) -> bool:
    """A main input: floating data or integer ids (not a mask, a recurrent state or a bool flag)."""
    base = base_name(path)
    return not is_mask_name(base) and base not in STATE_NAMES and t.dtype != torch.bool and t.dim() > 0


def batched_ndim(module: nn.Module) -> Optional[int]:
    """How many dims the first input has when batched, for torch.nn modules that document an
    unbatched form with one dim less (``None``: no such contract known)."""
    m = module
    while isinstance(m, nn.Sequential) and len(m) > 0:
        m = m[0]
    if isinstance(m, _SEQUENCE_UNBATCHED):
        return 3
    if isinstance(m, nn.RNNCellBase):
        return 2
    if isinstance(m, nn.Softmax2d):
        return 4
    if isinstance(m, nn.modules.conv._ConvNd):
        return len(m.kernel_size) + 2
    if isinstance(m, nn.modules.instancenorm._InstanceNorm):
        return m._get_no_batch_dim() + 1
    if isinstance(m, _SPATIAL_UNBATCHED):
        for cls in type(m).__mro__:
            found = re.search(r"(\d)d$", cls.__name__)
            if found and cls.__module__.startswith("torch.nn"):
                return int(found.group(1)) + 2
    return None


def _first_main(tensors: Tensors) -> Optional[Tuple[str, Tensor]]:
    return next(((p, t) for p, t in tensors if is_main(p, t) and t.is_floating_point()), None)


def unbatched_reason(module: nn.Module, tensors: Tensors,
                     batch_dims: Mapping[str, Optional[int]] = {}) -> Optional[str]:
    """Why the call has no batch at all (``None``: it has one, or the user said where it is)."""
    if batch_dims:
        return None
    first = _first_main(tensors)
    if first is None:
        return None
    path, t = first
    shape = tuple(t.shape)
    n = batched_ndim(module)
    if n is not None and t.dim() == n - 1:
        m = module[0] if isinstance(module, nn.Sequential) and len(module) > 0 else module
        return f"{path} is {shape}, and {type(m).__name__} takes {n}-D input batched, {n - 1}-D unbatched"
    if n is None and t.dim() == 1:
        return f"{path} is {shape}, one feature vector"
    if n is None and t.dim() == 2 and has_batch_first(module):
        return f"{path} is {shape}, one (T, E) sequence"
    return None


def layout(module: nn.Module, tensors: Tensors,
           batch_dims: Mapping[str, Optional[int]] = {}) -> Tuple[int, Dict[int, Optional[int]]]:
    """``(B, {id(tensor): batch dim or None})`` for ``[(path, tensor)]``; ``B = 0`` if none is batched."""
    dims: Dict[int, Optional[int]] = {id(t): None for _, t in tensors}
    if unbatched_reason(module, tensors, batch_dims):
        return 0, dims
    B = 0

    def take(t: Tensor, d: Optional[int]) -> None:
        nonlocal B
        if d is not None and d < 0:
            d += t.dim()
        if d is None or not 0 <= d < t.dim():
            return
        if B == 0:
            B = t.shape[d]
        if t.shape[d] == B:
            dims[id(t)] = d

    named = [(p, t) for p, t in tensors if p in batch_dims]
    mains = [(p, t) for p, t in tensors if p not in batch_dims and is_main(p, t)]
    others = [(p, t) for p, t in tensors if p not in batch_dims and not is_main(p, t)]
    for p, t in named:
        take(t, batch_dims[p])
    for p, t in mains:
        take(t, contract_dim(module, p, t))
    # sizes a mask's dim may share with the main inputs' non-batch dims (an (L, S) mask with L = B)
    lengths = {s for _, t in mains for d, s in enumerate(t.shape) if d != dims[id(t)]}
    for p, t in others:
        guess = contract_dim(module, p, t)
        if B == 0 or t.dim() == 0:
            take(t, guess)
            continue
        cand = guess if guess is not None else 0
        if cand >= t.dim() or t.shape[cand] != B:
            continue  # shared: its candidate dim is not B long
        ambiguous = B in lengths or any(s == B for d, s in enumerate(t.shape) if d != cand)
        take(t, guess if ambiguous else cand)
    return B, dims


def describe(dims: Mapping[int, Optional[int]], tensors: Tensors) -> Dict[str, Optional[int]]:
    """``{path: batch dim or None}``: a layout in words, for messages."""
    return {p: dims.get(id(t)) for p, t in tensors}
