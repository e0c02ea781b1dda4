"""One registry of the diagnosis rules: what the engine cannot infer, each with an id and a trigger.

A rule explains why a forward raised. It is a function ``rule(ctx) -> Diagnosis | None`` (``ctx`` a
:class:`~layerlab.probe.context.FailureContext`), registered with :func:`register_rule` — the
pattern of ``torch/utils/flop_counter.py``'s ``register_flop_formula``: a decorator that refuses an
id registered twice. Each rule has

* a stable **id** (``layout/conv-channels-last``, ``mask/padding-as-attn-mask``): every Diagnosis it
  returns carries it (``Diagnosis.rule_id``, in ``--json`` and in the human output), and the id
  string appears once in the source, at the registration, so one grep leads from a hint to its rule;
* a **stage**, the part of the failure it reads: ``input`` (the model's inputs, for every failure),
  ``op`` (the op of the user's code that raised), ``module`` (the innermost module call that raised),
  ``refine`` (a module rule's Diagnosis, ``ctx.found``, made precise by what the op trace saw);
* a **trigger** (``on``): torch callables for ``op`` rules (``torch.cat``, ``torch.Tensor.view``),
  module classes for ``module`` rules (``nn.Linear``; a subclass matches) — never name strings.
  An empty trigger means every op (or every failure);
* an **order**: within a stage, the rules whose trigger matches run in increasing order and the
  first Diagnosis wins (the order is the precedence: a rule that sees the cause upstream runs before
  the one that reads only the failing op's shapes);
* a **severity** and a **summary** (the first line of its docstring, which every rule must have).

A rule that cannot read its inputs (an exception inside it) has nothing to say: it is skipped. With
``LAYERLAB_DEBUG=1`` the exception is printed with its traceback to stderr (the rule id first), so a
broken rule is seen instead of silently losing its diagnoses.

:func:`all_rules` lists every rule (id, stage, trigger, order, summary) for ``layerlab explain``
and for the test that each rule has a docstring and a test that exercises it.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # the engine does not import the probe package at import time
    from layerlab.probe.context import FailureContext
    from layerlab.probe.report import Diagnosis

RuleFunction = Callable[["FailureContext"], Optional["Diagnosis"]]

STAGES = ("input", "op", "module", "refine")
SEVERITIES = ("error", "warning", "info")
_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*/[a-z0-9]+(-[a-z0-9]+)*$")

#: The modules whose import registers every rule (rules register themselves when imported).
RULE_MODULES = ("layerlab.probe.blame",)


@dataclass(frozen=True)
class Rule:
    """One registered rule; ``run`` is the decorated function (its Diagnoses carry ``id``)."""

    id: str
    run: RuleFunction
    stage: str
    on: Tuple[Any, ...]
    order: int
    severity: str
    summary: str

    @property
    def trigger(self) -> str:
        """``torch.cat, torch.Tensor.view`` / ``nn.Linear`` / ``every op`` — readable, for listings."""
        if not self.on:
            return {"op": "every op", "input": "every failure"}.get(self.stage, "every module")
        return ", ".join(_callable_name(c) for c in self.on)


_RULES: Dict[str, Rule] = {}


def register_rule(rule_id: str, *, stage: str, on: Tuple[Any, ...] = (), order: int,
                  severity: str = "error") -> Callable[[RuleFunction], RuleFunction]:
    """Register ``rule`` under ``rule_id`` (see the module docstring); a duplicate id, a string
    trigger, an unknown stage or a rule without a docstring is a bug of the rule set and raises."""
    if not _ID.match(rule_id):
        raise ValueError(f"rule id {rule_id!r} is not 'family/name' in lowercase words joined by '-'")
    if stage not in STAGES:
        raise ValueError(f"rule {rule_id}: stage {stage!r} is not one of {STAGES}")
    if severity not in SEVERITIES:
        raise ValueError(f"rule {rule_id}: severity {severity!r} is not one of {SEVERITIES}")
    on = tuple(on)
    for trigger in on:
        if isinstance(trigger, str):
            raise TypeError(f"rule {rule_id}: trigger {trigger!r} is a string; give the torch callable or module class")
        if stage in ("module", "refine") and not isinstance(trigger, type):
            raise TypeError(f"rule {rule_id}: a {stage} rule is triggered by module classes, got {trigger!r}")
        if stage == "op" and (isinstance(trigger, type) or not callable(trigger)):
            raise TypeError(f"rule {rule_id}: an op rule is triggered by torch callables, got {trigger!r}")

    def register(rule: RuleFunction) -> RuleFunction:
        if rule_id in _RULES:
            raise ValueError(f"rule id {rule_id!r} registered twice")
        doc = (rule.__doc__ or "").strip()
        if not doc:
            raise ValueError(f"rule {rule_id} ({rule.__qualname__}) has no docstring")

        @functools.wraps(rule)
        def run(ctx):
            found = rule(ctx)
            # a refine rule rewrites the module rule's Diagnosis in place: the words are then its own
            if found is not None and (found.rule_id is None or stage == "refine"):
                found.rule_id, found.severity = rule_id, severity
            return found

        _RULES[rule_id] = Rule(rule_id, run, stage, on, order, severity, " ".join(doc.split("\n\n")[0].split()))
        return run

    return register


def rules_for(stage: str, op: Any = None, module: Any = None) -> List[Rule]:
    """The rules of ``stage`` whose trigger matches the failing ``op`` (a torch callable) or
    ``module`` (an instance), in registered order.

    An op matches a rule triggered by the same callable or by one the op trace calls by the same
    name (``torch.Tensor.add`` and ``torch.add`` are one op, ``add``: aliases of one op fail alike).
    """
    found = []
    name = _op_name(op) if op is not None else None
    for rule in _RULES.values():
        if rule.stage != stage:
            continue
        if rule.on and stage == "op" and (op is None or not any(t is op or _op_name(t) == name for t in rule.on)):
            continue
        if rule.on and stage in ("module", "refine") and not isinstance(module, rule.on):
            continue
        found.append(rule)
    return sorted(found, key=lambda r: r.order)


def first_diagnosis(rules: List[Rule], ctx) -> Optional["Diagnosis"]:
    """The first of ``rules`` (in order) that recognises the failure, or ``None``."""
    for rule in rules:
        found = call_rule(rule, ctx)
        if found is not None:
            return found
    return None


def call_rule(rule: Rule, ctx) -> Optional["Diagnosis"]:
    """``rule.run(ctx)``; an exception inside the rule means it has nothing to say (reported with its
    traceback under ``LAYERLAB_DEBUG=1``)."""
    try:
        return rule.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a rule that cannot read these inputs has nothing to say
        from layerlab.errors import debug_enabled

        if debug_enabled():
            print(f"layerlab: rule {rule.id} raised {type(exc).__name__} and was skipped:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
        return None


def all_rules() -> List[Rule]:
    """Every registered rule, by stage then order (imports the rule modules first)."""
    for name in RULE_MODULES:
        importlib.import_module(name)
    return sorted(_RULES.values(), key=lambda r: (STAGES.index(r.stage), r.order))


def get_rule(rule_id: str) -> Rule:
    """The rule registered as ``rule_id`` (``KeyError`` if there is none)."""
    all_rules()
    return _RULES[rule_id]


def _op_name(func: Any) -> str:
    from layerlab.probe.ops import op_name  # the trace's own name of an op (its identity across aliases)

    return op_name(func)


def _callable_name(c: Any) -> str:
    if isinstance(c, type):
        module = c.__module__
        return f"nn.{c.__name__}" if module.startswith("torch.nn") else f"{module}.{c.__qualname__}"
    if getattr(c, "__objclass__", None) is not None or getattr(c, "__qualname__", "").startswith("Tensor."):
        return f"torch.Tensor.{c.__name__}"
    module = getattr(c, "__module__", None) or ""
    name = getattr(c, "__name__", repr(c))
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return f"F.{name}"
    return f"{module}.{name}" if module.startswith("torch.") and not module.startswith("torch._") else f"torch.{name}"
