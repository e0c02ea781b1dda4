"""The broken-model corpus: one entry per case, graded by grade.py.

A case is a broken PyTorch model that raises (in its forward or in its loss) and a hand-fixed
twin in plain torch that computes what the author meant. Where the parameter shapes allow it the
same state_dict loads into both, so a fix applied to the broken model can be compared output for
output with the twin on the same weights: that comparison, not the wording of a suggestion, is the
strongest evidence a fix is right.

Fields a grader reads:
* ``where``: the module path or source line that is wrong, in words; the machine form is
  ``where_paths`` (module paths) and the ``# BUG(name)`` / ``# ALSO(name)`` markers in the model
  files (source lines); ``locate_patterns`` are regexes on the diagnosis text for bugs that sit in
  an input or a loss rather than a module.
* ``right_fix``: the twin's fix in words; ``fix_patterns``: regexes, one of which must match the
  first suggested fix's text; ``fix_at`` (module paths) / ``fix_at_line`` (a marked line): where
  that fix has to be put; ``danger_patterns``: quick fixes known to run and compute another model.
* ``hand``: judgements made by reading the printed fix (hand_grades.py), keyed by a fingerprint of
  the first fix's text (grade.py prints it); one applies only while the engine prints that text.

The cases were written without reading layerlab's rules, from areas the probe corpora do not cover.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import models_sequence as Q
from .hand_grades import HAND
from . import models_signal as G
from . import models_structured as S
from . import models_vision as V


@dataclass
class Case:
    name: str
    area: str
    build_twin: Callable[[], torch.nn.Module]
    build_broken: Callable[[], torch.nn.Module]
    make_inputs: Callable[[], Tuple[Any, ...]]
    where: str
    right_fix: str
    fix_patterns: Sequence[str]
    where_paths: Sequence[str] = ()
    fix_at: Sequence[str] = ()
    fix_at_line: bool = False
    locate_patterns: Sequence[str] = ()
    danger_patterns: Sequence[str] = ()
    make_twin_inputs: Optional[Callable[[], Tuple[Any, ...]]] = None
    make_targets: Optional[Callable[[], Tuple[Any, ...]]] = None
    loss_broken: Optional[Callable[..., torch.Tensor]] = None
    loss_twin: Optional[Callable[..., torch.Tensor]] = None
    near_miss: bool = False
    notes: str = ""
    hand: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    @property
    def shares_weights(self) -> bool:
        twin, broken = self.build_twin(), self.build_broken()
        a, b = twin.state_dict(), broken.state_dict()
        return a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=_gen(seed))


def randint(high, *shape, seed=0):
    return torch.randint(0, high, shape, generator=_gen(seed))


EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2, 4, 1], [1, 2, 3, 4, 5, 0, 3, 5, 1, 4]])

CASES = [
    Case("dgcnn_edge_cat_dim", "point cloud (DGCNN EdgeConv)", V.EdgeConvTwin, V.EdgeConvBroken,
         lambda: (randn(2, 3, 16),),
         where="models_vision.py: the torch.cat of [x_j - x_i, x_i] joins on dim 1 (points), not the feature dim",
         right_fix="cat on the last dim: torch.cat([nbr - ctr, ctr], dim=-1); conv keeps in_channels=2C=6",
         fix_patterns=[r"dim\s*=\s*(-1|3)\b"], fix_at_line=True,
         danger_patterns=[r"in_channels\s*=\s*3\b"], near_miss=True,
         notes="Conv2d raises (6 channels wanted, 3 given); in_channels=3 would run on a wrong edge tensor."),
    Case("pointnet_seg_global_keepdim", "point cloud (PointNet segmentation)", V.PointNetSegTwin,
         V.PointNetSegBroken, lambda: (randn(2, 3, 10),),
         where="models_vision.py: the global max over points drops the point axis (no keepdim), so expand(-1, -1, N) fails",
         right_fix="max(dim=2, keepdim=True) (or g.unsqueeze(-1) before the expand)",
         fix_patterns=[r"keepdim\s*=\s*True", r"unsqueeze\(\s*(-1|2)\s*\)", r"\[\s*(\.\.\.|:\s*,\s*:)\s*,\s*None\s*\]"],
         fix_at_line=True),
    Case("pointnet_tnet_bmm", "point cloud (PointNet T-Net)", V.TNetTwin, V.TNetBroken,
         lambda: (randn(2, 3, 10),),
         where="models_vision.py: bmm(x, t) with x channels-first (B, 3, N); the transform acts on points as rows",
         right_fix="torch.bmm(x.transpose(1, 2), t).transpose(1, 2) (equivalently bmm(t.transpose(1, 2), x)); bmm(t, x) runs but applies t, not its transpose",
         fix_patterns=[r"bmm\(\s*x\.(transpose|mT|permute)", r"bmm\(\s*t\.(transpose|mT)"], fix_at_line=True,
         danger_patterns=[r"bmm\(\s*t\s*,\s*x\s*\)"]),
    Case("video_conv3d_head_size", "video (Conv3d + flat head)", V.VideoHeadTwin, V.VideoHeadBroken,
         lambda: (randn(2, 3, 8, 16, 16),),
         where="conv1: built without padding=1, so it gives (3, 7, 7) instead of halving to (4, 8, 8)",
         right_fix="padding=1 on conv1 (fc keeps in_features=4*4*8*8=1024)",
         fix_patterns=[r"padding\s*=\s*(1|\(1,\s*1,\s*1\))"], where_paths=["conv1"], fix_at=["conv1"],
         danger_patterns=[r"in_features\s*=\s*588"], near_miss=True,
         notes="fc raises; in_features=588 runs but is a model for another feature map."),
    Case("video_frames_view_noncontig", "video (per-frame CNN + GRU)", V.FrameEncoderTwin,
         V.FrameEncoderBroken, lambda: (randn(2, 3, 4, 6, 6),),
         where="models_vision.py: view after permute on a non-contiguous clip",
         right_fix="reshape (or .contiguous().view) at that line",
         fix_patterns=[r"reshape", r"contiguous\(\)"], fix_at_line=True),
    Case("video_lstm_batch_first", "video (clip LSTM classifier, loss)", V.ClipLSTMTwin, V.ClipLSTMBroken,
         lambda: (randn(2, 5, 6),), make_targets=lambda: (torch.tensor([1, 3]),),
         loss_broken=lambda out, y: F.cross_entropy(out, y), loss_twin=lambda out, y: F.cross_entropy(out, y),
         where="lstm: a (B, T, F) clip fed to a seq-first LSTM; cross_entropy then sees T rows for B targets",
         right_fix="batch_first=True on lstm",
         fix_patterns=[r"batch_first\s*=\s*True"], where_paths=["lstm"], fix_at=["lstm"],
         danger_patterns=[r"y\[:\s*\d", r"out\[:\s*2", r"crop"]),
    Case("gnn_index_add_dim", "graph (message passing, index_add)", S.MPNNTwin, S.MPNNBroken,
         lambda: (randn(6, 8), EDGES.clone()),
         where="models_structured.py: index_add on dim 1 (features) instead of dim 0 (nodes)",
         right_fix="index_add(0, dst, m)",
         fix_patterns=[r"index_add\w*\(\s*0\b", r"dim\s*=\s*0\b"], fix_at_line=True),
    Case("gnn_scatter_reduce_index_rank", "graph (global max pool, scatter_reduce)", S.GraphMaxPoolTwin,
         S.GraphMaxPoolBroken, lambda: (randn(7, 8), torch.tensor([0, 0, 0, 1, 1, 1, 1])),
         where="models_structured.py: scatter_reduce given the (N,) batch vector as index for an (N, F) source",
         right_fix="index = batch.unsqueeze(1).expand(-1, F) (expand_as(h)); unsqueeze alone runs but pools only feature 0",
         fix_patterns=[r"expand", r"repeat\("], fix_at_line=True,
         danger_patterns=[r"^(?!.*(expand|repeat)).*unsqueeze\(\s*(1|-1)\s*\)"]),
    Case("gnn_edge_index_float", "graph (mean aggregation, float edge list)", S.MeanGCNTwin, S.MeanGCNTwin,
         lambda: (randn(6, 8), EDGES.float()), make_twin_inputs=lambda: (randn(6, 8), EDGES.clone()),
         where="the edge_index input: float (loaded with numpy), used as an index",
         right_fix="edge_index.long() where the input is made",
         fix_patterns=[r"\.long\(\)", r"int64", r"torch\.long"],
         locate_patterns=[r"edge_index", r"model input", r"\bdst\b.*(long|int64|float)"],
         notes="The same class serves both; the twin gets a long edge_index."),
    Case("moe_combine_weights_unsqueeze", "mixture of experts (combine)", S.MoETwin, S.MoECombineBroken,
         lambda: (randn(2, 6, 8),),
         where="models_structured.py: routing weights (BT, k) times selected outputs (BT, k, D) without a trailing axis",
         right_fix="w.unsqueeze(-1) * selected",
         fix_patterns=[r"unsqueeze\(\s*(-1|2)\s*\)", r"\[\s*(\.\.\.|:\s*,\s*:)\s*,\s*None\s*\]"], fix_at_line=True,
         danger_patterns=[r"unsqueeze\(\s*1\s*\)"]),
    Case("moe_topk_dim", "mixture of experts (router top-k)", S.MoETwin, S.MoETopkDimBroken,
         lambda: (randn(2, 6, 8),),
         where="models_structured.py: the router's topk over dim 0 (tokens) instead of the experts' axis",
         right_fix="topk(k, dim=-1) in the router call (route(h, -1))",
         fix_patterns=[r"topk.*dim\s*=\s*(-1|1)\b", r"route\(\s*h\s*,\s*-1\s*\)", r"dim\s*=\s*-1"], fix_at_line=True,
         danger_patterns=[r"clamp", r"% *4", r"num_experts", r"remainder"], near_miss=True,
         notes="gather raises index out of bounds; clamping or wrapping the indices would run on nonsense routes."),
    Case("flow_logdet_reduce_dim", "normalising flow (affine coupling log-det)", S.CouplingFlowTwin,
         S.CouplingFlowBroken, lambda: (randn(3, 4),),
         where="models_structured.py: log-det summed over the batch (dim 0) instead of per sample (dim 1)",
         right_fix="s.sum(dim=1)",
         fix_patterns=[r"sum\(\s*(dim\s*=\s*)?(1|-1)\s*\)"], fix_at_line=True,
         danger_patterns=[r"logdet\.sum\(\)", r"\.mean\(\)", r"unsqueeze", r"keepdim", r"\[:\s*3\]"], near_miss=True,
         notes="The add log_pz + logdet raises; summing logdet to a scalar would run and give every sample the batch's log-det."),
    Case("stn_theta_view", "spatial transformer (affine_grid)", V.STNTwin, V.STNBroken,
         lambda: (randn(2, 1, 12, 12),),
         where="models_vision.py: theta viewed as (-1, 3, 2); the 6 numbers are a 2x3 matrix row by row",
         right_fix="view(-1, 2, 3)",
         fix_patterns=[r"view\(\s*-1\s*,\s*2\s*,\s*3\s*\)", r"\(\s*-1\s*,\s*2\s*,\s*3\s*\)"], fix_at_line=True,
         danger_patterns=[r"transpose", r"permute", r"\.mT\b"], near_miss=True,
         notes="affine_grid raises; theta.transpose(1, 2) runs but is no longer the identity at init."),
    Case("stn_loc_flatten_size", "spatial transformer (tutorial localisation net)", V.STNTutorialTwin,
         V.STNTutorialBroken, lambda: (randn(2, 1, 20, 20),),
         where="fc_loc.0 / the view: sized 4*6*6 (another image size), the map is 4*8*8 = 256 per sample",
         right_fix="flatten per sample (view(x.size(0), -1) or view(-1, 256)) and fc_loc.0 in_features=256",
         fix_patterns=[r"256", r"size\(0\)\s*,\s*-1", r"flatten\(\s*1\s*\)", r"view\(\s*(2|B|x\.size\(0\)|xs\.size\(0\))\s*,\s*-1\s*\)"],
         where_paths=["fc_loc.0"], fix_at=["fc_loc.0"], fix_at_line=True),
    Case("nerf_posenc_in_features", "NeRF (positional encoding)", V.NeRFTwin, V.NeRFBroken,
         lambda: (randn(5, 3),),
         where="mlp.0: in_features 3*2*L forgets the identity term p itself (3 + 6L = 27)",
         right_fix="in_features=27 on mlp.0",
         fix_patterns=[r"in_features\s*=\s*27"], where_paths=["mlp.0"], fix_at=["mlp.0"]),
    Case("nerf_viewdir_stack_dim", "NeRF (view-direction encoding)", V.NeRFViewTwin, V.NeRFViewBroken,
         lambda: (randn(5, 3), randn(5, 3, seed=1)),
         where="models_vision.py: sin/cos stacked on dim 0 (in front of the rays) instead of last",
         right_fix="stack(dim=-1) in dir_encoding (dir_encoding(d, 2, -1))",
         fix_patterns=[r"stack.*dim\s*=\s*-1", r"dir_encoding\(\s*d\s*,\s*2\s*,\s*-1\s*\)"], fix_at_line=True,
         danger_patterns=[r"cat\(.*dim\s*=\s*0", r"expand", r"reshape\(\s*5\s*,", r"\bview\(\s*5\s*,"], near_miss=True),
    Case("perceiver_latents_unsqueeze", "Perceiver (latent cross-attention)", S.PerceiverTwin,
         S.PerceiverLatentsBroken, lambda: (randn(2, 10, 6),),
         where="models_structured.py: latents (M, D).unsqueeze(1) -> (M, 1, D); the batch axis is 0 and needs expanding",
         right_fix="self.latents.unsqueeze(0).expand(B, -1, -1)",
         fix_patterns=[r"unsqueeze\(\s*0\s*\)\s*\.\s*expand", r"\[\s*None\s*\]\s*\.\s*expand", r"repeat\(\s*(2|B|x\.size\(0\))\s*,\s*1\s*,\s*1\s*\)"],
         fix_at_line=True, danger_patterns=[r"batch_first\s*=\s*False", r"transpose\(\s*0\s*,\s*1\s*\)"]),
    Case("perceiver_input_proj_unused", "Perceiver (input projection never applied)", S.PerceiverTwin,
         S.PerceiverProjUnusedBroken, lambda: (randn(2, 10, 6),),
         where="models_structured.py: kv = x; the model's own `inp` Linear(6, 16) is never called",
         right_fix="kv = self.inp(x)",
         fix_patterns=[r"\binp\b"], where_paths=["inp"], fix_at_line=True,
         danger_patterns=[r"kdim", r"vdim", r"embed_dim\s*=\s*6"], near_miss=True,
         notes="attn raises on 6-dim keys; kdim=vdim=6 would run with new, untrained projections and leave inp unused."),
    Case("diffusion_temb_t_shape", "diffusion UNet (timestep embedding)", G.TimeResBlockTwin,
         G.TimeResBlockBroken, lambda: (randn(2, 4, 6, 6), torch.tensor([[3], [17]])),
         where="models_signal.py: the timestep embedding is built from t (B, 1) without flattening it: emb (B, 1, 16)",
         right_fix="flatten t to (B,) before the sinusoidal embedding (t.reshape(-1) / t.squeeze(1))",
         fix_patterns=[r"\bt\.(reshape|view)\(\s*-1\s*\)", r"\bt\.squeeze\(\s*(1|-1)?\s*\)", r"\bt\[\s*:\s*,\s*0\s*\]", r"\bt\.flatten\(\)"],
         fix_at_line=True, locate_patterns=[r"\bt\b.*\(2, 1\)"], near_miss=True,
         danger_patterns=[r"temb.*squeeze", r"\[\s*:\s*,\s*0\s*,\s*:\s*,\s*None", r"squeeze\(\s*1\s*\)\[", r"emb\[:\s*,\s*0"]),
    Case("diffusion_upsample_skip_size", "diffusion UNet (upsample to skip)", G.TinyUNetTwin,
         G.TinyUNetBroken, lambda: (randn(2, 4, 9, 9),),
         where="models_signal.py: interpolate(scale_factor=2) of a 5x5 map gives 10x10 against a 9x9 skip",
         right_fix="F.interpolate(m, size=x.shape[-2:], ...) (the skip's own size)",
         fix_patterns=[r"size\s*=\s*(x\.shape\[-2:\]|x\.shape\[2:\]|\(9,\s*9\)|\[9,\s*9\]|x\.size\(\)\[2:\]|x\.size\(\)\[-2:\])"],
         fix_at_line=True, danger_patterns=[r":\s*9\s*\]", r"\bcrop", r"F\.pad", r"\bpad\("]),
    Case("diffusion_null_class_embedding", "diffusion (classifier-free guidance label)", G.CFGConditionTwin,
         G.CFGConditionBroken, lambda: (randn(3, 8), torch.tensor([2, -1, 4])),
         where="emb: the dropped label -1 has no row; the table needs a null row (6) and -1 mapped to it",
         right_fix="nn.Embedding(n_classes + 1, 8) and y = where(y < 0, n_classes, y)",
         fix_patterns=[r"(?s)(-1|negative|null|dropped).*(6|n_classes\s*\+\s*1|extra row)"],
         where_paths=["emb"], locate_patterns=[r"-1"],
         danger_patterns=[r"clamp", r"abs\(\)", r"% *5"]),
    Case("rl_action_mask_float", "RL (policy with legal-action mask)", S.MaskedPolicyTwin,
         S.MaskedPolicyBroken, lambda: (randn(3, 6), torch.tensor([[1.0, 0, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1]])),
         where="models_structured.py: masked_fill given the float legal mask (1 = allowed) as if True meant 'mask out'",
         right_fix="masked_fill(legal == 0, -1e9) (~legal.bool()); legal.bool() runs and masks the legal actions",
         fix_patterns=[r"==\s*0", r"~\s*\(?legal", r"logical_not", r"<\s*0\.5", r"\bnot\b.*legal"], fix_at_line=True,
         danger_patterns=[r"(?<![~(])\blegal\.bool\(\)", r"(?<!~)\bmask\.bool\(\)", r"\.to\(torch\.bool\)"], near_miss=True),
    Case("rl_actions_float_gather", "RL (policy-gradient loss)", S.PolicyMLP, S.PolicyMLP,
         lambda: (randn(3, 6),), make_targets=lambda: (torch.tensor([1.0, 0.0, 3.0]),
                                                      torch.tensor([0.5, -1.0, 2.0])),
         loss_broken=S.pg_loss_broken, loss_twin=S.pg_loss_twin,
         where="models_structured.py (loss): the actions, stored float32 in the replay buffer, used as a gather index",
         right_fix="actions.long() before gather",
         fix_patterns=[r"\.long\(\)", r"int64", r"torch\.long"], locate_patterns=[r"float", r"actions"]),
    Case("optflow_unfold_padding", "optical flow (local correlation)", G.LocalCorrelationTwin,
         G.LocalCorrelationBroken, lambda: (randn(2, 3, 6, 6), randn(2, 3, 6, 6, seed=1)),
         where="models_signal.py: unfold of the second feature map without padding=r gives (H-2r)(W-2r) windows",
         right_fix="F.unfold(f2, kernel_size=2r+1, padding=r)",
         fix_patterns=[r"padding\s*=\s*(1|r|self\.r)\b"], fix_at_line=True,
         danger_patterns=[r"reshape\(.*-1", r"view\(.*-1"]),
    Case("capsule_u_hat_unsqueeze", "capsule network (prediction vectors)", G.CapsuleLayerTwin,
         G.CapsuleLayerBroken, lambda: (randn(2, 6, 5),),
         where="models_signal.py: W @ u[:, :, None, :] treats u as a row; it needs a trailing column axis",
         right_fix="u[:, :, None, :, None] (u.unsqueeze(2).unsqueeze(-1))",
         fix_patterns=[r"unsqueeze\(\s*-1\s*\)", r",\s*None\s*\]", r"\[\s*\.\.\.\s*,\s*None\s*\]"], fix_at_line=True,
         danger_patterns=[r"transpose\(\s*-2\s*,\s*-1\s*\)", r"\.mT\b"]),
    Case("hypernet_bmm_unsqueeze", "hypernetwork (per-sample weights)", Q.HyperLinearTwin,
         Q.HyperLinearBroken, lambda: (randn(3, 5), randn(3, 3, seed=1)),
         where="models_sequence.py: bmm(W, x) with x (B, 5): x needs a column axis",
         right_fix="torch.bmm(W, x.unsqueeze(-1)).squeeze(-1)",
         fix_patterns=[r"x\.unsqueeze\(\s*(-1|2)\s*\)", r"x\[\s*(\.\.\.|:\s*,\s*:)\s*,\s*None\s*\]"], fix_at_line=True),
    Case("colbert_doc_mask_broadcast", "retrieval (ColBERT MaxSim padding mask)", Q.ColBERTTwin,
         Q.ColBERTMaskBroken,
         lambda: (randn(2, 3, 8), randn(2, 5, 8, seed=1),
                  torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])),
         where="models_sequence.py: the (B, Ld) document mask applied to (B, Lq, Ld) scores without a query axis",
         right_fix="~dmask[:, None, :] (dmask.unsqueeze(1))",
         fix_patterns=[r"\[\s*:\s*,\s*None\s*(,\s*:)?\s*\]", r"unsqueeze\(\s*1\s*\)"], fix_at_line=True,
         danger_patterns=[r"unsqueeze\(\s*-1\s*\)", r"\[\s*\.\.\.\s*,\s*None\s*\]", r"\[\s*:\s*,\s*:\s*,\s*None"]),
    Case("colbert_matmul_transpose", "retrieval (ColBERT similarity)", Q.ColBERTTwin, Q.ColBERTMatmulBroken,
         lambda: (randn(2, 3, 8), randn(2, 5, 8, seed=1),
                  torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])),
         where="models_sequence.py: qe @ de without transposing the document embeddings",
         right_fix="qe @ de.transpose(1, 2)",
         fix_patterns=[r"de\.transpose\(\s*(1\s*,\s*2|2\s*,\s*1|-2\s*,\s*-1|-1\s*,\s*-2)\s*\)", r"de\.mT\b"], fix_at_line=True,
         danger_patterns=[r"qe\.transpose", r"de\s*@\s*qe"]),
    Case("multitask_bce_target_shape", "multi-task heads (BCE loss)", Q.MultiTaskTwin, Q.MultiTaskTwin,
         lambda: (randn(4, 10),), make_targets=lambda: (torch.tensor([0.0, 1.0, 1.0, 0.0]), randn(4, 2, seed=2)),
         loss_broken=Q.multitask_loss_broken, loss_twin=Q.multitask_loss_twin,
         where="models_sequence.py (loss): (B, 1) logits against (B,) float targets in BCE-with-logits",
         right_fix="logits.squeeze(1) (or the target unsqueeze(1))",
         fix_patterns=[r"squeeze\(\s*(1|-1)?\s*\)", r"unsqueeze\(\s*(1|-1)\s*\)", r"view\(\s*-1\s*\)", r"flatten\(\)", r"view_as"],
         locate_patterns=[r"binary_cross_entropy", r"\bcls\b", r"output\s*\[?0"]),
    Case("gfnet_rfft_weight_size", "spectral (GFNet global filter)", G.GlobalFilterTwin, G.GlobalFilterBroken,
         lambda: (randn(2, 4, 8, 8),),
         where="the filter `weight` sized (C, H, W, 2); rfft2 keeps W//2 + 1 = 5 frequencies on the last axis",
         right_fix="weight of shape (C, H, W//2 + 1, 2)",
         fix_patterns=[r"//\s*2\s*\+\s*1", r"\(4,\s*8,\s*5,\s*2\)", r"\b5\b.*rfft|rfft.*\b5\b"],
         where_paths=["weight"], locate_patterns=[r"\bweight\b", r"rfft"],
         danger_patterns=[r"\bfft2\(", r"\[\s*\.\.\.\s*,\s*:\s*5", r":5\]"]),
    Case("fft_irfft_odd_length", "spectral (FNO, odd length)", G.SpectralConv1dTwin, G.SpectralConv1dBroken,
         lambda: (randn(2, 4, 15),),
         where="models_signal.py: irfft without n= returns 2*(15//2) = 14 samples for a length-15 input",
         right_fix="torch.fft.irfft(X, n=x.size(-1))",
         fix_patterns=[r"\bn\s*=\s*(x\.size\(-1\)|15|x\.shape\[-1\]|L)\b"], fix_at_line=True,
         danger_patterns=[r"F\.pad", r"\bpad\(", r":\s*14\s*\]", r":\s*-1\s*\]", r"\bcrop"]),
    Case("gqa_repeat_interleave_dim", "attention (grouped-query, kv heads)", Q.GQATwin, Q.GQARepeatDimBroken,
         lambda: (randn(2, 5, 16),),
         where="models_sequence.py: repeat_interleave of k and v on dim 2 (time) instead of dim 1 (heads)",
         right_fix="repeat_interleave(g, dim=1) for k and v; k.repeat(1, g, 1, 1) runs but pairs the heads differently",
         fix_patterns=[r"repeat_interleave.*dim\s*=\s*1\b", r"dim\s*=\s*1\b"], fix_at_line=True,
         danger_patterns=[r"\.repeat\(", r"expand", r"dim\s*=\s*-3"]),
    Case("gqa_kv_proj_size", "attention (grouped-query, kv projection size)", Q.GQATwin, Q.GQAProjSizeBroken,
         lambda: (randn(2, 5, 16),),
         where="k and v: Linear(16, 16) where 2 kv heads x head dim 4 = 8 outputs are meant",
         right_fix="out_features=8 on k (and v)",
         fix_patterns=[r"out_features\s*=\s*8\b"], where_paths=["k", "v"], fix_at=["k", "v"],
         danger_patterns=[r"view\(.*-1", r"\b4\b.*\bheads?\b"]),
    Case("pad_even_kernel_same", "padding (even kernel 'same')", Q.SameConvBlockTwin, Q.SameConvBlockBroken,
         lambda: (randn(2, 4, 10),),
         where="models_sequence.py: F.pad(k//2, k//2) pads 4 for a kernel of 4: one sample too many",
         right_fix="F.pad(x, (1, 2)) (torch's padding='same' for k=4); cropping the last output shifts the window",
         fix_patterns=[r"\(\s*1\s*,\s*2\s*\)", r"padding\s*=\s*['\"]same", r"k\s*//\s*2\s*-\s*1"], fix_at_line=True,
         danger_patterns=[r"\(\s*2\s*,\s*1\s*\)", r":\s*-1\s*\]", r":\s*10\s*\]", r"\(\s*1\s*,\s*1\s*\)"]),
    Case("unbatched_conv_input", "unbatched input (one clip, no batch dim)", Q.KeywordSpotter, Q.KeywordSpotter,
         lambda: (randn(2, 16),), make_twin_inputs=lambda: (randn(2, 16).unsqueeze(0),),
         where="the input: one (2, 16) clip without its batch axis; Conv1d accepts it unbatched and flatten(1) then splits channels",
         right_fix="x.unsqueeze(0) (a batch of one)",
         fix_patterns=[r"unsqueeze\(\s*0\s*\)", r"\[\s*None\s*\]", r"batch (dim|axis) of (1|one)", r"\(1,\s*2,\s*16\)"],
         locate_patterns=[r"unbatched", r"batch (dim|axis)", r"no batch"],
         danger_patterns=[r"in_features\s*=\s*7\b", r"flatten\(\s*0\s*\)"], near_miss=True,
         notes="fc raises; in_features=7 runs and classifies each of the 4 channels as a sample."),
    Case("positions_float_embedding", "embeddings (float position ids)", Q.TokPosTwin, Q.TokPosBroken,
         lambda: (randint(20, 2, 6),),
         where="models_sequence.py: torch.arange(0, T, 1.0) makes float positions for the Embedding",
         right_fix="integer positions: torch.arange(T) (or .long())",
         fix_patterns=[r"\.long\(\)", r"int64", r"torch\.long", r"arange\(\s*(ids\.size\(1\)|6|T)\s*\)"],
         where_paths=["pos"], fix_at=["pos"], fix_at_line=True),
    Case("label_smoothing_scatter_rank", "loss (hand-written label smoothing)", Q.SmallClassifier,
         Q.SmallClassifier, lambda: (randn(4, 6),), make_targets=lambda: (torch.tensor([0, 3, 1, 4]),),
         loss_broken=Q.smoothed_ce_broken, loss_twin=Q.smoothed_ce_twin,
         where="models_sequence.py (loss): scatter_ with the (B,) class ids as index for a (B, C) tensor",
         right_fix="y.unsqueeze(1) as the index",
         fix_patterns=[r"unsqueeze\(\s*(1|-1)\s*\)", r"\[\s*:\s*,\s*None\s*\]", r"view\(\s*-1\s*,\s*1\s*\)"],
         fix_at_line=True),
    Case("sentence_meanpool_keepdim", "sentence embeddings (masked mean pool)", Q.MeanPoolEncoderTwin,
         Q.MeanPoolEncoderBroken,
         lambda: (randint(30, 3, 5), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])),
         where="models_sequence.py: the token count mask.sum(1) is (B,) and divides a (B, D) sum",
         right_fix="mask.sum(1, keepdim=True)",
         fix_patterns=[r"keepdim\s*=\s*True", r"unsqueeze\(\s*(1|-1)\s*\)", r"\[\s*:\s*,\s*None\s*\]"], fix_at_line=True,
         danger_patterns=[r"unsqueeze\(\s*0\s*\)", r"\[\s*None\s*\]"]),
    Case("tcn_causal_crop_zero", "TCN (causal crop)", Q.TCNTwin, Q.TCNBroken, lambda: (randn(2, 4, 12),),
         where="models_sequence.py: h[..., :-p] with p = 0 keeps nothing (the 1x1 layer needs no crop)",
         right_fix="crop only when p > 0: h[..., :h.size(-1) - p]",
         fix_patterns=[r"if\s+p\b", r"size\(-1\)\s*-\s*p", r"p\s*>\s*0", r"shape\[-1\]\s*-\s*p", r":-p or None"],
         fix_at_line=True, danger_patterns=[r"padding\s*=", r"expand"]),
    Case("stft_complex_conv", "audio (STFT magnitude)", G.SpecCNNTwin, G.SpecCNNBroken, lambda: (randn(2, 256),),
         where="models_signal.py: the complex STFT goes into the Conv2d; the magnitude was meant",
         right_fix=".abs() after torch.stft; .real or .float() runs on another quantity",
         fix_patterns=[r"\.abs\(\)", r"torch\.abs"], fix_at_line=True,
         danger_patterns=[r"\.real\b", r"\.float\(\)", r"view_as_real", r"\.to\(torch\.float"], near_miss=True),
]


def by_name(name):
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(name)


for _case in CASES:
    _case.hand.update(HAND.get(_case.name, {}))
