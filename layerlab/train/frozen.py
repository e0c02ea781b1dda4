"""Parameters that never changed, and why; dead ReLUs; layers that train/eval mode switched off.

What is seen, and how:

* **which parameters the loss can reach**: the autograd graph of the first step's loss, walked from
  ``loss.grad_fn`` to its ``AccumulateGrad`` leaves (each holds the parameter it feeds), before
  backward frees it. The same walk from every *other* output of the model tells a parameter that
  feeds only an output the loss does not read (``wrong-output``: the model returns
  ``(logits, aux)``, the loss reads ``aux``, the head never trains) from one that feeds nothing.
  That is an error when the user named the output the loss reads; when layerlab's default rule
  picked it (a ``BertModel`` returns ``last_hidden_state`` and ``pooler_output``, the loss reads the
  first), the module is only outside *this check's* loss, not the user's: ``unread-output``, a warning;
* **which modules ran, and with gradients on**: forward hooks on the first step. A module that
  never ran is unused; one whose outputs carry no graph ran under ``torch.no_grad``; one that ran
  with a graph that never reaches the loss was cut off (``.detach()``, ``.data``) or its output
  was dropped — layerlab cannot tell those two apart and says so;
* **gradients exactly 0 at every step** while a path exists (``zero-grad``): something on the path
  passes nothing. ReLU/ReLU6 modules whose every output is 0 at every step are named as the likely
  cause (``dead-relu``), with what their input shows: exactly 0 (zero-initialised weights before
  it) or negative (a large negative bias); a ReLU called as a function (``F.relu``) is invisible to
  module hooks;
* **not in the optimizer**, **requires_grad=False** (a warning: freezing a backbone is often meant).

Findings about many parameters are grouped under the outermost module all of whose parameters
share the finding (``branch`` rather than ``branch.0.weight``, ``branch.0.bias``, …).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set

import torch
from torch import nn

from layerlab.errors import Problem
from layerlab.target.bind import flatten

__all__ = ["Watch", "reachable", "parameter_findings", "mode_findings", "active_dropout"]

_RELUS = (nn.ReLU, nn.ReLU6)
_DROPOUTS = (nn.modules.dropout._DropoutNd,)
_NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)


def reachable(roots: Iterable[torch.Tensor]) -> Set[int]:
    """ids of the leaf tensors (parameters) the autograd graph of ``roots`` leads to."""
    from layerlab.train.unregistered import leaves

    return {id(t) for t in leaves(roots)}


class Watch:
    """Forward hooks: which modules ran on the first step (and with a graph), and ReLUs' liveness."""

    def __init__(self, model: nn.Module) -> None:
        self.paths = {id(m): p for p, m in model.named_modules()}
        #: paths of the recurrent modules (a zero gradient there may be its default zero state)
        self.recurrent = {p for p, m in model.named_modules()
                          if isinstance(m, (nn.RNNBase, nn.RNNCellBase)) or hasattr(m, "hidden_size")}
        self.called: Set[str] = set()
        self.with_graph: Set[str] = set()
        self.relu_alive: Dict[str, bool] = {}
        self.relu_calls: Dict[str, int] = {}
        self.relu_fed_zero: Dict[str, Optional[bool]] = {}  #: input exactly 0 at every step (None: unknown)
        #: module path → whether a non-zero gradient reached its output on the first step
        self.output_grad: Dict[str, bool] = {}
        #: (autograd node that made a module's output on the first step, the innermost such module);
        #: the nodes are held (an id alone could be reused once its Python wrapper is freed)
        self.made_by: List[Any] = []
        self.first = True
        self._handles = [m.register_forward_hook(self._hook) for m in model.modules()]

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        path = self.paths.get(id(module), "?")
        if self.first:
            self.called.add(path)
            for _, t in flatten(output):
                if t.grad_fn is not None:  # hooks fire innermost first: the first pair for a node wins
                    self.made_by.append((t.grad_fn, path))
                if t.requires_grad:
                    self.with_graph.add(path)
                    t.register_hook(self._grad_seen(path))
        if isinstance(module, _RELUS) and isinstance(output, torch.Tensor):
            self.relu_calls[path] = self.relu_calls.get(path, 0) + 1
            with torch.no_grad():
                alive = bool((output != 0).any())
                # an input exactly 0 (not negative) everywhere: the layer before outputs 0 (a zero init);
                # an in-place ReLU has overwritten its input, so that is unknown (None)
                fed = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
                zero = None if fed is None or getattr(module, "inplace", False) else not bool((fed != 0).any())
            self.relu_alive[path] = self.relu_alive.get(path, False) or alive
            previous = self.relu_fed_zero.get(path, True)
            self.relu_fed_zero[path] = None if zero is None or previous is None else previous and zero

    def _grad_seen(self, path: str):
        def hook(grad: torch.Tensor) -> None:
            self.output_grad[path] = self.output_grad.get(path, False) or bool((grad != 0).any())
        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.made_by = []

    def dead_relus(self) -> List[str]:
        return [p for p, alive in self.relu_alive.items() if not alive]

    def dead_relu_problem(self, path: str) -> Problem:
        """A dead ReLU, with the cause its input shows: exactly 0 (zero-initialised weights before it),
        negative (a large negative bias, a step too large), or unknown (an in-place ReLU)."""
        fed_zero = self.relu_fed_zero.get(path)
        if fed_zero:
            why = ("its input is exactly 0 everywhere, not negative: the layer before it computes 0 (all-zero "
                   "weights — a zero initialisation — or an all-zero batch)")
            hint = ("initialise weights randomly (nn.Linear's default, nn.init.kaiming_uniform_); zeros only suit "
                    "biases")
        elif fed_zero is False:
            why = "its input is ≤ 0 everywhere"
            hint = "a large negative bias (or a step that was too large) killed it"
        else:
            why = "it is in-place, so whether its input was 0 or negative is not seen"
            hint = "a large negative bias, all-zero weights before it, or a step that was too large"
        return Problem("dead-relu", f"ReLU {path}: every output is 0 at every step ({why}) — no gradient passes "
                       "it, so the layers before it stop learning", where=path, severity="error", hint=hint)


