"""Gradients that are tiny or zero *by construction*: recognised by structure, checked on the numbers.

A "vanishing" flag means "this parameter will barely train". Three common structures give a tiny
or zero gradient that says nothing of the kind, so flagging them is a false alarm on a stock model:

    key bias      An attention's key projection bias ``b`` adds ``q·b`` to every logit of a query
                  alike, and softmax is shift-invariant along the key axis: ``∂L/∂b = 0`` exactly
                  (BERT: ``*.attention.self.key.bias``).
    bias → BN     A Conv/Linear bias feeding a BatchNorm (or InstanceNorm) that normalises with the
                  batch's own statistics: the mean subtraction removes it, ``∂L/∂b = 0`` exactly.
    layer scale   A per-channel scale ``γ`` initialised tiny (ConvNeXt: 1e-6) multiplies a residual
                  branch, so every gradient inside the branch is about ``γ`` times a normal one.

Each is recognised by structure first (module types and names, which call feeds which, the
scale's values) and then checked on the numbers this run produced: a bias gradient is the sum,
over positions, of the gradient at its module's output, so a bias explained by the first two
rules must show that sum cancelling (``‖∂L/∂b‖ ≤ CANCELLED × ‖∂L/∂out‖``); a gradient explained
by a layer scale must be in range once divided by ``γ``, while the block's own output still
gets a normal gradient. A flagged parameter that fails either part stays a warning.

Explained parameters keep their flags (they are facts) and get ``ParamRecord.expected``; their
warnings become one note per rule. Zero gradients that *spread* (one module stops the gradient
and everything upstream gets exactly zero) are the business of :mod:`layerlab.probe.gradient_root`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from torch import nn

from layerlab.errors import Problem
from layerlab.probe.report import CallRecord, ParamRecord

#: A bias gradient at most this fraction of the gradient at its module's output has cancelled:
#: float32 rounding leaves about 1e-7 × √positions of it; a sum that does not cancel is ~1.
CANCELLED = 1e-3

#: A per-channel scale whose largest magnitude is at most this is a "layer scale at init"
#: (ConvNeXt and DINOv2 use 1e-6, CaiT and DeiT III 1e-5 or 1e-6).
TINY_SCALE = 1e-3

#: Attribute names of key and query projections (HF BERT/RoBERTa, Llama/GPT-NeoX, lucidrains, …).
#: DeBERTa's ``pos_key_proj`` projects the relative-position keys that content queries score
#: (c2p): its bias adds the same q·b to every logit of a query too.
KEY_NAMES = frozenset({"key", "k", "k_proj", "to_k", "wk", "w_k", "k_lin", "key_proj", "k_linear", "pos_key_proj"})
QUERY_NAMES = frozenset({"query", "q", "q_proj", "to_q", "wq", "w_q", "q_lin", "query_proj", "q_linear"})

_BIASED = (nn.Linear, nn.modules.conv._ConvNd)
_BATCH_NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
#: norms whose β adds a per-channel shift to their output (a later batch-statistics norm removes it)
_SHIFTED_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


@dataclass
class View:
    """What the rules read: the calls, the module of each call, and lookups built once."""

    root: nn.Module
    calls: List[CallRecord]
    modules: List[nn.Module]
    by_path: Dict[str, List[int]] = field(default_factory=dict)
    fed_by: Dict[int, List[int]] = field(default_factory=dict)  # slot → calls whose first input it is
    scales: Dict[int, Optional[Tuple[str, float]]] = field(default_factory=dict)  # id → tiny_scale

    def __post_init__(self) -> None:
        for call in self.calls:
            self.by_path.setdefault(call.path, []).append(call.index)
            first = call.tensor_inputs[:1]
            if first and first[0].slot is not None:
                self.fed_by.setdefault(first[0].slot, []).append(call.index)

    def module(self, path: str) -> Optional[nn.Module]:
        ran = self.by_path.get(path)
        if ran:
            return self.modules[ran[0]]
        try:
            return self.root.get_submodule(path)
        except AttributeError:
            return None

    def tiny_scale(self, module: nn.Module) -> Optional[Tuple[str, float]]:
        """:func:`tiny_scale` of ``module``, remembered (asked for every enclosing block)."""
        key = id(module)
        if key not in self.scales:
            self.scales[key] = tiny_scale(module)
        return self.scales[key]

    def out_grad(self, path: str) -> Optional[float]:
        """‖∂L/∂output‖ of the module at ``path``, over all its calls and tensor outputs."""
        norms = [o.grad.norm for i in self.by_path.get(path, ()) for o in self.calls[i].tensor_outputs
                 if o.grad is not None and o.grad.finite]
        return math.sqrt(sum(g * g for g in norms)) if norms else None


@dataclass
class Explained:
    """One parameter whose flag a rule explains: ``why`` is the short reason, ``data`` the numbers
    that checked it (``cancelled``: ‖∂L/∂b‖ / ‖∂L/∂out‖; ``over_gamma``: ‖∂L/∂p‖ / γ)."""

    rule: str
    param: str
    why: str
    data: dict = field(default_factory=dict)


def _cancelled(p: ParamRecord, view: View) -> Optional[float]:
    """``‖∂L/∂b‖ / ‖∂L/∂out‖`` of bias ``p`` when it shows the sum over positions cancelling."""
    return _cancelled_against(p, view.out_grad(p.module))


def _cancelled_against(p: ParamRecord, out: Optional[float]) -> Optional[float]:
    if out is None or out == 0 or p.grad_norm is None:
        return None
    ratio = p.grad_norm / out
    return ratio if ratio <= CANCELLED else None


def key_bias(p: ParamRecord, view: View) -> Optional[Explained]:
    """The bias of an attention's key projection (a Linear named like ``key`` next to a ``query``)."""
    owner_path, _, leaf = p.name.rpartition(".")
    parent, _, name = owner_path.rpartition(".")
    if leaf != "bias" or name not in KEY_NAMES or not isinstance(view.module(owner_path), nn.Linear):
        return None
    holder = view.module(parent)
    if holder is None or not QUERY_NAMES & {n for n, _ in holder.named_children()}:
        return None
    ratio, against = _cancelled(p, view), "key"
    if ratio is None and not view.by_path.get(owner_path):  # its weight and bias used by a functional
        ratio, against = _cancelled_against(p, view.out_grad(parent)), "attention"  # attention (WavLM)
    if ratio is None:
        return None
    return Explained(
        "key-bias", p.name, "softmax is shift-invariant along the key axis: the key bias adds the "
        "same q·b to every logit of a query, so its gradient is zero by construction",
        {"cancelled": ratio, "against": against},
    )


