"""The 15 cases of the second broken-model corpus (graded by grade.py in this folder).

Six are near misses (``near_miss=True``): the quick fix at the line that raises runs, but computes
another model; the right fix is elsewhere (upstream, or in how a size was derived).
"""

import torch

from .case import BrokenCase, gen, seeded
from .hand_grades import HAND
from .models_science import (GridForecaster, MDN, NeuralODEBroken, NeuralODETwin, VAE,
                             mdn_nll_broken, mdn_nll_twin, vae_loss_broken, vae_loss_twin,
                             weather_loss_broken, weather_loss_twin)
from .models_sequence import (NTXentBroken, NTXentTwin, PairBiasAttentionBroken,
                              PairBiasAttentionTwin, SelectiveScanBroken, SelectiveScanTwin)
from .models_vision import (AnchorHeadBroken, AnchorHeadTwin, CRNNBroken, CRNNTwin,
                            FeatureDistillBroken, FeatureDistillTwin, FPNBroken, FPNTwin,
                            MobileNetBroken, MobileNetTwin, RowColPositionBroken,
                            RowColPositionTwin, SoftArgmaxPoseBroken, SoftArgmaxPoseTwin,
                            VQVAEBroken, VQVAETwin)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=gen(seed))


def _case(**kw):
    return BrokenCase(hand=HAND.get(kw["name"], {}), **kw)