def _outermost(model: nn.Module, names: Set[str]) -> List[str]:
    """Module paths whose parameters all lie in ``names``, outermost first, none inside another; a
    parameter whose module also holds others not in ``names`` (a weight whose bias is fine) is
    reported under its own module."""
    picked: List[str] = []
    for path, module in model.named_modules():
        own = {f"{path}.{n}" if path else n for n, _ in module.named_parameters()}
        if not own or not own <= names:
            continue
        if any(path == p or p == "" or path.startswith(p + ".") for p in picked):
            continue
        picked.append(path)
    covered = {n for n in names if any(p == "" or n.startswith(p + ".") for p in picked)}
    for n in sorted(names - covered):
        owner = n.rpartition(".")[0]
        if next(model.get_submodule(owner).children(), None) is not None:
            picked.append(n)  # held by a block or the model itself (a mask embedding): named on its own
        elif owner not in picked:
            picked.append(owner)
    return picked


def _label(model: nn.Module, path: str) -> str:
    cls = type(model.get_submodule(path)).__name__
    return f"{path or '(root)'} ({cls})"


def parameter_findings(model: nn.Module, names: List[str], params: List[torch.Tensor], *, in_optimizer: Set[int],
                       had_grad: List[bool], nonzero_grad: List[bool], loss_reach: Set[int],
                       output_reach: Dict[str, Set[int]], loss_output: str, watch: Watch,
                       output_named: bool = True) -> List[Problem]:
    """One finding per reason and outermost module: see the module docstring. ``output_named``: the user
    named the output the loss reads (else a parameter feeding only other outputs is ``unread-output``)."""
    reasons: Dict[str, Set[str]] = {}
    for name, p, got, nonzero in zip(names, params, had_grad, nonzero_grad):
        if not p.requires_grad:
            code = "requires-grad-false"
        elif not got:
            elsewhere = any(id(p) in r for r in output_reach.values()) and id(p) not in loss_reach
            code = ("wrong-output" if output_named else "unread-output") if elsewhere else "no-grad"
        elif id(p) not in in_optimizer:
            code = "not-in-optimizer"
        elif not nonzero:
            code = "zero-grad"
        else:
            continue
        reasons.setdefault(code, set()).add(name)
    found: List[Problem] = []
    by_id = dict(zip(names, params))
    for code, members in reasons.items():
        for path in _outermost(model, members):
            own = [path] if path in members else [n for n in members if not path or n.startswith(path + ".")]
            found.append(_explain(code, model, path, own, by_id, output_reach, loss_output, watch))
    return found