def bias_before_batch_norm(p: ParamRecord, view: View) -> Optional[Explained]:
    """The bias of a Conv/Linear whose every call's output goes straight into a normalisation
    that subtracts the batch's (or instance's) own per-channel mean; or a bias (a norm's β
    included) whose output reaches such a normalisation later, through per-channel linear steps
    (a 1×1 conv, a residual add: MobileNet's projection BatchNorm before the next block's
    expansion), when the numbers show the sum over positions cancelling."""
    owner_path, _, leaf = p.name.rpartition(".")
    owner = view.module(owner_path)
    if leaf != "bias" or not isinstance(owner, _BIASED + _SHIFTED_NORMS):
        return None
    direct, later = [], []
    for index in view.by_path.get(owner_path, ()):
        outs = view.calls[index].tensor_outputs[:1]
        consumers = view.fed_by.get(outs[0].slot, []) if outs and outs[0].slot is not None else []
        found = [c for c in consumers if _uses_batch_stats(view.calls[c], view.modules[c])]
        direct.append(view.calls[found[0]] if found else None)
        after = [c.index for c in view.calls[index + 1:]
                 if _uses_batch_stats(c, view.modules[c.index]) and not c.path.startswith(owner_path + ".")]
        later.append(view.calls[after[0]] if after else None)
    ratio = _cancelled(p, view) if direct else None
    if ratio is None:
        return None
    if all(direct) and isinstance(owner, _BIASED):
        norm = direct[0]
        return Explained(
            "bias-before-norm", p.name, f"it feeds {norm.path} ({norm.class_name}), which subtracts the "
            "batch's per-channel mean: the bias cancels, so its gradient is zero by construction",
            {"norm": norm.path, "cancelled": ratio},
        )
    if not all(later):
        return None
    norm = later[0]
    return Explained(
        "bias-before-norm", p.name, f"its shift reaches {norm.path} ({norm.class_name}), which subtracts the "
        "batch's per-channel mean: the gradient sums to zero over positions (measured), so the bias "
        "cannot change the output",
        {"norm": norm.path, "cancelled": ratio, "direct": False},
    )


