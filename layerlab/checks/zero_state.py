"""Recurrent weights whose all-zero gradient the values explain: a zero state, or dead ReLU units.

In ``h_t = f(W_ih·x_t + b_ih + W_hh·h_{t-1} + b_hh)`` the gradients are sums over steps and
samples of outer products: ``∂W_hh = Σ δ_t·h_{t-1}ᵀ``, ``∂W_ih = Σ δ_t·x_tᵀ``, ``∂b = Σ δ_t``, with
``δ_t`` the gradient at the pre-activation. So a gradient is exactly zero, however correct the
code, when

* every state ``W_hh`` multiplies is zero: an ``nn.RNNCell``/``LSTMCell``/``GRUCell`` called
  without ``hx``, a one-step sequence without ``h0`` (*by design*: nothing is wrong);
* in a ReLU recurrence, at every step either the unit's output is exactly 0 (``relu' = 0``, so
  ``δ_t = 0``) or the vector it multiplies is (*dead ReLU units*: the code is right, the values
  are not healthy).

:class:`ZeroStateWatch` records, with forward hooks on the copy under test, what each recurrent
submodule saw. A cell's call is one step. For ``nn.RNN``/``LSTM``/``GRU`` torch's fused kernel
exposes only the last layer's outputs, so the states of every layer and direction are recomputed
one layer at a time by single-layer torch modules carrying that layer's weights (eval, no
dropout), and only when some gradient came out all zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

#: why an all-zero gradient is right (``by_design``) or explained by dead units (``dead_relu``)
ZERO_INIT = "it multiplies only the initial hidden state, which is zero (no hx passed)"
ZERO_STATES = "every hidden state it multiplies is exactly 0"
DEAD_RELU = ("dead ReLU units: at every step the unit's output is exactly 0 (no gradient through the ReLU) "
             "or the vector it multiplies is")


@dataclass
class Steps:
    """What one group of weights (one layer and direction, or one cell) saw, step by step."""

    relu: bool
    prev_zero: bool = True  # every state W_hh multiplied was exactly 0
    hh_dead: bool = True  # each step: the unit's output or the state it multiplies was 0
    ih_dead: bool = True  # each step: the unit's output or the input it multiplies was 0
    all_dead: bool = True  # each step: the unit's output was 0
    one_step: bool = True  # only ever one step (the initial state is the only state)

    def add(self, out: Tensor, prev: Optional[Tensor], x: Tensor) -> None:
        """One step or a ``(T, B, ·)`` sequence, in processing order; ``prev`` ``None`` = zeros."""
        zero = lambda t: (t == 0).reshape(*t.shape[:-1], -1).all(-1) if t.dim() else (t == 0)  # noqa: E731
        dead = zero(out)
        prev_zero = torch.ones_like(dead) if prev is None else zero(prev)
        self.prev_zero &= bool(prev_zero.all())
        self.hh_dead &= bool((dead | prev_zero).all())
        self.ih_dead &= bool((dead | zero(x)).all())
        self.all_dead &= bool(dead.all())

    def verdict(self, local: str) -> Optional[Tuple[str, str]]:
        """``(kind, why)`` for a parameter of this group with an all-zero gradient, or ``None``."""
        if local.startswith("weight_hh") and self.prev_zero and (self.one_step or not self.relu):
            return "by_design", ZERO_INIT if self.one_step else ZERO_STATES
        if not self.relu:
            return None
        if (local.startswith("weight_hh") and self.hh_dead) or (local.startswith("weight_ih") and self.ih_dead) \
                or (local.startswith("bias_") and self.all_dead):
            return "dead_relu", DEAD_RELU
        return None


def _state(hx: Any) -> Any:
    """An LSTM's ``(h, c)`` by its ``h``: the state ``W_hh`` multiplies."""
    return hx[0] if isinstance(hx, (tuple, list)) and hx else hx


def _call_inputs(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Any]:
    x = args[0] if args else kwargs.get("input")
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    return x, hx


