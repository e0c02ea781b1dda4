"""Hand judgements of layerlab's first fix on the broken-model corpus, where the machine is unsure.

Made on the pristine engine (the fresh-audit "before" run) by reading the printed fix and, where it
names a concrete edit, applying that edit by hand. Keyed by case and by the fingerprint of the
first fix's text that grade.py prints: a judgement applies only while the engine prints that same
text, so a changed engine is graded by machine (and marked unsure) until someone looks again.
"misleading": the first fix names a concrete wrong cause or edit (a generic fallback sentence is
not counted as misleading).
"""

_NOT_RIGHT = dict(first_fix_right=False, dangerous=False, false_verified=False)
HAND = {
    "gnn_index_add_dim": {"5608ba0b92": dict(_NOT_RIGHT, misleading=True, note=(
        "Reads the index_add count mismatch (10 indices vs 8 features on dim 1) as out-of-range ids: "
        "'an off-by-one, a vocabulary or class count too small'. The dim argument (0) is never named."))},
    "moe_topk_dim": {"5608ba0b92": dict(_NOT_RIGHT, misleading=True, note=(
        "The message traces the index to `topk(2, dim=0)` (good), but the fix text blames off-by-one ids "
        "or a too-small vocabulary; the topk dim is the fix."))},
    "stn_loc_flatten_size": {"8a7344c1aa": dict(_NOT_RIGHT, misleading=False, note=(
        "Partly right: 'use -1 for the one dim that should take the rest' does not say which dim (the "
        "batch must stay first: view(x.size(0), -1)) and never names fc_loc.0's in_features=256."))},
    "nerf_viewdir_stack_dim": {"4006c2bcf1": dict(_NOT_RIGHT, misleading=True, note=(
        "Message traces tensors[1] to stack(dim=0) (good), but the fix says 'resize one of them (a "
        "projection or a pool)': the sizes are right, the stack axis is wrong."))},
    "perceiver_input_proj_unused": {"abcf46de21": dict(_NOT_RIGHT, misleading=True, note=(
        "First fix 'set kdim=6': alone it still fails on the value (checked by hand); with vdim=6 too it "
        "runs with new untrained k/v projections and `inp` left unused. The model's own `inp` is "
        "never mentioned; the second half ('project the key to 16 features') is close."))},
    "diffusion_temb_t_shape": {"b6272fbbbb": dict(_NOT_RIGHT, misleading=True, note=(
        "Generic residual/shortcut advice for an add of the time embedding; the (B, 1) timestep column "
        "made emb (B, 1, 16) upstream, and nothing names t or the embedding line."))},
    "diffusion_upsample_skip_size": {"4006c2bcf1": dict(_NOT_RIGHT, misleading=True, note=(
        "Traces the 10x10 to interpolate(scale_factor=2) (good) but says 'resize one of them (a "
        "projection or a pool)': pooling 10->9 would run and differ; size=x.shape[-2:] is the fix."))},
    "diffusion_null_class_embedding": {"41a621c57c": dict(_NOT_RIGHT, misleading=False, note=(
        "Half right: 'negative ids are never valid: remap them' but no null row; remapping -1 onto an "
        "existing class (or a padding id) merges 'no label' with a class. Twin: Embedding(6) + -1 -> 5."))},
    "optflow_unfold_padding": {"9ff8371e5f": dict(_NOT_RIGHT, dangerous=True, misleading=True, note=(
        "Concrete wrong fix: view as [2, 8, 4, 6, 6] 'and the layer after it must take that size'; "
        "applied by hand (head in_channels=4) it runs and computes a 4-window correlation on a "
        "mis-laid tensor. The missing unfold padding=r is not found."))},
    "capsule_u_hat_unsqueeze": {"4e68cf3bbb": dict(_NOT_RIGHT, misleading=True, note=(
        "Suggests b.transpose(-2, -1) for a missing trailing axis; layerlab itself reports "
        "'still-fails' after applying it (honest), but the right edit (u[..., None]) is not offered."))},
    "hypernet_bmm_unsqueeze": {"707b38ab5f": dict(_NOT_RIGHT, misleading=True, note=(
        "Suggests b.transpose(-2, -1) for a 2-D operand of bmm; reported 'still-fails' (honest); "
        "x.unsqueeze(-1) is the fix."))},
    "colbert_doc_mask_broadcast": {"b6272fbbbb": dict(_NOT_RIGHT, misleading=False, note=(
        "Generic residual sentence for a masked_fill whose (B, Ld) mask needs a query axis "
        "(dmask[:, None, :]); the message does show both shapes and the line."))},
    "gfnet_rfft_weight_size": {"b6272fbbbb": dict(_NOT_RIGHT, misleading=False, note=(
        "Generic residual sentence; the message names rfft2 and the parameter `weight` [4, 8, 8, 2] "
        "but not that rfft2 keeps W//2 + 1 frequencies."))},
    "fft_irfft_odd_length": {"b6272fbbbb": dict(_NOT_RIGHT, misleading=False, note=(
        "Generic 'a residual needs the branch to keep the width' (apt in spirit: the irfft branch is "
        "one sample short) but no edit; irfft's n= is the fix."))},
    "gqa_repeat_interleave_dim": {"f3f45849c2": dict(_NOT_RIGHT, misleading=False, note=(
        "Generic 'bmm needs equal batch sizes; matmul broadcasts them'; the message traces b to "
        "`k.repeat_interleave(2, dim=2)` but the dim is not offered as the fix."))},
    "gqa_kv_proj_size": {"2ed1b54fa3": dict(_NOT_RIGHT, misleading=True, note=(
        "Suggests viewing k as [2, 5, 2, 8] (head dim 8); the projection k (and v) should output 8 "
        "(2 kv heads x 4). Applied, q @ k^T then fails (4 vs 8)."))},
    "pad_even_kernel_same": {"b6272fbbbb": dict(_NOT_RIGHT, misleading=False, note=(
        "Generic residual sentence; the asymmetric pad (1, 2) for an even kernel is not found."))},
    "tcn_causal_crop_zero": {"b6272fbbbb": dict(_NOT_RIGHT, misleading=False, note=(
        "Generic residual sentence; the message does trace the empty tensor to the [..., :-0] slice "
        "(line named), the guard for p = 0 is not offered."))},
}