def shift_invariant_bias(p: ParamRecord, view: View) -> Optional[Explained]:
    """A Linear's bias whose output gradient sums to zero over positions in every channel, while that
    output gets a normal gradient: what follows ignores a shift shared by every position — a softmax
    along them (attention pooling's ``score = nn.Linear(d, 1)``, a key projection called through a
    functional attention) or a mean subtraction. The same mechanism as the key bias, checked the same
    way on the numbers; a bias whose output has one position per sample cannot cancel, so it needs
    more than one."""
    owner_path, _, leaf = p.name.rpartition(".")
    owner = view.module(owner_path)
    calls = view.by_path.get(owner_path, ())
    if leaf != "bias" or not isinstance(owner, nn.Linear) or not calls:
        return None
    outs = [o for i in calls for o in view.calls[i].tensor_outputs[:1] if o.shape and None not in o.shape]
    batch = min((o.shape[0] for o in outs if o.shape), default=1)
    if not outs or all(math.prod(o.shape) <= max(batch, 1) * owner.out_features for o in outs):
        return None  # one position per sample and channel: nothing to sum over
    ratio = _cancelled(p, view)
    if ratio is None:
        return None
    return Explained(
        "shift-invariant-bias", p.name, "its output gradient sums to zero over positions in every channel: what "
        "follows ignores a shift shared by every position (softmax is shift-invariant along them), so its "
        "gradient is zero by construction",
        {"cancelled": ratio},
    )


def _uses_batch_stats(call: CallRecord, module: nn.Module) -> bool:
    # the rule of _BatchNorm.forward and _InstanceNorm.forward: the batch's own statistics in
    # training mode, or always when no running statistics are kept
    return isinstance(module, _BATCH_NORMS) and (call.training or getattr(module, "running_mean", None) is None)


def tiny_scale(block: nn.Module) -> Optional[Tuple[str, float]]:
    """A per-channel scale with every value tiny and not all zero, held by ``block`` itself or by a
    child that is nothing but that scale (timm's ``LayerScale``, DINOv2's ``layer_scale1``).

    torch.nn's own layers hold no layer scale (a Linear's small bias is not one), nor does a bias.
    """
    if _is_torch_nn(block):
        return None
    candidates = [(name, p) for name, p in block._parameters.items() if p is not None]
    for child_name, child in block.named_children():
        own = [(n, p) for n, p in child._parameters.items() if p is not None]
        if len(own) == 1 and not _is_torch_nn(child) and not any(True for _ in child.children()):
            candidates.append((f"{child_name}.{own[0][0]}", own[0][1]))
    for name, p in candidates:
        if (name.endswith("bias") or not p.is_floating_point() or p.numel() == 0
                or sum(s > 1 for s in p.shape) > 1):
            continue
        biggest = p.detach().abs().max().item()
        if 0 < biggest <= TINY_SCALE:
            return name, biggest
    return None


def _is_torch_nn(module: nn.Module) -> bool:
    return type(module).__module__.startswith("torch.nn.")


def layer_scale(p: ParamRecord, view: View, scale: float, vanish: float) -> Optional[Explained]:
    """A vanishing gradient inside a block whose branch is multiplied by a tiny layer scale γ."""
    if "vanishing" not in p.flags or p.grad_norm is None:
        return None
    found = scaled_block(p.module, view, scale, vanish)
    if found is None:
        return None
    block, gamma_name, gamma = found
    if p.name == gamma_name or p.grad_norm / gamma < vanish * scale:
        return None  # still vanishing after dividing by γ: something else is going on
    return Explained(
        "layer-scale", p.name, f"layer scale γ={gamma:.0e} at init ({gamma_name}): expected small gradient",
        {"gamma": gamma_name, "gamma_value": gamma, "block": block, "over_gamma": p.grad_norm / gamma},
    )


def scaled_block(path: str, view: View, scale: float, vanish: float) -> Optional[Tuple[str, str, float]]:
    """``(block, γ's full name, max|γ|)`` for the nearest enclosing module of ``path`` (itself
    included) holding a tiny layer scale, when that block's output gets a normal gradient
    (its residual stream carries the signal; only the branch inside is scaled down)."""
    parts = path.split(".") if path else []
    for depth in range(len(parts), -1, -1):
        block = ".".join(parts[:depth])
        module = view.module(block)
        found = view.tiny_scale(module) if module is not None else None
        if found is None:
            continue
        out = view.out_grad(block)
        if out is None or out < vanish * scale:
            return None
        name, gamma = found
        return block, f"{block}.{name}" if block else name, gamma
    return None


