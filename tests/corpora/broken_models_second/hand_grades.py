"""Hand judgements of layerlab's first fix on the second corpus, where the machine is unsure.

Made on the engine of 2026-12-02 04:25 UTC (after /work/notes/engine_ready) by reading the printed
fix and, where it names a concrete edit, applying that edit by hand (see after.txt). Keyed by case
and by the fingerprint of the first fix's text that grade.py prints: a judgement applies only while
the engine prints that same text, so a changed engine is graded by machine (and marked unsure)
until someone looks again. "misleading": the first fix names a concrete wrong cause or edit for
this model (a generic fallback sentence is not counted, unless its words point at a wrong edit
that this model invites).
"""

_NOT_RIGHT = dict(first_fix_right=False, dangerous=False, false_verified=False)
_GENERIC = "b6272fbbbb"  # 'make the clashing dims equal (or 1): a residual needs ... or a projection of the shortcut'

HAND = {
    "pose_softargmax_grid": {_GENERIC: dict(_NOT_RIGHT, misleading=False, note=(
        "Generic broadcast advice, no edit. The message does trace b [12] to `linspace(0, 1, 12)` on the "
        "BUG line (good); the right fix (meshgrid, flattened to h*w) is never suggested."))},
    "vqvae_vectors_transpose": {"62747711a7": dict(_NOT_RIGHT, misleading=False, note=(
        "Right axis swap, wrong place: transposes the matmul operand (line 94) although the message "
        "traced it to `z.flatten(2)` on the BUG line; applied, the model still fails at the next use of "
        "the same vectors (mse_loss, line 96), and layerlab says so ('still-fails'). The transpose at the "
        "producer (to_vectors) is the twin's fix and is not tried."))},
    "infonce_views_cat_dim": {"c4ffcd904f": dict(_NOT_RIGHT, located=False, misleading=False, note=(
        "Honest but vague: 'one row per sample; check the reshapes between the model's input and its "
        "logits'. Does not take the near-miss bait (cutting the 2B labels), but never names the cat "
        "of the two views (dim=1) that made the logits (B, B); the traced cat is the labels' one."))},
    "weather_lat_weights": {_GENERIC: dict(_NOT_RIGHT, misleading=False, note=(
        "Located: the message traces b [16] to latitude_weights() (models_science.py:17). But no fix: the "
        "(16,) weights meet (2, 3, 16, 32) where 16 sits on dim -2, and w[:, None] is not offered; no "
        "bait taken either (no 32-long weight)."))},
    "protein_pair_bias_heads": {"ec89ea88c2": dict(_NOT_RIGHT, misleading=True, note=(
        "Concrete wrong edit: 'out_features=10' on pair_bias (10 heads). layerlab's own re-run says it "
        "still fails, so not dangerous; but the layout is the bug: b is (B, L, L, H) and its 4 sits on "
        "the last axis, so .permute(0, 3, 1, 2) is the fix - the broadcast rule looks at sizes only."))},
    "distill_hint_adapter": {"00a908ee02": dict(_NOT_RIGHT, misleading=True, note=(
        "Hedged ('which fix is right depends on what the Linear should see'), but the first fix is a "
        "concrete wrong edit: pool the positions (or flatten, in_features=2048). Applied by hand both "
        "still raise in mse_loss against the teacher's (4, 64, 8, 8) map. The alternative (movedim(1, -1)) "
        "is half the twin's fix; without moving the channels back it raises too."))},
    "ode_time_scalar_cat": {"5f723ab82d": dict(_NOT_RIGHT, misleading=False, note=(
        "Right line, right direction, incomplete: 'unsqueeze or flatten the odd one out'. By hand: "
        "t.unsqueeze(0), t[None, None] and t.flatten() all still raise (the time needs the batch: "
        "t.expand(B, 1)). No edit steps, so nothing to verify."))},
    "fpn_topdown_odd_size": {_GENERIC: dict(_NOT_RIGHT, misleading=False, note=(
        "Traces the 14x14 to F.interpolate(scale_factor=2) on the BUG line (good), but no fix: "
        "interpolate(size=lateral.shape[-2:]), the usual FPN fix for odd sizes, is not offered."))},
    "pos2d_square_grid": {_GENERIC: dict(_NOT_RIGHT, misleading=False, note=(
        "Near miss, bait not taken (no crop of the tokens, no interpolated table). Not located: the trace "
        "stops at `pos.reshape(25, -1)`/`cat(-1)`; the 5x5 came from Python ints in grid() "
        "(int(sqrt(32))), which the op trace cannot follow."))},
    "mobile_residual_stride": {_GENERIC: dict(_NOT_RIGHT, misleading=True, note=(
        "Names blocks.2 (good), but the generic text's 'a residual needs the branch to keep the width, or "
        "a projection of the shortcut' points at the near-miss bait here: a projected/strided shortcut "
        "would run and compute another model. The right fix is no shortcut on a stride-2 block. No "
        "concrete edit, so not counted dangerous."))},
    "mamba_scan_b_axis": {_GENERIC: dict(_NOT_RIGHT, misleading=False, note=(
        "Right line (the failing op is the BUG line, b traced to its indexing), no fix: the indexing that "
        "put n on the wrong axis (b_t[:, :, None] -> b_t[:, None, :]) is not offered."))},
    "mdn_target_component_axis": {_GENERIC: dict(_NOT_RIGHT, misleading=False, note=(
        "Right line, no fix (y[:, None, :] not offered). The message calls y (the loss's target) 'a model "
        "input'; the origins say correctly 'a tensor the loss holds'."))},
}