def _detached(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value


class ZeroStateWatch:
    """Context manager: watches the recurrent submodules of ``module`` while it runs.

    >>> with ZeroStateWatch(m) as watch:
    ...     out = m(x)
    >>> watch.explain(["weight_hh"])   # {"weight_hh": ("by_design", why)}
    """

    def __init__(self, module: nn.Module):
        self.module = module
        self.cells: Dict[str, Steps] = {}
        self.layers: Dict[str, List[Tuple[Any, Any]]] = {}  # prefix → (input, hx) of each call
        self._handles: List[Any] = []

    def __enter__(self) -> "ZeroStateWatch":
        for prefix, sub in self.module.named_modules():
            if isinstance(sub, nn.RNNCellBase):
                self._handles.append(sub.register_forward_hook(self._cell_hook(prefix), with_kwargs=True))
            elif isinstance(sub, nn.RNNBase):
                self._handles.append(sub.register_forward_pre_hook(self._layer_hook(prefix), with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _cell_hook(self, prefix: str):
        def post(mod, args, kwargs, out):
            x, hx = _call_inputs(args, kwargs)
            h = _state(out)
            if not isinstance(x, Tensor) or not isinstance(h, Tensor):
                return
            steps = self.cells.setdefault(prefix, Steps(relu=getattr(mod, "nonlinearity", None) == "relu"))
            prev = _state(hx)
            steps.add(h.detach(), prev.detach() if isinstance(prev, Tensor) else None, x.detach())
        return post

    def _layer_hook(self, prefix: str):
        def pre(mod, args, kwargs):
            self.layers.setdefault(prefix, []).append(_detached(_call_inputs(args, kwargs)))
        return pre

    def explain(self, zero_grads: Sequence[str]) -> Dict[str, Tuple[str, str]]:
        """``{parameter: (kind, why)}`` for the parameters in ``zero_grads`` (all-zero gradients)
        that the recorded values explain; ``kind`` is ``by_design`` or ``dead_relu``."""
        groups: Dict[str, Steps] = {}
        for prefix, steps in self.cells.items():
            groups[prefix + "." if prefix else ""] = steps
        subs = dict(self.module.named_modules())
        for prefix, calls in self.layers.items():
            head = prefix + "." if prefix else ""
            if not any(n.startswith(head) and "." not in n[len(head):] for n in zero_grads):
                continue
            for x, hx in calls:
                for suffix, steps in _layer_steps(subs[prefix], x, hx).items():
                    key = f"{head}{suffix}"
                    if key in groups:  # one more call: fold it in
                        old = groups[key]
                        for f in ("prev_zero", "hh_dead", "ih_dead", "all_dead", "one_step"):
                            setattr(old, f, getattr(old, f) and getattr(steps, f))
                    else:
                        groups[key] = steps
        out: Dict[str, Tuple[str, str]] = {}
        for name in zero_grads:
            head, _, local = name.rpartition(".")
            head = head + "." if head else ""
            suffix = re.search(r"_l\d+(_reverse)?$", local)
            steps = groups.get(head + (suffix.group(0) if suffix else ""))
            verdict = steps.verdict(local) if steps is not None else None
            if verdict is not None:
                out[name] = verdict
        return out


def _single_layer(rnn: nn.RNNBase, layer: int, input_size: int) -> Optional[nn.RNNBase]:
    """A one-layer torch module carrying ``rnn``'s weights of ``layer`` (``None``: unknown mode)."""
    p = next(rnn.parameters())
    kw = dict(input_size=input_size, hidden_size=rnn.hidden_size, num_layers=1, bias=rnn.bias,
              batch_first=rnn.batch_first, bidirectional=rnn.bidirectional, device=p.device, dtype=p.dtype)
    if rnn.mode in ("RNN_TANH", "RNN_RELU"):
        m: nn.RNNBase = nn.RNN(nonlinearity="relu" if rnn.mode == "RNN_RELU" else "tanh", **kw)
    elif rnn.mode == "LSTM":
        m = nn.LSTM(proj_size=rnn.proj_size, **kw)
    elif rnn.mode == "GRU":
        m = nn.GRU(**kw)
    else:
        return None
    with torch.no_grad():
        for name, param in m.named_parameters():
            param.copy_(getattr(rnn, name.replace("_l0", f"_l{layer}", 1)))
    return m.eval()


def _layer_steps(rnn: nn.RNNBase, x: Any, hx: Any) -> Dict[str, Steps]:
    """``{"_l0": Steps, "_l0_reverse": …}`` for one call of an ``nn.RNN``/``LSTM``/``GRU``."""
    if not isinstance(x, Tensor) or next(rnn.parameters(), None) is None:
        return {}  # a PackedSequence, or a layer without weights: no explanation offered
    h0 = _state(hx)
    D = 2 if rnn.bidirectional else 1
    H = rnn.proj_size or rnn.hidden_size
    unbatched = x.dim() == 2

    def tbh(t: Tensor) -> Tensor:  # (T, B, ·) in time order
        return t.unsqueeze(1) if unbatched else (t.transpose(0, 1) if rnn.batch_first else t)

    out: Dict[str, Steps] = {}
    inp = x
    for layer in range(rnn.num_layers):
        single = _single_layer(rnn, layer, inp.shape[-1])
        if single is None:
            return {}
        state = None
        if h0 is not None:
            h = h0.narrow(0, layer * D, D)
            state = (h, hx[1].narrow(0, layer * D, D)) if isinstance(hx, (tuple, list)) else h
        with torch.no_grad():
            y = single(inp, state)[0]
        xs, ys = tbh(inp), tbh(y)
        for d in range(D):
            yd = ys[..., d * H:(d + 1) * H]
            xd = xs
            if d == 1:  # the reverse direction processes time backwards
                yd, xd = yd.flip(0), xd.flip(0)
            first = None if h0 is None else (h0[layer * D + d].unsqueeze(0) if not unbatched
                                             else h0[layer * D + d].reshape(1, 1, -1))
            steps = Steps(relu=rnn.mode == "RNN_RELU", one_step=yd.shape[0] == 1)
            if first is None:  # the zero initial state, then the fed-back outputs
                steps.add(yd[:1], None, xd[:1])
                if yd.shape[0] > 1:
                    steps.add(yd[1:], yd[:-1], xd[1:])
            else:
                steps.add(yd, torch.cat([first.expand(1, *yd.shape[1:]), yd[:-1]]), xd)
            out[f"_l{layer}{'_reverse' if d else ''}"] = steps
        inp = y
    return out