CASES = [
    _case(
        name="detection_deltas_view", area="object detection (dense anchor head)",
        build_broken=seeded(AnchorHeadBroken), build_twin=seeded(AnchorHeadTwin),
        make_inputs=lambda: (randn(2, 3, 64, 64),),
        where="box_deltas: .view(B, -1, 4) right after permute (the tensor is not contiguous)",
        right_fix="reshape(B, -1, 4) (or .contiguous().view)",
        fix_at_line=True, fix_patterns=(r"reshape", r"contiguous"),
    ),
    _case(
        name="pose_softargmax_grid", area="pose estimation (soft-argmax heatmaps)",
        build_broken=seeded(SoftArgmaxPoseBroken), build_twin=seeded(SoftArgmaxPoseTwin),
        make_inputs=lambda: (randn(2, 3, 32, 24),),
        where="grid(): 1-D coordinate vectors (w,) and (h,) where the flattened heatmap needs (h*w,)",
        right_fix="meshgrid(linspace(h), linspace(w), indexing='ij') and flatten each to (h*w,)",
        fix_at_line=True, fix_patterns=(r"meshgrid", r"repeat_interleave|\.repeat\(|cartesian"),
        danger_patterns=(r"F\.pad|crop|interpolate",),
    ),
    _case(
        name="vqvae_vectors_transpose", area="VQ-VAE codebook",
        build_broken=seeded(VQVAEBroken), build_twin=seeded(VQVAETwin),
        make_inputs=lambda: (randn(2, 1, 24, 24),),
        where="to_vectors(): z.flatten(2) gives (B, D, HW); the codebook distance wants (B, HW, D)",
        right_fix="z.flatten(2).transpose(1, 2)",
        fix_at_line=True, fix_patterns=(r"transpose\(1, ?2\)|transpose\(-1, ?-2\)|transpose\(-2, ?-1\)|permute\(0, ?2, ?1\)",),
        danger_patterns=(r"embedding_dim|num_embeddings|in_features",),
    ),
    _case(
        name="infonce_views_cat_dim", area="contrastive learning (NT-Xent, in-batch negatives)",
        near_miss=True,
        build_broken=seeded(NTXentBroken), build_twin=seeded(NTXentTwin),
        make_inputs=lambda: (randn(8, 20, seed=1), randn(8, 20, seed=2)),
        where="embed_views(): the two views are joined on the features (dim=1), so sim is (B, B) and "
              "the 2B positive labels do not fit; cutting the labels to B would run a wrong loss",
        right_fix="torch.cat([...], dim=0)",
        fix_at_line=True, fix_patterns=(r"dim\s*=\s*0",),
        danger_patterns=(r"arange\(8\)|\[:8\]|labels?\[:|positives\[:|target\[:",),
    ),
    _case(
        name="weather_lat_weights", area="weather (lat-lon grid, latitude-weighted loss)",
        near_miss=True,
        build_broken=seeded(GridForecaster), build_twin=seeded(GridForecaster),
        make_inputs=lambda: (randn(2, 3, 16, 32),),
        make_targets=lambda: (randn(2, 3, 16, 32, seed=3),),
        loss_broken=weather_loss_broken, loss_twin=weather_loss_twin,
        where="the loss: per-latitude weights (16,) broadcast against the last axis (longitude, 32); "
              "a 32-long weight vector would run and weight longitudes",
        right_fix="w[:, None] (one weight per row/latitude)",
        fix_at_line=True, fix_patterns=(r"\[:, *None\]|unsqueeze\((-1|1)\)|view\(-1, *1\)|\[\.\.\., *None\]",),
        danger_patterns=(r"linspace\([^)]*32|repeat\(|expand\(|interpolate",),
        locate_patterns=(r"latitude_weights|\bw\b.*\(16,?\)|\[16\]",),
    ),
    _case(
        name="protein_pair_bias_heads", area="protein (pair representation bias in attention)",
        build_broken=seeded(PairBiasAttentionBroken), build_twin=seeded(PairBiasAttentionTwin),
        make_inputs=lambda: (randn(2, 10, 32),),
        where="bias(): the pair bias is (B, L, L, H), added to logits (B, H, L, L) without moving heads",
        right_fix="self.pair_bias(pair).permute(0, 3, 1, 2)",
        where_paths=("pair_bias",),
        fix_at_line=True, fix_at=("pair_bias",),
        fix_patterns=(r"permute\(0, ?3, ?1, ?2\)|movedim\((-1|3), ?1\)",),
        danger_patterns=(r"permute\(0, ?3, ?2, ?1\)|heads\s*=\s*10|out_features\s*=\s*10",),
    ),
    _case(
        name="crnn_height_not_collapsed", area="OCR (CRNN)",
        near_miss=True,
        build_broken=seeded(CRNNBroken), build_twin=seeded(CRNNTwin),
        make_inputs=lambda: (randn(2, 1, 32, 48),),
        where="cnn.11: the last height pool is (2, 1), leaving height 2, so squeeze(2) does nothing "
              "and permute fails; mean/flatten over the height there would run another model",
        right_fix="cnn.11 = MaxPool2d((4, 1)) (height 4 -> 1)",
        where_paths=("cnn.11", "cnn"), fix_at=("cnn.11",), fix_at_line=True,
        fix_patterns=(r"MaxPool2d\(\(4|kernel_size\s*=\s*\(4|\(4, ?1\)",),
        danger_patterns=(r"mean\((dim\s*=\s*)?2\)|flatten\(1, ?2\)|input_size\s*=\s*64|amax|max\((dim\s*=\s*)?2\)",),
    ),
    _case(
        name="distill_hint_adapter", area="knowledge distillation (temperature + feature hint)",
        build_broken=seeded(FeatureDistillBroken), build_twin=seeded(FeatureDistillTwin),
        make_inputs=lambda: (randn(4, 3, 16, 16),),
        where="adapt(): a per-position Linear(32, 64) applied to a channels-first (B, 32, h, w) map",
        right_fix="self.adapter(fs.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)",
        where_paths=("adapter",), fix_at=("adapter",), fix_at_line=True,
        fix_patterns=(r"permute\(0, ?2, ?3, ?1\)|movedim\(1, ?-1\)|movedim\(1, ?3\)",),
        danger_patterns=(r"in_features\s*=\s*(8|16)",),
    ),
    _case(
        name="ode_time_scalar_cat", area="neural ODE / physics MLP (RK4)",
        build_broken=seeded(NeuralODEBroken), build_twin=seeded(NeuralODETwin),
        make_inputs=lambda: (randn(8, 4),),
        where="field(): the scalar time t (0-d) concatenated to the (B, d) state",
        right_fix="t.expand(y.shape[0], 1)",
        fix_at_line=True, fix_patterns=(r"expand|repeat|full\(|expand_as|ones",),
    ),
    _case(
        name="fpn_topdown_odd_size", area="FPN multi-scale merge",
        build_broken=seeded(FPNBroken), build_twin=seeded(FPNTwin),
        make_inputs=lambda: (randn(2, 3, 52, 52),),
        where="merge(): scale_factor=2 upsamples 7 -> 14 where the lateral map is 13 (odd input size)",
        right_fix="F.interpolate(top, size=lateral.shape[-2:], mode='nearest')",
        fix_at_line=True, fix_patterns=(r"size\s*=\s*[\w.]*shape\[-2:\]|size=\(?13",),
        danger_patterns=(r"crop|\[\.\.\., *:13|F\.pad",),
    ),
    _case(
        name="pos2d_square_grid", area="learned 2-D positional embeddings (non-square grid)",
        near_miss=True,
        build_broken=seeded(RowColPositionBroken), build_twin=seeded(RowColPositionTwin),
        make_inputs=lambda: (randn(2, 3, 32, 64),),
        where="grid(): the patch grid assumed square (int(sqrt(32)) = 5) on a 4x8 grid; cropping the "
              "tokens or interpolating the table would run another model",
        right_fix="h, w = feat.shape[-2], feat.shape[-1]",
        fix_at_line=True, fix_patterns=(r"shape\[-2\]|shape\[-1\]|shape\[-2:\]|shape\[2\]",),
        danger_patterns=(r"interpolate|F\.pad|crop|max_side|\[:, *:25\]",),
    ),
    _case(
        name="mobile_residual_stride", area="mobile inverted-residual blocks",
        near_miss=True,
        build_broken=seeded(MobileNetBroken), build_twin=seeded(MobileNetTwin),
        make_inputs=lambda: (randn(4, 3, 32, 32),),
        where="has_residual(): the skip is kept on a stride-2 block (blocks.2), whose output is half "
              "the size; pooling the skip or stride 1 would run another model",
        right_fix="residual only when stride == 1 and cin == cout (blocks.2 has none)",
        where_paths=("blocks.2",), fix_at_line=True,
        fix_patterns=(r"use_res\w*\s*=\s*False|stride\s*==\s*1|no (residual|skip|shortcut)|drop the (residual|skip|shortcut)",),
        danger_patterns=(r"stride\s*=\s*1|avg_pool|max_pool|interpolate|downsample",),
    ),
    _case(
        name="mamba_scan_b_axis", area="selective scan (Mamba-like, by hand)",
        build_broken=seeded(SelectiveScanBroken), build_twin=seeded(SelectiveScanTwin),
        make_inputs=lambda: (randn(2, 6, 16),),
        where="step(): B_t (B, n) indexed as b_t[:, :, None] (B, n, 1) where the state is (B, d, n)",
        right_fix="b_t[:, None, :]",
        fix_at_line=True, fix_patterns=(r"b_t\[:, *None(, *:)?\]|b_t\.unsqueeze\(1\)",),
    ),
    _case(
        name="mdn_target_component_axis", area="mixture density network (loss)",
        build_broken=seeded(MDN), build_twin=seeded(MDN),
        make_inputs=lambda: (randn(8, 3),),
        make_targets=lambda: (randn(8, 2, seed=4),),
        loss_broken=mdn_nll_broken, loss_twin=mdn_nll_twin,
        where="the loss: the target y (B, D) is not given the component axis against mu (B, K, D)",
        right_fix="y[:, None, :]",
        fix_at_line=True, fix_patterns=(r"y\[:, *None|y\.unsqueeze\(1\)|\[:, *None, *:\]",),
        locate_patterns=(r"\by\b|target",),
    ),
    _case(
        name="vae_kl_axis", area="VAE (loss)",
        near_miss=True,
        build_broken=seeded(VAE), build_twin=seeded(VAE),
        make_inputs=lambda: (randn(8, 20),),
        make_targets=lambda: (randn(8, 20),),
        loss_broken=vae_loss_broken, loss_twin=vae_loss_twin,
        where="the loss: KL summed over the batch (sum(0) -> (z,)) instead of the latent (sum(1) -> (B,)); "
              "rec[:, None] + kl would run another loss",
        right_fix="kl ... .sum(1)",
        fix_at_line=True, fix_patterns=(r"sum\((dim\s*=\s*)?(1|-1)\)",),
        danger_patterns=(r"\[:, *None\]|unsqueeze|keepdim",),
        locate_patterns=(r"sum\(0\)|\bkl\b",),
    ),
]
