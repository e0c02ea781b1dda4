"""Known wrong formulas: when ours differs from a torch.nn reference, is it a textbook variant?

A float64 difference says *that* a hand-written layer is not its torch counterpart. Some
differences are classic, well-defined alternatives of the same layer that papers, blog posts
and older libraries use, and each has one exact fix. Each variant below is the torch module's
own forward with one thing changed, run on the reference's weights: if ours equals it exactly
(float64, ``assert_close`` tolerances), that *is* what ours computes, and the report can say so.

* **ConvNd, kernel flipped**: a true convolution (``weight.flip`` over the spatial dims, or
  ``unfold`` with the kernel reversed), where torch's ``ConvNd`` is a cross-correlation;
* **GELU, the other form**: the tanh approximation where the reference is exact (erf), or back;
* **GRUCell, the reset gate**: ``r ⊙ (W_hn h)`` with ``b_hn`` outside (torch puts it inside:
  ``r ⊙ (W_hn h + b_hn)``), or ``W_hn (r ⊙ h)`` (Cho et al. 2014); and the update gate read the
  other way round (``z ⊙ n + (1 − z) ⊙ h``);
* **GroupNorm, channels interleaved**: group g holding channels ``g, g+G, …`` (a
  ``view(B, C//G, G, …)``) where torch groups consecutive channels (``view(B, G, C//G, …)``).

Nothing is claimed unless the outputs agree exactly; the caller keeps its plain verdict otherwise.

Legend: B batch · C channels · G groups · h hidden state · r, z, n the GRU's reset, update and new gates.
"""

from __future__ import annotations

import copy
import types
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["known_variant", "flipped_kernel"]


def flipped_kernel(reference: Any) -> Any:
    """A copy of ``reference`` (a ConvNd, or an adapter holding one) with its kernel flipped."""
    from layerlab.checks.divergence import unwrap

    ref = copy.deepcopy(reference)
    conv = unwrap(ref)
    with torch.no_grad():
        w = conv.weight
        w.copy_(w.flip(tuple(range(2, w.dim()))))
    return ref


def _conv_flip(ref: nn.Module) -> Optional[Dict[str, Any]]:
    if not isinstance(ref, nn.modules.conv._ConvNd) or ref.weight.dim() < 3:
        return None
    dims = ", ".join(str(d) for d in range(2, ref.weight.dim()))

    def change(m: nn.Module) -> None:
        with torch.no_grad():
            m.weight.copy_(m.weight.flip(tuple(range(2, m.weight.dim()))))

    return {"change": change, "kind": "flipped_kernel", "where": "weight",
            "text": "the difference vanishes when the reference's kernel is flipped: this layer computes a true "
                    f"convolution (kernel reversed along dims {dims}), torch's {type(ref).__name__} a "
                    "cross-correlation",
            "hint": "do not flip the kernel: torch's conv multiplies the input window by weight as stored "
                    "(cross-correlation); remove the .flip (or the reversed index) before the unfold/matmul"}


def _gelu(ref: nn.Module) -> Optional[Dict[str, Any]]:
    if not isinstance(ref, nn.GELU):
        return None
    other = "tanh" if ref.approximate == "none" else "none"
    names = {"tanh": "the tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))", "none": "the exact erf form"}

    def change(m: nn.Module) -> None:
        m.approximate = other

    return {"change": change, "kind": "gelu_form", "where": "GELU formula",
            "text": f"ours equals GELU(approximate={other!r}): {names[other]}, where the reference is "
                    f"{names[ref.approximate]}",
            "hint": f"use F.gelu(x, approximate={ref.approximate!r}) (the tanh form differs by up to ~5e-4), or make "
                    f"the reference GELU(approximate={other!r}) if the approximation is intended"}


