"""The ``attention`` probe: per attention call and per head, how spread out the weights are.

For every attention computation in the forward it reports, per head, the entropy of the attention
distribution (nats, mean over batch and queries), the mean largest weight, and whether the head
collapsed to one key or is uniform over the keys the mask allows (definitions and thresholds in
:mod:`layerlab.probe.probes.attention_math`).

Where the weights come from, without changing the model's results (a ``TorchFunctionMode``
entered around the forward; the weights are recomputed beside the model under ``no_grad`` from the
call's own arguments, and the call itself runs untouched):

* ``F.scaled_dot_product_attention`` called by any code (torch's fused kernels never materialise
  the weights): rebuilt from ``q``, ``k``, ``attn_mask``, ``is_causal``, ``scale``, ``enable_gqa``;
* ``torch.nn.MultiheadAttention`` (``F.multi_head_attention_forward``, whichever
  ``need_weights`` it was given; ``nn.TransformerEncoderLayer`` passes ``False``): the call runs as
  made, then once more under ``no_grad`` with ``need_weights=True, average_attn_weights=False`` and
  no dropout, which gives torch's own per-head weights before dropout (one extra attention forward
  without autograd); the masks say which keys were allowed;
* a ``softmax`` over the last dim called by the code of a module whose class name contains
  "attention" or "attn": layerlab's own attention layers and Hugging Face "eager" attention; the
  mask is already in the scores there (−inf or the dtype's minimum).

The row of a call is the innermost module of the model whose code made it (``call`` counts the
attention computations seen in that module). Not seen: attention computed with plain matmuls and
a softmax outside any module named like attention, and C++ fast paths (a mode disables torch's
own fast paths, which inspect's backward pass does anyway).

Findings are notes, never warnings: uniform heads are what a randomly initialised model has, and
a head that attends to one key may be right; the probe says what it sees.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from layerlab.errors import Problem
from layerlab.probe.probes.attention_math import from_qk, from_scores, from_weights
from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow, ProbeRun, quiet
from layerlab.probe.probes.frames import CallCounter, innermost_module

_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_MHA = {F.multi_head_attention_forward}
_SOFTMAX = {F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax}
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_MHA_ARGS = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
             "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training",
             "key_padding_mask", "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight",
             "k_proj_weight", "v_proj_weight", "static_k", "static_v", "average_attn_weights", "is_causal")


def _bound(names, args, kwargs) -> Dict[str, Any]:
    out = dict(zip(names, args))
    out.update(kwargs or {})
    return out


def _softmax_dim(func, args, kwargs) -> Any:
    if "dim" in (kwargs or {}):
        return kwargs["dim"]
    return args[1] if len(args) > 1 else None


def _attention_class(module: Any) -> bool:
    name = type(module).__name__.lower()
    return "attention" in name or "attn" in name


class _Watch(TorchFunctionMode):
    """Sees the model's attention calls and hands their arguments to the probe."""

    def __init__(self, probe: "AttentionProbe", run: ProbeRun) -> None:
        super().__init__()
        self.probe, self.run = probe, run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SDPA:
            self.probe.seen_sdpa(self.run, _bound(_SDPA_ARGS, args, kwargs))
        elif func in _MHA:
            return self.probe.mha(self.run, func, args, kwargs)
        elif func in _SOFTMAX and args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
            dim = _softmax_dim(func, args, kwargs)
            if dim is not None and dim in (-1, args[0].dim() - 1):
                module, path = innermost_module(self.run.path_of)
                if module is not None and _attention_class(module):
                    with quiet():
                        stats = from_scores(args[0])
                    self.probe.add(module, path, stats, "softmax")
        return func(*args, **kwargs)