def _explain(code: str, model: nn.Module, path: str, own: List[str], by_name: Dict[str, torch.Tensor],
             output_reach: Dict[str, Set[int]], loss_output: str, watch: Watch) -> Problem:
    data = {"params": own}
    if path in by_name:  # one parameter of a block (or of the model itself), not a module
        owner = path.rpartition(".")[0]
        who, where = f"{path} (a parameter of {_label(model, owner)})", path
        if code == "no-grad" and owner in watch.called:
            return Problem("no-grad", f"{who}: no gradient reaches it — its module ran, but its forward does not "
                           "use this parameter as the model is run here (one used only in another mode, or only for "
                           "some inputs, such as a mask embedding), or cuts it off (.detach()); it never changes", where=where,
                           severity="warning", data={**data, "called": True},
                           hint="expected if the parameter is only used in another mode or for other inputs; "
                                "otherwise check where forward reads it")
        path = owner  # what ran, and what its output got, are the module's
    else:
        who, where = _label(model, path), path or "(root)"
    if code == "requires-grad-false":
        return Problem(code, f"{who}: requires_grad=False, so it is never trained", where=where, severity="warning",
                       hint="fine for a frozen layer; otherwise set requires_grad=True", data=data)
    if code == "not-in-optimizer":
        return Problem(code, f"{who}: gets gradients, but the optimizer does not hold its parameters, so they "
                       "never change", where=where, severity="error",
                       hint="build the optimizer on model.parameters(), or add this module's parameters", data=data)
    if code == "wrong-output":
        ids = {id(by_name[n]) for n in own}
        feeds = [o for o, r in output_reach.items() if ids & r]
        return Problem(code, f"{who} feeds {', '.join(feeds)} only, but the loss reads {loss_output}: no gradient "
                       "reaches it and it is never trained", where=where, severity="error",
                       hint="make the loss read the output this module computes (output: in train:, output= in "
                            "Python), or check what forward returns", data={**data, "feeds": feeds})
    if code == "unread-output":
        ids = {id(by_name[n]) for n in own}
        feeds = [o for o, r in output_reach.items() if ids & r]
        return Problem(code, f"{who} feeds {', '.join(feeds)} only; this check's loss reads {loss_output}, which "
                       "layerlab picked by default, so no gradient reaches it here and it is not trained in this "
                       "check", where=where, severity="warning",
                       hint="name the output your training loss reads (output: in train:, output= in Python), or "
                            "give the model its labels so it returns its own loss", data={**data, "feeds": feeds})
    if code == "zero-grad":
        return _zero_grad(who, where, path, data, watch, model)
    if path not in watch.called:
        why = "it was never called in forward (unused)"
    elif path not in watch.with_graph:
        why = "it ran with gradients off (torch.no_grad / inference_mode), so its output carries no graph"
    else:
        why = ("it ran, but its output never reaches the loss: cut off by .detach()/.data, or computed and "
               "not used")
        off = [p for p in sorted(watch.called - watch.with_graph) if p and not any(  # outermost no_grad modules
            p.startswith(q + ".") for q in watch.called - watch.with_graph if q)]
        why += f", or fed to {', '.join(off[:3])}, which ran with gradients off (torch.no_grad)" if off else ""
    return Problem("no-grad", f"{who}: no gradient reaches its parameters — {why}; they never change", where=where,
                   severity="error", data={**data, "called": path in watch.called},
                   hint="remove the .detach()/no_grad on its path, or drop the module if it is not needed")


#: layers whose ``bias`` is added to their output: a constant shift per channel
_SHIFTED = (nn.Linear, nn.modules.conv._ConvNd, nn.GroupNorm, nn.LayerNorm) + _NORMS


def _biases_only(model: nn.Module, names: List[str]) -> bool:
    """Every parameter in ``names`` is the ``bias`` of a layer that adds it to its output."""
    owners = [n.rpartition(".") for n in names]
    return bool(names) and all(leaf == "bias" and isinstance(model.get_submodule(owner), _SHIFTED)
                               for owner, _, leaf in owners)


def _batch_statistics(model: nn.Module) -> List[str]:
    """Paths of the norms that normalise with the batch's own statistics as the model is (train-mode
    BatchNorm, InstanceNorm): they subtract the batch mean, so a shift made before them changes nothing."""
    return [p for p, m in model.named_modules()
            if isinstance(m, _NORMS) and (m.training or not m.track_running_stats)]


def by_construction(found: List[Problem]) -> List[str]:
    """The biases whose zero gradient is by construction (severity ``info``), said in one note."""
    constructed = [f for f in found if f.severity == "info"]
    if len(constructed) < 2:
        return [f.message for f in constructed]
    names = [n for f in constructed for n in f.data["params"]]
    return [f"{len(names)} biases get a gradient exactly 0 at every step although a gradient reaches their layers' "
            "outputs: a bias's gradient is its output gradient summed over the batch and positions, and the sum is 0 "
            "in every channel — a later softmax along that axis (shift-invariant) or a normalisation with the batch's "
            f"own statistics removes the shift: zero by construction, not a bug: {', '.join(names)}"]