def explain_params(params: List[ParamRecord], view: View, scale: float, vanish: float) -> List[Explained]:
    """Run the rules on every trainable parameter flagged ``vanishing`` or ``zero-grad``; set
    ``expected`` on the ones explained."""
    found = []
    for p in params:
        if not p.trainable or not {"vanishing", "zero-grad"} & set(p.flags):
            continue
        why = (key_bias(p, view) or bias_before_batch_norm(p, view) or shift_invariant_bias(p, view)
               or layer_scale(p, view, scale, vanish))
        if why is not None:
            p.expected = why.why
            found.append(why)
    return found


def _count(group: List[Explained], one: str, many: str) -> str:
    """``1 bias … gets`` / ``3 biases … get``: the count, the noun and the verb agreeing."""
    n = len(group)
    return f"{n} {one} gets" if n == 1 else f"{n} {many} get"


def _names(group: List[Explained]) -> str:
    names = [e.param for e in group]
    return ", ".join(names[:6]) + (f" … ({len(names)} in all)" if len(names) > 6 else "")


def _key_bias_note(group: List[Explained]) -> str:
    worst = max(e.data["cancelled"] for e in group)
    who = _count(group, "attention key bias", "attention key biases")
    return (f"{who} a zero gradient by construction: softmax is shift-invariant along the key "
            "axis (the key bias adds the same q·b to every logit of a query), so there is nothing "
            f"to fix; measured ‖∂L/∂b‖ ≤ {worst:.1g} × the gradient at the {_against(group)} output: "
            f"{_names(group)}")


def _against(group: List[Explained]) -> str:
    """Where the measured cancellation was compared: the key projection's output, or the attention's
    where a functional attention applies the projection itself (the key module never runs)."""
    kinds = {e.data.get("against", "key") for e in group}
    return "key" if kinds == {"key"} else "attention" if kinds == {"attention"} else "key (or attention)"


def _bias_norm_note(group: List[Explained]) -> str:
    worst = max(e.data["cancelled"] for e in group)
    who = _count(group, "bias whose shift reaches a batch-statistics normalisation",
                 "biases whose shift reaches a batch-statistics normalisation")
    return (f"{who} a zero gradient by construction: the norm subtracts the per-channel mean, "
            "bias included (a Conv/Linear right before it is usually built with bias=False); measured "
            f"‖∂L/∂b‖ ≤ {worst:.1g} × the gradient at the layer's output: {_names(group)}")


def _shift_note(group: List[Explained]) -> str:
    worst = max(e.data["cancelled"] for e in group)
    who = _count(group, "bias", "biases")
    return (f"{who} a zero gradient by construction: the output gradient of its layer sums to zero over "
            "positions in every channel, so what follows ignores a shift shared by every position — softmax "
            "is shift-invariant along them (attention pooling scores, attention logits) — and there is "
            f"nothing to fix; measured ‖∂L/∂b‖ ≤ {worst:.1g} × the gradient at the layer's output: {_names(group)}")


def _layer_scale_note(group: List[Explained]) -> str:
    gamma = max(e.data["gamma_value"] for e in group)
    worst = min(e.data["over_gamma"] for e in group)
    who = _count(group, "parameter inside a block", "parameters inside blocks")
    return (f"{who} small gradients by design (layer scale γ={gamma:.0e} at init): the branch "
            "output is multiplied by γ, so the gradient into it is γ × the block's; divided by γ "
            f"they are in range (smallest ‖grad‖/γ = {worst:.3g}), and γ grows as it trains: "
            f"{_names(group)}")


_NOTES = (("key-bias", _key_bias_note), ("bias-before-norm", _bias_norm_note),
          ("shift-invariant-bias", _shift_note), ("layer-scale", _layer_scale_note))


def notes_for(explained: List[Explained]) -> List[Problem]:
    """One note per rule, naming every parameter it explains."""
    notes = []
    for rule, text in _NOTES:
        group = [e for e in explained if e.rule == rule]
        if group:
            names = [e.param for e in group]
            notes.append(Problem(f"expected-grad:{rule}", text(group), where=names[0], severity="info",
                                 data={"params": names}))
    return notes
