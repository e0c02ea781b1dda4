"""Which axis of each output follows the batch, and which samples each output entry really reads.

The batch checks need, for every output, the dim that indexes samples. It is found by running the
batch and one sample alone: a dim that is ``B`` long in the batched run and 1 alone is the batch
dim. Every output gets one of three layouts, and none is left out silently:

* **batched** along ``d``: entry ``i`` along ``d`` must read sample ``i`` of every batched input only;
* **pairwise** along ``(d1, d2)``: two dims follow the batch (``(B, B)`` contrastive logits of
  CLIP / SigLIP: ``logits_per_text[i, j] = t_i · v_j``). Entry ``(i, j)`` may read sample ``i`` of
  the inputs on one axis and sample ``j`` of those on the other, nothing else. Which input feeds which
  axis is measured (changing sample ``k`` of ``pixel_values`` must move column ``k`` only), not
  guessed from names;
* **no batch axis**: listed with its shapes, so the report says what was not checked.

:func:`dependence` measures what each entry reads by perturbation: sample ``k`` of one batched
input is replaced (random values; other valid ids for integer token ids, see
:mod:`layerlab.checks.token_ids`), the forward runs again, and every output position that moved
beyond rounding (:mod:`layerlab.checks.exact_dtype`) is recorded. It works for integer inputs,
which gradients cannot reach, and is the plain evidence behind a pairwise verdict.

Legend: B batch · i output sample · j, k input samples · d batch dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import Arg, call, flatten, float_leaves, generator, input_tensors, map_args, randn_like
from layerlab.checks.exact_dtype import ExactDtype
from layerlab.checks.token_ids import change_ids, is_token_ids, vocab_sizes

#: samples of each input that are perturbed (one forward each)
MAX_PERTURBED = 4


@dataclass
class Axes:
    """Each output's batch layout: ``batched`` {path: dim}, ``pairwise`` {path: (d1, d2)}, ``none``
    {path: why} (no dim follows the batch)."""

    batched: Dict[str, int] = field(default_factory=dict)
    pairwise: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    none: Dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"batched": dict(self.batched), "pairwise": {p: list(d) for p, d in self.pairwise.items()},
                "no_batch_axis": dict(self.none)}


def output_axes(full: Any, single: Any, B: int) -> Axes:
    """The layout of every output leaf, from the batched run ``full`` and a one-sample run ``single``."""
    one = dict(flatten(single))
    axes = Axes()
    for path, y in flatten(full):
        s = one.get(path)
        if s is None:
            axes.none[path] = f"{tuple(y.shape)} in the batched run, absent when one sample runs alone"
            continue
        if s.dim() != y.dim():
            axes.none[path] = f"{tuple(y.shape)} batched, {tuple(s.shape)} for one sample: the ranks differ"
            continue
        follows = [d for d in range(y.dim()) if y.shape[d] == B and s.shape[d] == 1]
        same = lambda skip: all(y.shape[k] == s.shape[k] for k in range(y.dim()) if k not in skip)  # noqa: E731
        one_dim = next((d for d in follows if same((d,))), None)
        if one_dim is not None:
            axes.batched[path] = one_dim
        elif len(follows) == 2 and same(tuple(follows)):
            axes.pairwise[path] = (follows[0], follows[1])
        else:
            axes.none[path] = f"{tuple(y.shape)} batched ({B} samples), {tuple(s.shape)} for one sample"
    return axes


@dataclass
class Perturbed:
    """A batched input whose samples can be replaced one at a time."""

    name: str
    tensor: Tensor
    dim: int
    vocab: int = 0  # > 0: integer token ids in [0, vocab)


def perturbable(module: nn.Module, args: Sequence[Arg], dims: Dict[int, Optional[int]],
                floats: bool = True) -> List[Perturbed]:
    """The batched inputs to perturb: token ids always, floating inputs when ``floats``."""
    found, seen = [], set()
    ids = [(n, t) for n, t in input_tensors(args) if is_token_ids(n, t) and dims.get(id(t)) is not None]
    vocab = vocab_sizes(module, args, ids) if ids else {}
    for name, t in input_tensors(args):
        d = dims.get(id(t))
        if d is None or id(t) in seen:
            continue
        seen.add(id(t))
        if t.is_floating_point() and floats and not name.lower().endswith("mask"):
            found.append(Perturbed(name, t, d))
        elif id(t) in vocab and vocab[id(t)][0] >= 2:
            found.append(Perturbed(name, t, d, vocab[id(t)][0]))
    return found


def _replace(args: Sequence[Arg], p: Perturbed, k: int, gen: torch.Generator) -> List[Arg]:
    def change(t: Tensor) -> Tensor:
        if t is not p.tensor:
            return t
        if p.vocab:
            return change_ids(t, p.dim, [k], p.vocab, gen)
        idx = torch.tensor([k], dtype=torch.long, device=t.device)
        return t.index_copy(p.dim, idx, randn_like(t.index_select(p.dim, idx), gen) * 2)

    return map_args(args, change)


def samples(B: int) -> List[int]:
    """The samples perturbed: the first ones and the last (an index like ``out[-1]`` reads the last)."""
    if B <= MAX_PERTURBED:
        return list(range(B))
    return list(range(MAX_PERTURBED - 1)) + [B - 1]


def dependence(module: nn.Module, args: Sequence[Arg], inputs: Sequence[Perturbed], B: int, paths: Sequence[str],
               exact: ExactDtype, seed: int) -> Dict[Tuple[str, int], Dict[str, Tensor]]:
    """``{(input, k): {output path: bool mask of the entries that moved}}`` when sample ``k`` of
    ``input`` is replaced, for the samples :func:`samples` picks."""
    gen = generator(seed, 12)
    with torch.no_grad():
        base = dict(float_leaves(call(module, args)))
        found: Dict[Tuple[str, int], Dict[str, Tensor]] = {}
        for p in inputs:
            for k in samples(B):
                out = dict(float_leaves(call(module, _replace(args, p, k, gen))))
                moved = {}
                for path in paths:
                    y0, y = base.get(path), out.get(path)
                    if y0 is None or y is None or y.shape != y0.shape:
                        continue
                    scale = float(y0.abs().max()) if y0.numel() else 0.0
                    change = (y - y0).abs().nan_to_num(nan=float("inf"))
                    moved[path] = change > exact.absolute + exact.relative * (scale or 1.0)
                found[(p.name, k)] = moved
    return found


def batched_leaks(found: Dict[Tuple[str, int], Dict[str, Tensor]], batched: Dict[str, int]) -> List[Dict[str, Any]]:
    """Entries of a batched output that moved when another sample of an input changed."""
    leaks = []
    for (name, k), moved in found.items():
        for path, d in batched.items():
            m = moved.get(path)
            if m is None:
                continue
            for i in range(m.shape[d]):
                if i != k and bool(m.select(d, i).any()):
                    leaks.append({"output": path, "sample": i, "input": name, "other_sample": k})
    return leaks


def pairwise_verdict(found: Dict[Tuple[str, int], Dict[str, Tensor]], path: str,
                     dims: Tuple[int, int]) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """``(axis of each input, leaks)`` for a pairwise output ``dims = (d1, d2)``.

    Changing sample ``k`` of an input may move only entries whose index along the input's axis is
    ``k``. The axis is the one that fits every perturbed sample; when one axis fits some samples and
    not others, it is the input's axis and the others leak. An input that no axis fits for any
    sample but that moves only row ``k`` and column ``k`` feeds both axes (``x @ x.T``); an entry
    off both is a leak whatever the axes."""
    by_input: Dict[str, List[Tuple[int, List[Tuple[int, ...]]]]] = {}
    for (name, k), moved in found.items():
        if path in moved:
            entries = [tuple(int(v) for v in e) for e in torch.nonzero(moved[path])]
            by_input.setdefault(name, []).append((k, entries))
    axes: Dict[str, Any] = {}
    leaks: List[Dict[str, Any]] = []
    for name, runs in by_input.items():
        if not any(es for _, es in runs):
            axes[name] = None  # reads no sample of this input (shared, or unused)
            continue
        fit = {a: [k for k, es in runs if all(e[dims[a]] == k for e in es)] for a in (0, 1)}
        full = [a for a in (0, 1) if len(fit[a]) == len(runs)]
        if full:
            axes[name] = dims[full[0]]
            continue
        partial = [a for a in (0, 1) if fit[a]]
        axis = max(partial, key=lambda a: len(fit[a])) if partial else None
        axes[name] = dims[axis] if axis is not None else "both"
        for k, es in runs:
            off = ([e for e in es if e[dims[axis]] != k] if axis is not None else
                   [e for e in es if e[dims[0]] != k and e[dims[1]] != k])
            if off:
                leaks.append({"output": path, "entry": list(off[0]), "input": name, "other_sample": k,
                              "entries_moved": len(es), "axis": dims[axis] if axis is not None else "both"})
                break
    return axes, leaks