def _zero_grad(who: str, where: str, path: str, data: dict, watch: Watch, model: nn.Module) -> Problem:
    """Zero because nothing arrives (the module's output gradient is 0: an error), because what the
    parameter multiplies is 0 in this batch (its output gradient is not: an RNN cell's zero state), or,
    for a bias, because its output gradient sums to 0 per channel: a later mean subtraction removes the
    shift (MobileNetV2's projection BatchNorm before the next block's train-mode BatchNorm; a softmax
    along the positions, which is shift-invariant: attention pooling's score bias). That last one is by
    construction, exactly 0 at every step while a gradient reaches the output: severity ``info``, which
    train-check says as a note (inspect's gradient_causes says the same of a bias whose sum cancels)."""
    dead = watch.dead_relus()
    data = {**data, "dead_relus": dead, "output_grad": watch.output_grad.get(path)}
    said = f"{who}: its gradient is exactly 0 at every step, so it never changes"
    if not dead and watch.output_grad.get(path) and _biases_only(model, data["params"]):
        said = (f"{who}: the gradient of {', '.join(data['params'])} is exactly 0 at every step although a gradient "
                f"reaches the output of {where}: a bias's gradient is that output gradient summed over the batch and "
                "positions, and the sum is 0 in every channel, so something after it removes any constant shift")
        norms = _batch_statistics(model)
        if norms:
            return Problem("zero-grad", f"{said} — most likely a normalisation with the batch's own statistics "
                           f"({len(norms)} in this model, such as {norms[0]}): zero by construction, not a bug",
                           where=where, severity="info", data=data)
        return Problem("zero-grad", f"{said}: a softmax along that axis (attention scores, attention pooling) is "
                       "shift-invariant, and a mean subtraction removes a shift too — zero by construction, not a "
                       "bug (the bias is redundant: bias=False)", where=where, severity="info", data=data)
    if dead:
        return Problem("zero-grad", f"{said}; ReLU {', '.join(dead)} output 0 everywhere at every step (dead), so "
                       "no gradient passes it", where=where, severity="error", data=data,
                       hint="look at the bias/initialisation feeding the ReLU, or use LeakyReLU/GELU")
    if watch.output_grad.get(path):
        if path in watch.recurrent:
            what, hint = ("an all-zero input or state, such as a recurrent cell's default zero hidden state",
                          "give it a non-zero input/state (hx) if it should learn from this batch")
        else:  # not a recurrent module: no hidden state to talk about
            what, hint = ("its input is all zeros here: all-padding tokens, a masked or zeroed input",
                          "look at what feeds it in this batch: it should learn once its input is not all 0")
        return Problem("zero-grad", f"{said}; a gradient does reach the output of {where}, so what this parameter "
                       f"multiplies is 0 in this batch ({what})", where=where, severity="warning", data=data,
                       hint=hint)
    return Problem("zero-grad", f"{said}; no gradient signal arrives at {where}: something between it and the loss "
                   "passes none (a saturated activation, a multiply by 0, a dead F.relu layerlab cannot see)",
                   where=where, severity="error", data=data, hint="inspect the layers after it: layerlab inspect")


def output_reach(output: Any, skip: str) -> Dict[str, Set[int]]:
    """Per output tensor other than ``skip`` (the one the loss reads): the parameters it depends on."""
    return {p: reachable([t]) for p, t in flatten(_plain(output)) if p != skip and t.grad_fn is not None}


def _plain(output: Any) -> Any:
    if hasattr(output, "to_tuple") and not isinstance(output, dict):
        return dict(output.items())
    return output


def active_dropout(model: nn.Module) -> bool:
    """A dropout module that drops something in the mode the model trained in."""
    return any(m.training and isinstance(m, _DROPOUTS) and getattr(m, "p", 0) > 0 for m in model.modules())


def mode_findings(model: nn.Module) -> Optional[Problem]:
    """Dropout and BatchNorm-type modules in eval mode while the model is being trained."""
    idle = [(p, m) for p, m in model.named_modules() if not m.training
            and ((isinstance(m, _DROPOUTS) and getattr(m, "p", 0) > 0)
                 or (isinstance(m, _NORMS) and getattr(m, "track_running_stats", False)))]
    if not idle:
        return None
    kinds = sorted({"dropout" if isinstance(m, _DROPOUTS) else "BatchNorm/InstanceNorm" for _, m in idle})
    names = ", ".join(p or "(root)" for p, _ in idle[:6]) + (f" and {len(idle) - 6} more" if len(idle) > 6 else "")
    effect = []
    if "dropout" in kinds:
        effect.append("dropout is inactive (nothing dropped)")
    if len(kinds) > 1 or "dropout" not in kinds:
        effect.append("normalisation uses its running statistics, not the batch's, and does not update them")
    return Problem("eval-mode", f"trained in eval mode: {names} — {'; '.join(effect)}", where=idle[0][0] or "(root)",
                   severity="warning", hint="a training loop calls model.train() (--mode train)",
                   data={"modules": [p for p, _ in idle]})