class AttentionProbe(Probe):
    name = "attention"
    title = "Attention: entropy per head (nats)"

    def __init__(self) -> None:
        self.rows: List[ProbeRow] = []
        self.counter = CallCounter()
        self.uniform: List[str] = []
        self.one_key: List[str] = []

    def attach(self, run: ProbeRun) -> None:
        run.context(lambda: _Watch(self, run))

    # -- what the mode hands over ----------------------------------------------------------

    def seen_sdpa(self, run: ProbeRun, a: Dict[str, Any]) -> None:
        module, path = innermost_module(run.path_of)
        with quiet():
            stats = from_qk(a["query"], a["key"], a.get("attn_mask"), bool(a.get("is_causal", False)),
                            a.get("scale"), bool(a.get("enable_gqa", False)))
        self.add(module, path, stats, "sdpa")

    def mha(self, run: ProbeRun, func, args, kwargs):
        """``F.multi_head_attention_forward``: the call runs as it was made; then, under ``no_grad``,
        once more with ``need_weights=True, average_attn_weights=False`` and no dropout, for the
        per-head weights before dropout (torch's own computation, nothing re-implemented)."""
        out = func(*args, **kwargs)
        a = _bound(_MHA_ARGS, args, kwargs)
        module, path = innermost_module(run.path_of)
        with quiet():
            weights = func(**{**a, "need_weights": True, "average_attn_weights": False, "training": False,
                              "dropout_p": 0.0})[1]
            stats = from_weights(weights, _mha_allowed(a, weights))
        self.add(module, path, stats, "sdpa")
        return out

    def add(self, module: Any, path: str, stats, source: str) -> None:
        call = self.counter.next(path)
        H = stats.entropy.numel()
        ent = stats.entropy.tolist()
        flags = []
        if stats.sampled:
            flags.append(f"{stats.sampled} of {stats.queries} queries")
        one, flat = int(stats.one_key.sum()), int(stats.uniform.sum())
        label = f"{path or '(root)'} call {call}" if call > 1 else (path or "(root)")
        if one:
            self.one_key.append(f"{label}: {one}/{H}")
        if flat:
            self.uniform.append(f"{label}: {flat}/{H}")
        self.rows.append(ProbeRow(
            path=path, class_name=type(module).__name__ if module is not None else "", call=call,
            values={"heads": H, "keys": stats.keys, "entropy": sum(ent) / H, "log_n": float(stats.log_keys.mean()),
                    "min_entropy": min(ent), "max_weight": float(stats.max_weight.mean()),
                    "one_key": one / H, "uniform": flat / H},
            series={"entropy/head": ent, "max w/head": stats.max_weight.tolist()},
            flags=flags + ([] if source == "sdpa" else [f"from {source}"]),
        ))

    def result(self, report: Any) -> ProbeResult:
        findings = []
        if self.uniform:
            findings.append(Problem(
                code="attention-uniform", severity="info",
                message="heads attending uniformly to every allowed key (entropy ≥ 99% of log n on ≥ 90% of "
                        "queries): " + _listed(self.uniform),
                hint="expected at random initialisation (small scores); in a trained model such a head does not "
                     "discriminate between keys",
                data={"calls": self.uniform}))
        if self.one_key:
            findings.append(Problem(
                code="attention-one-key", severity="info",
                message="heads putting ≥ 0.99 of their weight on one key for ≥ 90% of queries: " + _listed(self.one_key),
                hint="can be learned behaviour (attend to the previous token, to [CLS]); at initialisation it "
                     "means very large scores (check the 1/√d scale and the q/k norms)",
                data={"calls": self.one_key}))
        note = None if self.rows else ("no attention call seen: F.scaled_dot_product_attention, "
                                       "nn.MultiheadAttention and softmax inside *Attention modules are watched")
        return ProbeResult(
            name=self.name, title=self.title,
            columns={"entropy": "entropy", "log_n": "log n", "max_weight": "max w", "one_key": "1-key",
                     "uniform": "uniform", "heads": "H", "keys": "keys", "min_entropy": "min head"},
            rows=self.rows, findings=findings,
            summary={"calls": len(self.rows), "heads": sum(int(r.values["heads"]) for r in self.rows),
                     "one_key_thresholds": {"max_weight": 0.99, "of_queries": 0.9},
                     "uniform_thresholds": {"entropy_over_log_n": 0.99, "of_queries": 0.9}},
            note=note,
        )


def _blocked(mask: torch.Tensor) -> torch.Tensor:
    """MultiheadAttention's masks: bool ``True`` = blocked; float: −inf (or the dtype's minimum) blocks."""
    return mask if mask.dtype == torch.bool else ~(mask > torch.finfo(mask.dtype).min / 2)


def _mha_allowed(a: Dict[str, Any], weights: torch.Tensor):
    """Which keys each query may see, (B, H, L, S) like ``weights`` (``(H, L, S)`` unbatched), from
    ``attn_mask`` and ``key_padding_mask``; the keys ``bias_k`` and ``add_zero_attn`` append are allowed."""
    kpm, mask = a.get("key_padding_mask"), a.get("attn_mask")
    if kpm is None and mask is None:
        return None
    batched = weights.dim() == 4
    w = weights if batched else weights[None]
    B, H, L, S = w.shape
    extra = (a.get("bias_k") is not None) + bool(a.get("add_zero_attn"))
    blocked = torch.zeros(B, H, L, S - extra, dtype=torch.bool, device=w.device)
    if mask is not None:
        m = _blocked(mask)
        blocked = blocked | (m.view(B, H, L, -1) if m.dim() == 3 else m)
    if kpm is not None:
        k = _blocked(kpm)
        blocked = blocked | k.view(B, 1, 1, -1)
    allowed = ~blocked
    if extra:
        allowed = torch.cat([allowed, allowed.new_ones(B, H, L, extra)], dim=-1)
    return allowed if batched else allowed[0]


def _listed(items: List[str], n: int = 4) -> str:
    return ", ".join(items[:n]) + (f" … ({len(items)} in all)" if len(items) > n else "")
