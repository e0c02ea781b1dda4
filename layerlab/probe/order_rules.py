"""A layer of the right size called in the wrong place: the sibling order of a ModuleList/Sequential.

The size rules of :mod:`layer_rules` read one call: "Linear expects in_features = 256, got 64: set
in_features=64". When the model's own loop indexes its ``nn.ModuleList`` wrong (``self.layers[i - 1]``
runs the *last* layer first), that fix makes the copy run — by resizing one layer after another until
the shapes agree — and the model computes something else. What gives it away is the recorder: the
failing layer is ``layers.2``, ``layers.0`` and ``layers.1`` have not run yet, and ``layers.0`` takes
exactly the size the input has. Then the report says what it sees and offers no resize.
"""

from __future__ import annotations

from typing import Optional

import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe.report import Diagnosis

#: The size arguments of a layer's *input* (what a size rule's fix sets).
_INPUT_SIZES = ("in_features", "in_channels", "num_features", "input_size", "embed_dim", "normalized_shape")


@register_rule("order/sibling-call-order", stage="refine", order=10)
def call_order(ctx) -> Optional[Diagnosis]:
    """Replace ``found`` (a resize of the failing layer's input size) when an earlier sibling that has
    not run yet takes the size the input has: the container is indexed in the wrong order."""
    found = ctx.found
    fix = found.fix
    if fix is None or fix.kind != "set-arg" or fix.params.get("name") not in _INPUT_SIZES or not ctx.path:
        return None
    parent_path, _, own = ctx.path.rpartition(".")
    if not own.isdigit():
        return None
    try:
        parent = ctx.recorder.root.get_submodule(parent_path) if parent_path else ctx.recorder.root
    except AttributeError:
        return None
    if not isinstance(parent, (nn.ModuleList, nn.Sequential)):
        return None
    attr, got = fix.params["name"], fix.params["value"]
    ran = {call.path for call in ctx.recorder.calls[:-1]} if ctx.recorder.calls else set()
    earlier = [str(j) for j in range(int(own))]
    prefix = f"{parent_path}." if parent_path else ""
    if not earlier or any(prefix + j in ran for j in earlier):
        return None  # an earlier sibling ran: the order looks right, the size rule stands
    fits = [j for j in earlier if getattr(parent[int(j)], attr, None) == got]
    if not fits:
        return None
    sibling = prefix + fits[0]
    name = type(ctx.module).__name__
    return Diagnosis(
        f"{ctx.path} ({name}) runs before {', '.join(prefix + j for j in earlier)}, which have not run yet, and "
        f"{sibling} ({type(parent[int(fits[0])]).__name__}) takes {attr}={got}, the size this input has: the "
        f"{type(parent).__name__} {parent_path or '(root)'} looks indexed in the wrong order (e.g. [i - 1] for [i])",
        expected=found.expected, got=found.got, cause="call-order",
        hint=f"check the loop that indexes {parent_path or 'the container'}: {sibling} should probably run first; "
             f"resizing {ctx.path} would make the model run with its layers in another order",
        alternatives=[f"{found.hint} — only if {ctx.path} really is meant to run first"] if found.hint else [],
        rule=found.rule,
    )
