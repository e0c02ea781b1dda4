"""The thing under test: one :class:`Target` for every command.

A Target is a built module, its inputs bound to ``forward`` (:class:`~layerlab.target.bind.Arg`),
the reference it should equal (already built, not yet carrying its weights: the checks align
those), the claims it makes (``tags``: ``causal``, ``recurrent``, ``mixes_batch``, ``stochastic``)
and the batch dims the user fixed. It comes from a spec file or a registry name
(:mod:`layerlab.target.build`) or from a module and inputs in Python (:func:`from_module`).

inspect, gradcheck, export-check and profile all start from one; each uses what it needs (inspect
never looks at ``reference``; export-check never runs backward).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple

from layerlab.target.bind import Arg, bind, map_args

__all__ = ["Target", "from_module", "to_device"]


@dataclass
class Target:
    """A module ready to run, and what is claimed about it.

    Attributes:
        name: what the user named (registry name, spec path, class name); reports show it.
        module: the built layer, in the mode the spec asks for (registry layers: train).
        args: forward arguments, in call order (name, value, by keyword or not).
        reference: the counterpart it should equal (an ``nn.Module`` instance, a class the checks
            align through the layer's ``to_torch()``, a plain callable), or ``None``.
        reference_output: how the reference's output maps onto the layer's (``flatten(2).transpose(1, 2)``).
        weight_map: ``{our_name: their_name}`` for copying weights into the reference, or ``None``.
        tags: claims the checks rely on.
        seed: the seed the module and inputs were built with (and checks draw from).
        batch_dims: input name → batch dim (``None``: no batch dim), where the user said so.
        mode: ``"train"`` or ``"eval"``, as built.
        backward: whether the spec asks for a backward pass (inspect).
        title: the spec's ``name:`` (shown as a title), if any.
        sections: per-command sections of the spec as written (``probes:``, ``train:``,
            ``precision:``, ``ddp:``); each command reads its own and validates it.
        marks: the spec's YAML marks (``marks("train", "lr")`` → ``file:line:col``) for errors
            about a section, or ``None`` for a target not built from a spec file.
        base_dir: the spec file's folder (where ``import:`` paths are looked up), or ``None``.
    """

    name: str
    module: Any
    args: List[Arg]
    reference: Any = None
    reference_output: Optional[str] = None
    weight_map: Optional[Dict[str, str]] = None
    tags: FrozenSet[str] = frozenset()
    seed: int = 0
    batch_dims: Dict[str, Optional[int]] = field(default_factory=dict)
    mode: str = "train"
    backward: bool = True
    title: Optional[str] = None
    sections: Dict[str, Any] = field(default_factory=dict)
    marks: Any = None
    base_dir: Optional[str] = None

    @property
    def target(self) -> str:
        """The name (what the commands' reports call ``target``)."""
        return self.name

    def split(self) -> Tuple[list, Dict[str, Any]]:
        """``(positional values, keyword values)``: how to call ``module``."""
        return [a.value for a in self.args if not a.keyword], {a.name: a.value for a in self.args if a.keyword}

    def values(self) -> list:
        """Every argument's value, in call order."""
        return [a.value for a in self.args]

    def __post_init__(self) -> None:
        from layerlab.faults import step, watch_model

        watch_model(self.module)  # a --timeout names the submodule that was running by its path
        step(None)  # built: the preparation is over (a command names its own steps from here)


def from_module(module: Any, *inputs: Any, reference: Any = None, tags: Iterable[str] = (),
                batch_dims: Optional[Dict[str, Optional[int]]] = None, seed: int = 0, name: Optional[str] = None,
                forward_kwargs: Optional[Dict[str, Any]] = None, weight_map: Optional[Dict[str, str]] = None,
                reference_output: Optional[str] = None, **kwargs: Any) -> Target:
    """A Target from Python: ``module(*inputs, **kwargs)`` with the claims given.

    ``forward_kwargs`` holds keyword arguments whose names clash with this function's own
    (``name=``, ``seed=``). The module and inputs are used as they are: not copied, not cast.
    """
    training = getattr(module, "training", True)
    args = bind(module, inputs, {**kwargs, **(forward_kwargs or {})})
    return Target(name=name or type(module).__name__, module=module, args=args, reference=reference,
                  reference_output=reference_output, weight_map=weight_map, tags=frozenset(tags), seed=seed,
                  batch_dims=dict(batch_dims or {}), mode="train" if training else "eval")


def to_device(module: Any, args: List[Arg], dev: Any) -> Tuple[Any, List[Arg]]:
    """The module and its inputs on ``dev`` (unchanged when ``dev`` is ``None``); inputs keep their
    ``requires_grad``."""
    if dev is None:
        return module, args
    return module.to(dev), map_args(args, lambda t: t.detach().to(dev).requires_grad_(t.requires_grad))