def _gru_forward(where: str) -> Callable:
    def forward(self: nn.GRUCell, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        if hx is None:
            hx = input.new_zeros(*input.shape[:-1], self.hidden_size)
        gi = F.linear(input, self.weight_ih, self.bias_ih)
        i_r, i_z, i_n = gi.chunk(3, -1)
        w_r, w_z, w_n = self.weight_hh.chunk(3, 0)
        b_r, b_z, b_n = (self.bias_hh if self.bias_hh is not None else torch.zeros_like(self.weight_hh[:, 0])).chunk(3)
        r = torch.sigmoid(i_r + F.linear(hx, w_r, b_r))
        z = torch.sigmoid(i_z + F.linear(hx, w_z, b_z))
        if where == "bias_outside":
            n = torch.tanh(i_n + r * F.linear(hx, w_n) + b_n)
        elif where == "before_matmul":
            n = torch.tanh(i_n + F.linear(r * hx, w_n, b_n))
        else:
            n = torch.tanh(i_n + r * F.linear(hx, w_n, b_n))
        if where == "update_swapped":
            return z * n + (1 - z) * hx
        return (1 - z) * n + z * hx
    return forward


_GRU = {
    "bias_outside": ("the reset gate multiplies W_hn·h only, with b_hn added outside: n = tanh(W_in x + b_in + "
                     "r ⊙ (W_hn h) + b_hn)", "torch computes n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)): "
                     "put b_hn inside the reset gate's product"),
    "before_matmul": ("the reset gate is applied to h before W_hn: n = tanh(W_in x + b_in + W_hn (r ⊙ h) + b_hn) "
                      "(Cho et al. 2014)", "torch applies r after the matmul: n = tanh(W_in x + b_in + "
                      "r ⊙ (W_hn h + b_hn))"),
    "update_swapped": ("the update gate is read the other way round: h' = z ⊙ n + (1 − z) ⊙ h",
                       "torch computes h' = (1 − z) ⊙ n + z ⊙ h"),
}


def _gru_cell(ref: nn.Module) -> List[Dict[str, Any]]:
    if type(ref) is not nn.GRUCell:
        return []
    out = []
    for where, (text, hint) in _GRU.items():
        def change(m: nn.Module, w=where) -> None:
            m.forward = types.MethodType(_gru_forward(w), m)
        out.append({"change": change, "kind": "gru_formula", "where": "reset/update gate formula",
                    "text": f"ours equals GRUCell where {text}", "hint": hint})
    return out


def _group_norm(ref: nn.Module) -> Optional[Dict[str, Any]]:
    if not isinstance(ref, nn.GroupNorm) or ref.num_groups in (1, ref.num_channels):
        return None
    G, C = ref.num_groups, ref.num_channels

    def forward(self: nn.GroupNorm, x: Tensor) -> Tensor:
        order = torch.arange(C).view(C // G, G).t().reshape(-1)  # group g: channels g, g+G, …
        y = F.group_norm(x[:, order], G, None, None, self.eps)[:, torch.argsort(order)]
        if self.weight is None:
            return y
        shape = (1, C) + (1,) * (x.dim() - 2)
        return y * self.weight.view(shape) + self.bias.view(shape)

    def change(m: nn.Module) -> None:
        m.forward = types.MethodType(forward, m)

    return {"change": change, "kind": "group_order", "where": "channel grouping",
            "text": f"ours equals GroupNorm with channels interleaved: group g holds channels g, g+{G}, … (a "
                    f"view(B, C//G, G, …)), torch's holds {C // G} consecutive channels",
            "hint": f"group consecutive channels as torch does: x.view(B, {G}, {C // G}, …) (groups first)"}


def candidates(ref: nn.Module) -> List[Dict[str, Any]]:
    """The variants that apply to ``ref`` (each with its ``change(module)``, text and hint)."""
    found = [_conv_flip(ref), _gelu(ref), _group_norm(ref)] + _gru_cell(ref)
    return [c for c in found if c is not None]


def known_variant(reference: Any, out_o: Any, agree: Callable[[Any, Any], bool],
                  run: Callable[[Any], Any]) -> Optional[Dict[str, Any]]:
    """The first variant whose output equals ours ``out_o``, as a hypothesis dict, or ``None``.

    ``run(ref)`` calls a reference copy on the case's float64 inputs; ``agree`` compares outputs."""
    from layerlab.checks.divergence import unwrap

    base = unwrap(reference)
    if not isinstance(base, nn.Module):
        return None
    for cand in candidates(base):
        ref = copy.deepcopy(reference)
        cand["change"](unwrap(ref))
        try:
            with torch.no_grad():
                out_v = run(ref)
        except Exception:  # a variant that cannot run on these inputs explains nothing
            continue
        if agree(out_o, out_v):
            return {k: v for k, v in cand.items() if k != "change"}
    return None
