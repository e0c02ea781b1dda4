"""A checked :class:`Spec` → the module and the inputs, ready for :func:`layerlab.inspect`.

Weights are initialised under the spec's seed inside ``torch.random.fork_rng`` (the global RNG
is left as it was); the model is then moved to the spec's float dtype and device. A constructor
that rejects its arguments (torch checks some only there, e.g. ``embed_dim`` divisible by
``num_heads``) is a :class:`SpecError` at the layer's line.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Union

from layerlab.errors import SpecError
from layerlab.spec import limits
from layerlab.spec.inputs import bind, make_inputs
from layerlab.spec.schema import BlockNode, LayerNode, Spec


@dataclass
class Built:
    """What a spec builds: the module, its forward arguments, and how to run it.

    ``inputs`` holds every argument in call order, keyed as passed: a keyword argument by its
    ``forward`` parameter name (also the key in ``kwargs``), a positional one by its input name.
    """

    module: Any
    args: List[Any]
    kwargs: Dict[str, Any]
    inputs: Dict[str, Any]
    mode: str
    backward: bool
    seed: int


def build(spec: Spec) -> Built:
    """Instantiate the spec's model and generate its inputs."""
    import torch

    from layerlab.spec.memory import check_fits

    with limits.clean_errors():
        check_fits(spec, lambda: _build(spec.root))  # refuses, with numbers, what cannot fit
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            module = _build(spec.root)
        try:
            module = module.to(device=spec.device, dtype=getattr(torch, spec.dtype))
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise SpecError(f"cannot move the model to device {spec.device!r}: {limits.first_line(exc)}",
                            where=spec.device_where or spec.source,
                            hint="use --device cpu, or a device this machine has") from None
        values = make_inputs(spec.inputs, seed=spec.seed, dtype=spec.dtype, device=spec.device,
                             device_where=spec.device_where)
    from layerlab.spec.validate import root_class

    cls = root_class(spec)
    positional, keyword = bind(cls, list(values), spec.source, cls.__name__)
    kwargs = {param: values[name] for param, name in keyword.items()}
    return Built(
        module=module,
        args=[values[n] for n in positional],
        kwargs=kwargs,
        inputs={**{n: values[n] for n in positional}, **kwargs},
        mode=spec.mode,
        backward=spec.backward,
        seed=spec.seed,
    )


def _build(node: Union[LayerNode, BlockNode]):
    import torch.nn as nn

    def one():
        return _instantiate(node) if isinstance(node, LayerNode) else _sequential(node)

    if node.repeat == 1:
        return one()
    return nn.Sequential(*[one() for _ in range(node.repeat)])


def _sequential(block: BlockNode):
    import torch.nn as nn

    children = OrderedDict()
    for i, item in enumerate(block.items):
        name = item.child_name or str(i)
        if name in children:
            raise SpecError(f"two block items are named {name!r}", where=item.where,
                            hint="item names default to their position; pick another name")
        children[name] = _build(item)
    return nn.Sequential(children)


def _instantiate(node: LayerNode):
    cls, display = node.resolved.cls, node.resolved.name
    try:
        return cls(*node.args, **node.kwargs)
    except Exception as exc:  # the constructor judged the arguments: the spec's problem
        message = limits.first_line(exc)
        raise SpecError(
            f"{display}(…) rejected its arguments: {message}", where=node.where,
            expected=None, got={**{str(i): a for i, a in enumerate(node.args)}, **node.kwargs},
            hint="fix the arguments under this layer",
        ) from None
