"""Layers whose width comes with a ``groups`` argument: a depthwise conv and GroupNorm.

Their size rule is not one number. A depthwise conv (``groups = in_channels``) is as wide as its input
*and* output *and* groups; resizing ``in_channels`` alone builds a grouped conv that mixes channels and
narrows the map, and the layers after it get resized in turn — a model that runs and is no longer
depthwise. A GroupNorm's ``num_channels`` must be divisible by ``num_groups``; a fix that sets the
channels alone cannot even be built.
"""

from __future__ import annotations

from typing import Optional

from layerlab.probe.report import Diagnosis, FixStep
def depthwise(ctx, base: str, channels: int, rule: str) -> Diagnosis:
    """A depthwise conv (groups = in_channels) built for another width: its width is in_channels,
    out_channels *and* groups. in_channels alone would build a grouped conv that mixes channels and
    narrows the map (the layers after it, built for the width, then fail or are resized too)."""
    m = ctx.module
    mult = m.out_channels // m.in_channels
    out = channels * mult
    after = _built_for(ctx, m.out_channels, channels)
    if after is not None:  # the layers after it agree with its width: the map it gets is the odd one
        return Diagnosis(
            f"{base}; it is depthwise (groups = in_channels = {m.in_channels}), and {after}, which has not run yet, "
            f"also takes its {m.out_channels} output channels: the layer that made the {channels}-channel map looks "
            "built for the wrong width, not this one",
            expected=m.in_channels, got=channels, cause="size",
            hint=f"make the layer before it output {m.in_channels} channels (an expansion conv's out_channels)",
            alternatives=[f"rebuild it for {channels}: in_channels={channels}, out_channels={out}, groups={channels} "
                          f"(then {after} too) — only if the block is meant to be {channels} wide"], rule=rule,
        )
    code = f"in_channels={channels}, out_channels={out}, groups={channels}"
    return Diagnosis(
        f"{base}; it is depthwise (groups = in_channels = {m.in_channels}): its width is {m.in_channels}, "
        f"the map it gets has {channels} channels",
        expected=m.in_channels, got=channels, cause="size",
        hint=f"build it for the width it gets: {code} (not in_channels alone: that makes a grouped conv "
             f"{channels}→{m.out_channels}, no longer depthwise)",
        fix=FixStep("set-arg", ctx.path, code, {"name": "in_channels", "value": channels,
                                                 "also": {"out_channels": out, "groups": channels}}),
        alternatives=[f"or make the layer before it output {m.in_channels} channels"], rule=rule,
    )


def _built_for(ctx, width: int, got: int) -> Optional[str]:
    """``"project (Conv2d)"``: a layer that has not run yet and takes ``width`` channels (none takes ``got``)."""
    ran = {id(m) for m in ctx.recorder.modules}
    fits, others = None, False
    for name, module in ctx.recorder.root.named_modules():
        if id(module) in ran or module is ctx.module:
            continue
        size = getattr(module, "in_channels", None) or getattr(module, "num_features", None)
        if size == width and fits is None:
            fits = f"{name} ({type(module).__name__})"
        others = others or size == got
    return None if others else fits


def group_norm_groups(ctx, found: Optional[Diagnosis]) -> Optional[Diagnosis]:
    """``found`` sets a GroupNorm's ``num_channels``: when its ``num_groups`` does not divide the new
    count, also set the largest number of groups that does (at most the old one)."""
    m = ctx.module
    fix = found.fix if found is not None else None
    if fix is None or fix.kind != "set-arg" or fix.params.get("name") != "num_channels":
        return None
    channels = fix.params["value"]
    if channels % m.num_groups == 0:
        return None
    groups = max(g for g in range(1, m.num_groups + 1) if channels % g == 0)
    code = f"num_groups={groups}, num_channels={channels}"
    found.message += f"; {m.num_groups} groups do not divide {channels} channels"
    found.hint = (f"set {code} ({groups} is the largest group count ≤ {m.num_groups} dividing {channels}), or make "
                  f"the layer before it output {m.num_channels} channels")
    found.fix = FixStep("set-arg", ctx.path, code, {"name": "num_channels", "value": channels,
                                                     "also": {"num_groups": groups}})
    return found
