"""Why no gradient arrives at a module: the op between it and the loss that passes exactly none.

:mod:`~.frozen` reports ``zero-grad`` when a module's parameters get an exactly-0 gradient at every
step although the loss's graph reaches them. When no dead ReLU explains it and the module's own
output receives a zero gradient, it can only say "something between it and the loss passes none".
This module looks for that something in the autograd graph of one more forward (on the trained
copy, without changing it: for these modules the weights never moved) and names it:

* **a multiply by exactly 0**: a ``MulBackward`` node whose other operand is 0 everywhere — a
  residual branch scaled by a plain float ``self.res_scale = 0.0`` (meant as a learnable ReZero
  gate, which would be an ``nn.Parameter`` and learn), a mask of zeros. Its gradient to the branch
  is ``grad × 0``;
* **a saturated squashing op**: a tanh whose every output is exactly ±1, a sigmoid whose every
  output is exactly 0 or 1 (read from the node's saved result, so ``nn.Tanh`` and ``torch.tanh``
  alike). Its derivative, ``1 − y²`` or ``y(1 − y)``, is then exactly 0 in float arithmetic. The
  usual cause is an input far too large — weights initialised to a large constant
  (``nn.init.constant_(w, 5)``), unnormalised inputs — so the layer that feeds it is named with
  its weights' scale, and a weight that is one constant everywhere is said (every unit then
  computes the same thing);
* **a dead functional ReLU**: a ``torch.relu``/``F.relu`` (no module for :mod:`~.frozen`'s watch
  to hook) whose every output is exactly 0 — its input is ≤ 0 everywhere, so its gradient is 0.
  Named with the layer feeding it (a large negative bias); the prediction is then the same for every
  sample, which is this cause's doing, not an input the model ignores (``constant-output`` is dropped).

Only exact zeros are claimed; a tiny-but-nonzero gradient is :mod:`~.vanishing`'s. The finding's
message and hint are amended in place; nothing is found → the generic message stays.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from layerlab.errors import Problem
from layerlab.target.bind import flatten
from layerlab.target.graph import graph_nodes

__all__ = ["amend"]

_GENERIC = "something between it and the loss passes none"
_MAX_NODES = 20_000  # a graph walk bound: a huge model's graph is not searched


def _saved(node: Any, name: str) -> Optional[torch.Tensor]:
    try:
        value = getattr(node, name)
    except Exception:  # freed, or not saved for this operand
        return None
    return value if isinstance(value, torch.Tensor) else None


def _killer(node: Any) -> Optional[Tuple[str, Set[int]]]:
    """``(what, operand indices whose gradient is exactly 0)`` for a node that passes none, else None."""
    name = type(node).__name__
    if name.startswith("MulBackward"):
        dead = set()
        for i, other in ((0, "_saved_other"), (1, "_saved_self")):
            t = _saved(node, other)
            if t is not None and t.numel() and not bool((t != 0).any()):
                dead.add(i)
        if dead:
            return "a multiply by 0 (the other factor is 0 everywhere: a constant 0.0 scale, an all-zero mask)", dead
    if name == "TanhBackward0":
        y = _saved(node, "_saved_result")
        if y is not None and y.numel() and bool((y.abs() == 1).all()):
            return "a tanh whose every output is exactly ±1 (saturated: its gradient 1 − y² is 0)", {0}
    if name == "SigmoidBackward0":
        y = _saved(node, "_saved_result")
        if y is not None and y.numel() and bool(((y == 0) | (y == 1)).all()):
            return "a sigmoid whose every output is exactly 0 or 1 (saturated: its gradient y(1 − y) is 0)", {0}
    if name == "ReluBackward0":  # nn.ReLU modules are frozen.Watch's; a functional relu is seen only here
        y = _saved(node, "_saved_result")
        if y is not None and y.numel() and not bool((y != 0).any()):
            return "a relu whose every output is 0 (dead: its input is ≤ 0 everywhere, so it passes no gradient)", {0}
    return None


def _below(node: Any) -> Set[int]:
    """ids of every node reachable from ``node`` (towards the leaves)."""
    return {id(n) for n in graph_nodes([node], _MAX_NODES)}


def _near(start: Any, node: Any, hops: int = 3) -> bool:
    """``node`` is among the first ``hops`` levels of the graph below ``start`` (a module's direct input)."""
    level = [start]
    for _ in range(hops):
        level = [m for n in level if n is not None for m, _ in n.next_functions]
        if any(n is node for n in level):
            return True
    return False


def _feeder(made: Dict[int, str], node: Any, model: torch.nn.Module) -> str:
    """The module whose output feeds ``node``'s first operand, with its weight's scale."""
    source = node.next_functions[0][0] if node.next_functions else None
    path = made.get(id(source)) if source is not None else None
    if path is None:
        return ""
    w = getattr(model.get_submodule(path), "weight", None) if path != "(root)" else None
    if not isinstance(w, torch.Tensor) or w.numel() < 2:
        return f"; its input comes from {path}"
    w = w.detach()
    if bool((w == w.flatten()[0]).all()):
        return (f"; its input comes from {path}, whose weight is the constant {float(w.flatten()[0]):.3g} "
                "everywhere (every unit computes the same thing, and large)")
    return f"; its input comes from {path} (weight max |w| {float(w.abs().max()):.3g}, std {float(w.std()):.3g})"


def amend(flags: List[Problem], model: torch.nn.Module, positional: list, keyword: Dict[str, Any],
          objective: Any) -> None:
    stuck = [f for f in flags if f.code == "zero-grad" and f.severity == "error" and _GENERIC in f.message]
    if not stuck or objective is None:
        return
    outputs: Dict[str, Any] = {}  # module path → grad_fn of its output
    made: Dict[int, str] = {}  # grad_fn id → innermost module that produced it

    def hook(module, _inputs, output, path=None):
        for _, t in flatten(output):
            if t.grad_fn is not None:
                outputs.setdefault(path, t.grad_fn)
                made.setdefault(id(t.grad_fn), path)

    handles = [m.register_forward_hook(lambda mod, i, o, p=(p or "(root)"): hook(mod, i, o, p))
               for p, m in model.named_modules()]
    try:
        with torch.random.fork_rng(devices=[]):
            value = objective(model(*positional, **keyword))
    except Exception:  # evidence only: the run's own forward succeeded
        return
    finally:
        for h in handles:
            h.remove()
    killers: List[Tuple[Any, str, Set[int]]] = []
    for node in graph_nodes([value.grad_fn] if isinstance(value, torch.Tensor) else [], _MAX_NODES):
        found = _killer(node)
        if found is not None:
            killers.append((node, *found))
    if not killers:
        return
    for flag in stuck:
        start = outputs.get(flag.where)
        if start is None:
            continue
        blamed = []
        for node, what, dead in killers:
            if any(node.next_functions[i][0] is not None and id(start) in _below(node.next_functions[i][0])
                   for i in dead if i < len(node.next_functions)):
                where = made.get(id(node))
                blamed.append(f"{what}" + (f" at {where}" if where else " inside forward") +
                              (_feeder(made, node, model) if "saturated" in what or "dead" in what else ""))
        if not blamed:
            continue
        flag.message = flag.message.split("; no gradient signal arrives")[0] + (
            f"; no gradient signal arrives at {flag.where}: on its way to the loss it passes " + "; and ".join(blamed))
        flag.data["cause"] = blamed
        flag.hint = ("a saturated tanh/sigmoid: make its input smaller — the default (or Xavier) init instead of a "
                     "large constant, normalised inputs, a LayerNorm before it" if all("saturated" in b for b in blamed)
                     else "a dead relu: look at the bias/initialisation feeding it (a large negative bias), or "
                     "use LeakyReLU/GELU" if all("dead" in b for b in blamed)
                     else "a 0 factor: make the scale a learnable nn.Parameter (ReZero) or non-zero, or fix the mask"
                     if all("multiply" in b for b in blamed) else "see each cause named above")
    dead = [(node, made.get(id(node))) for node, what, _ in killers if what.startswith("a relu")]
    if any("dead" in b for f in stuck for b in f.data.get("cause", [])):
        # every later output is then the same: the same-prediction error would blame the inputs
        flags[:] = [f for f in flags if f.code != "constant-output"]
        for f in flags:  # a layer right after the dead relu reads only zeros: not "this batch's" doing
            start = outputs.get(f.where) if f.code == "zero-grad" and f.severity == "warning" else None
            if start is not None and any(_near(start, node) for node, _ in dead):
                f.message = f.message.split("; a gradient does reach")[0] + (
                    "; its input is the output of a dead relu (0 for every sample at every step), so what it "
                    "multiplies is 0 and it will not learn until that relu is alive")
                f.hint = "fix the dead relu feeding it (see the zero-grad error above)"
