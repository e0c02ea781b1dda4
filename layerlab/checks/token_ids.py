"""Integer token-id inputs: how many ids are valid, and how to change some positions to other valid ids.

A language model's sequence input is ``input_ids`` (``(B, T)`` integers), not a float tensor. To
perturb it the check must stay inside the vocabulary, or the embedding raises an index error. The
vocabulary size comes from, in order of trust:

1. the ``nn.Embedding`` that consumes the ids in a forward run (its ``num_embeddings``);
2. the module's ``config.vocab_size`` (Hugging Face models), when every id seen is below it;
3. the largest id seen + 1 (the ids seen are surely valid; said so in the report).

A changed id is always a *different* valid id (``(id + r) mod V`` with ``1 ≤ r < V``), so a
one-position change is never a no-op.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import Arg, call, flatten, is_mask_name


def is_token_ids(name: str, t: Tensor) -> bool:
    """An integer (not bool) input that is not a mask: token ids, position ids, type ids."""
    return (not is_mask_name(name) and t.dim() >= 1 and t.numel() > 0
            and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool)


def token_inputs(args: Sequence[Arg]) -> List[Tuple[str, Tensor]]:
    """``(name, tensor)`` of every integer id input, each distinct tensor once."""
    out, seen = [], set()
    for a in args:
        for path, t in flatten(a.value, a.name):
            if is_token_ids(path, t) and id(t) not in seen:
                seen.add(id(t))
                out.append((path, t))
    return out


def vocab_sizes(module: nn.Module, args: Sequence[Arg],
                ids: Sequence[Tuple[str, Tensor]]) -> Dict[int, Tuple[int, str]]:
    """``{id(tensor): (V, where V comes from)}`` for each id input (see the module docstring)."""
    consumed: Dict[int, Tuple[int, str]] = {}
    wanted = [t for _, t in ids]
    handles = []
    for name, m in module.named_modules():
        if not isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
            continue

        def hook(mod, inputs, _name=name):
            seen = inputs[0] if inputs and isinstance(inputs[0], Tensor) else None
            for t in wanted:
                if id(t) not in consumed and seen is not None and _same_ids(seen, t):
                    consumed[id(t)] = (mod.num_embeddings, f"embedding `{_name}` ({mod.num_embeddings} ids)")

        handles.append(m.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            call(module, args)
    except Exception:  # the caller's own forward reports failures; the fallbacks below still apply
        pass
    finally:
        for h in handles:
            h.remove()
    out: Dict[int, Tuple[int, str]] = {}
    config_vocab = _config_vocab(module)
    for _, t in ids:
        top = int(t.max()) + 1
        if id(t) in consumed:
            out[id(t)] = consumed[id(t)]
        elif config_vocab is not None and top <= config_vocab:
            out[id(t)] = (config_vocab, f"config.vocab_size = {config_vocab}")
        else:
            out[id(t)] = (top, f"the largest id seen + 1 = {top} (no embedding or config names the vocabulary)")
    return out


def change_ids(t: Tensor, td: int, positions: Sequence[int], vocab: int, gen: torch.Generator) -> Tensor:
    """``t`` with the ids at ``positions`` along ``td`` replaced by other valid ids in ``[0, vocab)``."""
    idx = torch.tensor(list(positions), dtype=torch.long, device=t.device)
    old = t.index_select(td, idx)
    shift = torch.randint(1, vocab, old.shape, generator=gen).to(device=t.device, dtype=t.dtype)
    return t.index_copy(td, idx, (old + shift) % vocab)


def _same_ids(seen: Tensor, t: Tensor) -> bool:
    """Is ``seen`` the ids ``t`` (the same tensor, or a view such as HF's ``input_ids.view(-1, T)``)?"""
    if seen is t:
        return True
    if seen.is_floating_point() or seen.numel() != t.numel() or seen.dtype != t.dtype:
        return False
    return bool(torch.equal(seen.reshape(-1).cpu(), t.reshape(-1).cpu()))


def _config_vocab(module: nn.Module) -> Optional[int]:
    for m in module.modules():
        v = getattr(getattr(m, "config", None), "vocab_size", None)
        if isinstance(v, int) and v > 1:
            return v
    return None
