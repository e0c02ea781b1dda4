"""``F.grid_sample`` given a channels-first flow field as its grid.

The grid is (N, H_out, W_out, 2): the (x, y) pair last. A flow predicted by a conv is (N, 2, H, W),
its pair on dim 1. When only dim 1 holds the pair size, the fix is ``grid.permute(0, 2, 3, 1)``;
``grid.view(N, H, W, 2)`` has the same sizes and runs, pairing numbers of different pixels. The
permute is given as a fix only for a field of the image's own size (a flow per pixel, the warp's
case); another grid with the pair size on dim 1 (points given with a third coordinate, (N, 2, P, 3))
gets the same reading as a hint, without a fix.
"""

from __future__ import annotations

from typing import Optional

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.report import Diagnosis, FixStep


@register_rule("layout/grid-channels-first", stage="op", on=ops.GRID_SAMPLE, order=210)
def grid_layout(ctx) -> Optional[Diagnosis]:
    """``F.grid_sample`` given a channels-first (N, 2, H, W) flow field as its (N, H, W, 2) grid."""
    failed = ctx.failed_op
    if failed.record.op != "F.grid_sample" or len(failed.args) < 2:
        return None
    image, grid = failed.args[0], failed.args[1]
    pair = image.dim() - 2  # 2 for 4-D images, 3 for 5-D volumes
    if grid.dim() != image.dim() or grid.shape[-1] == pair:
        return None
    holders = [d for d in range(1, grid.dim()) if grid.shape[d] == pair]
    record = failed.record
    order = [0, *range(2, grid.dim()), 1]
    wanted = [grid.shape[d] for d in order]
    message = (f"F.grid_sample{op_at(record)} reads the grid as (N, H_out, W_out, {pair}) with the coordinates last, "
               f"got grid {list(grid.shape)}; {ctx.origin('grid', grid).text}")
    base = dict(expected=f"[N, H_out, W_out, {pair}]", got=list(grid.shape), cause="layout",
                rule=f"grid_sample: input (N, C, H, W), grid (N, H_out, W_out, {pair}) in [-1, 1]")
    if holders != [1]:
        return Diagnosis(message + f"; the size {pair} is on dims {holders}: layerlab cannot tell which holds the "
                         "coordinates", hint="move the coordinate axis last with a permute (not a view)", **base)
    code = f"grid.permute({', '.join(map(str, order))})"
    if list(grid.shape[2:]) != list(image.shape[2:]):
        return Diagnosis(message + f"; the size {pair} sits on dim 1 only, but the grid's other axes "
                         f"{list(grid.shape[2:])} are not the image's {list(image.shape[2:])} (not a flow per "
                         f"pixel): layerlab cannot tell whether dim 1 holds the coordinates or the last dim is wrong",
                         hint=f"if dim 1 holds the coordinates, {code}; if the last dim holds too many values, "
                              f"keep the first {pair}", **base)
    return Diagnosis(
        message + f"; its {pair} coordinates sit on dim 1, channels-first (a conv's flow field)",
        hint=f"move the coordinates last: {code}{op_at(record)} → {wanted}",
        fix=FixStep("replace-op", record.source or "", code, op_site(record, arg=1, to="movedim:1:-1")),
        alternatives=[f"not grid.view/reshape({', '.join(map(str, wanted))}): it runs, pairing numbers of "
                      "different pixels as (x, y)"], **base)
