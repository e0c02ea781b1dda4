"""Tensors the loss trains through that are not the model's parameters, so no optimizer holds them.

``model.parameters()`` lists only what a module *registered*: ``nn.Parameter`` attributes and the
parameters of submodules held as attributes, ``nn.ModuleList``/``nn.ModuleDict`` or ``nn.Sequential``.
Two common mistakes leave tensors that require grad outside it, and the loss still runs through
them: a plain tensor attribute (``self.w = torch.randn(8, 4, requires_grad=True)``) and layers kept
in a plain Python list or dict (``self.blocks = [nn.Linear(…) for _ in range(3)]``). The
optimizer a training loop builds on ``model.parameters()`` never holds them, so they never change
— and a loss that still falls (the registered layers learn) hides it.

They are seen in the first step's autograd graph: its ``AccumulateGrad`` leaves that are not model
parameters, named by the module attribute that holds them. A leaf no attribute holds was captured
from outside the model (a global tensor, a closure, a loss with its own weights); it is reported
as what it is, a tensor of a given shape, without guessing a name. A leaf that shares memory with
one of the model's inputs is the input itself, turned on inside forward (Hugging Face's
``Wav2Vec2FeatureEncoder`` sets ``input_values[:, None].requires_grad = True`` for gradient
checkpointing): an input is not a parameter to train, so it is not reported.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

import torch
from torch import nn

from layerlab.errors import Problem

__all__ = ["leaves", "attributes", "findings"]

# nn.Module's own bookkeeping: registered parameters/buffers/submodules are not "plain" attributes
_REGISTERED = ("_parameters", "_buffers", "_modules")


def leaves(roots: Iterable[torch.Tensor]) -> List[torch.Tensor]:
    """The leaf tensors that require grad which the autograd graph of ``roots`` accumulates into."""
    seen, found, out = set(), set(), []
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # AccumulateGrad
        if isinstance(variable, torch.Tensor) and id(variable) not in found:
            found.add(id(variable))
            out.append(variable)
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return out


def attributes(model: nn.Module) -> Dict[int, Tuple[str, str, str]]:
    """id of each tensor requiring grad that a module holds outside its registry → ``(attribute path, name, how it is held)``.

    ``how``: ``"tensor"`` (a plain tensor attribute) or the container and class of an unregistered
    module (``"list of Linear"``)."""
    found: Dict[int, Tuple[str, str, str]] = {}
    for path, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in _REGISTERED:
                continue
            where = f"{path}.{attr}" if path else attr
            _walk(value, where, where, None, found, depth=0)
    return found


def _walk(value: Any, root: str, name: str, container: Any, found: Dict[int, Tuple[str, str, str]],
          depth: int) -> None:
    if depth > 3:
        return
    if isinstance(value, torch.Tensor):
        if value.requires_grad:  # a plain constant (self.scale = torch.tensor(2.0)) is not a lost parameter
            # nn.Parameters in a plain list are already Parameters: their fix is nn.ParameterList, not nn.Parameter
            what = "Parameter" if isinstance(value, nn.Parameter) else "tensor"
            found.setdefault(id(value), (root, name, "tensor" if container is None else f"{container} of {what}"))
    elif isinstance(value, nn.Module):
        if container is None:  # a registered submodule lives in _modules, never here: skip odd cases
            return
        how = f"{container} of {type(value).__name__}"
        for n, p in value.named_parameters():
            if p.requires_grad:
                found.setdefault(id(p), (root, f"{name}.{n}", how))
    elif isinstance(value, (list, tuple)):
        kind = type(value).__name__
        for i, item in enumerate(value):
            _walk(item, root, f"{name}[{i}]", kind, found, depth + 1)
    elif isinstance(value, dict):
        for k, item in value.items():
            _walk(item, root, f"{name}[{k!r}]", "dict", found, depth + 1)


def _storages(inputs: Any) -> set:
    """Storage addresses of every tensor in (nested) ``inputs``: a view of an input shares its input's."""
    from layerlab.target.bind import flatten

    return {t.untyped_storage().data_ptr() for _, t in flatten(inputs) if t.layout == torch.strided}


def findings(model: nn.Module, graph_leaves: List[torch.Tensor], inputs: Any = ()) -> List[Problem]:
    """One error per attribute holding tensors the loss depends on that are not registered parameters.
    ``inputs``: the forward's arguments (a leaf that is an input or a view of one is not reported)."""
    registered = {id(p) for p in model.parameters()}
    given = _storages(inputs)
    stray = [t for t in graph_leaves if id(t) not in registered
             and not (t.layout == torch.strided and t.untyped_storage().data_ptr() in given)]
    if not stray:
        return []
    held = attributes(model)
    by_root: Dict[str, List[Tuple[str, str, torch.Tensor]]] = {}
    outside: List[torch.Tensor] = []
    for t in stray:
        if id(t) in held:
            root, name, how = held[id(t)]
            by_root.setdefault(root, []).append((name, how, t))
        else:
            outside.append(t)
    out = []
    for root, items in by_root.items():
        names = sorted(n for n, _, _ in items)
        hows = sorted({h for _, h, _ in items})
        values = sum(t.numel() for _, _, t in items)
        if hows == ["tensor"]:
            message = (f"{root}: a plain tensor attribute (requires_grad=True, {values:,} values) that the loss "
                       "depends on, not an nn.Parameter: model.parameters() does not list it, so an optimizer "
                       "built on it never updates it and it never changes")
            hint = "wrap it in nn.Parameter(...) (or register_buffer(...) if it is not meant to train)"
        elif all(h.endswith((" of Parameter", " of tensor")) for h in hows):
            message = (f"{root}: {len(names)} tensor(s) that require grad ({values:,} values) held in a plain Python "
                       f"{', '.join(hows)}: a container that is not nn.ParameterList/nn.ParameterDict registers "
                       "nothing, so model.parameters() does not list them, an optimizer built on it never "
                       "updates them and they never change")
            hint = ("hold them in nn.ParameterList([...]) / nn.ParameterDict({...}) (each an nn.Parameter), "
                    "not a list or dict")
        else:
            message = (f"{root}: layers held in a plain Python {', '.join(hows)} ({len(names)} parameter(s), "
                       f"{values:,} values) are not registered: model.parameters() does not list them, so an "
                       "optimizer built on it never updates them and they never change")
            hint = "hold the layers in nn.ModuleList / nn.ModuleDict (or nn.Sequential), not a list or dict"
        out.append(Problem("unregistered", message, where=root, severity="error", hint=hint,
                           data={"params": names}))
    if outside:
        shapes = ", ".join(str(list(t.shape)) for t in outside[:4]) + (" …" if len(outside) > 4 else "")
        out.append(Problem("unregistered", f"the loss depends on {len(outside)} tensor(s) that require grad but "
                           f"are not parameters of the model (shape {shapes}) and no module attribute holds them: "
                           "captured from outside the model (a global, a closure, a loss with its own weights); "
                           "this check's optimizer does not update them", where="(loss)", severity="warning",
                           hint="make them nn.Parameters of the model if they should train",
                           data={"shapes": [list(t.shape) for t in outside]}))
    return out
