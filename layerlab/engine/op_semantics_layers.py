"""The layers' part of the op-semantics table: their functional forms as contracts.

``F.linear``, ``F.conv*``, the norms, ``F.embedding``, the RNN kernels, attention and the losses,
registered into the one table of :mod:`layerlab.engine.op_semantics` (same decorator, same refusal
of a callable registered twice). A contract says which input axis a layer's weight is sized for
(a ``bind`` event), which axes it maps over (``role`` events: batch, sequence, spatial; this is how
the roles of the input axes are learnt), and which new axis it makes (its features).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from layerlab.engine.labels import broadcast, resized
from layerlab.engine.op_semantics import _dim, semantics


@semantics("contract", F.linear)
def _linear(ctx):
    lab = ctx.in_labels[0]
    weight = ctx.arg(1, "weight")
    ctx.event("bind", axes=[len(lab) - 1], labels=[lab[-1]], sizes=[weight.shape[-1]], layer="linear")
    if len(lab) > 1:  # the axes a Linear maps over are free: any size runs
        ctx.event("role", labels=list(lab[:-1]), role="batch-or-seq")
    return [lab[:-1] + (ctx.param_axis(weight, 0),)]


@semantics("contract", F.bilinear)
def _bilinear(ctx):
    lab = ctx.in_labels[0]
    return [lab[:-1] + (ctx.param_axis(ctx.arg(2, "weight"), 0),)]


def _conv(ctx):
    lab = ctx.in_labels[0]
    weight = ctx.arg(1, "weight")
    nd = weight.dim() - 2
    out = ctx.out_shapes[0]
    batched = len(lab) == nd + 2
    c = 1 if batched else 0
    ctx.event("bind", axes=[c], labels=[lab[c]], sizes=[ctx.in_shapes[0][c]], layer="conv")
    ctx.event("role", labels=[lab[0]] if batched else [], role="batch")
    ctx.event("role", labels=list(lab[c + 1:]), role="spatial")
    transposed = ctx.func in (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
    channel = ctx.param_axis(weight, 1 if transposed else 0)
    return [(lab[:c] + (channel,) + tuple(resized(x, s) for x, s in zip(lab[c + 1:], out[c + 1:])))]


for _f in (F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d):
    semantics("contract", _f)(_conv)


@semantics("contract", F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
           F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d, F.adaptive_max_pool1d,
           F.adaptive_max_pool2d, F.adaptive_max_pool3d, F.lp_pool1d, F.lp_pool2d, F.interpolate, F.upsample,
           F.pad, torch.constant_pad_nd, F.max_pool1d_with_indices, F.max_pool2d_with_indices)
def _resize(ctx):
    lab = ctx.in_labels[0]
    return [tuple(resized(x, s) if x is not None and s != size else x
                  for x, s, size in zip(lab, out, ctx.in_shapes[0])) for out in ctx.out_shapes]


@semantics("contract", F.batch_norm, F.instance_norm, F.group_norm)
def _channel_norm(ctx):
    lab = ctx.in_labels[0]
    weight = ctx.arg(3, "weight") if ctx.func is not F.group_norm else ctx.arg(2, "weight")
    running = ctx.arg(1, "running_mean") if ctx.func is F.batch_norm else None
    param = next((p for p in (weight, running) if isinstance(p, torch.Tensor)), None)
    if len(lab) >= 2 and param is not None:
        ctx.event("bind", axes=[1], labels=[lab[1]], sizes=[param.shape[0]], layer=ctx.name)
        ctx.event("role", labels=[lab[0]], role="batch")
    return [lab]


@semantics("contract", F.layer_norm, F.rms_norm if hasattr(F, "rms_norm") else None)
def _layer_norm(ctx):
    lab = ctx.in_labels[0]
    shape = ctx.arg(1, "normalized_shape")
    k = len(shape) if isinstance(shape, (list, tuple, torch.Size)) else 1
    weight = ctx.arg(2, "weight")
    if isinstance(weight, torch.Tensor) and 0 < k <= len(lab):
        ctx.event("bind", axes=list(range(len(lab) - k, len(lab))), labels=list(lab[-k:]),
                  sizes=list(weight.shape), layer=ctx.name)
    ctx.event("normalize", axes=list(range(len(lab) - k, len(lab))), labels=list(lab[-k:]))
    if len(lab) > k:
        ctx.event("role", labels=list(lab[:-k]), role="batch-or-seq")
    return [lab]


@semantics("contract", F.embedding, F.one_hot)
def _embedding(ctx):
    lab = ctx.in_labels[0]
    ctx.event("role", labels=list(lab[:1]), role="batch-or-seq")
    ctx.event("role", labels=list(lab[1:]), role="seq")
    if ctx.func is F.one_hot:
        return [lab + (ctx.new("one_hot", ctx.out_shapes[0][-1]),)]
    return [lab + (ctx.param_axis(ctx.arg(1, "weight"), 1),)]


def _rnn(ctx):
    """``_VF.lstm/gru/rnn_*(input, hx, params, has_biases, layers, dropout, train, bidirectional,
    batch_first)``: the output keeps the time and batch axes, with new features; h_n is
    (layers·directions, batch, hidden)."""
    lab = ctx.in_labels[0]
    if len(ctx.args) < 9 or not isinstance(ctx.args[8], bool) or len(lab) != 3:
        return None  # packed sequences, or unbatched input
    batch_first = ctx.args[8]
    b, t = (0, 1) if batch_first else (1, 0)
    ctx.event("role", labels=[lab[b]], role="batch")
    ctx.event("role", labels=[lab[t]], role="seq")
    ctx.event("bind", axes=[2], labels=[lab[2]], sizes=[ctx.in_shapes[0][2]], layer="rnn")
    feat = ctx.new("rnn features", ctx.out_shapes[0][-1])
    out = [lab[:2] + (feat,)]
    for shape in ctx.out_shapes[1:]:
        out.append((ctx.new("rnn layers", shape[0]), lab[b], ctx.new("rnn hidden", shape[-1]))
                   if len(shape) == 3 else None)
    return out


for _name in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
    semantics("contract", getattr(torch, _name, None))(_rnn)


@semantics("contract", F.scaled_dot_product_attention)
def _sdpa(ctx):
    q, k, v = ctx.in_labels[:3]
    sq, sk, sv = ctx.in_shapes[:3]
    ctx.event("contract", pairs=[(q[-1], sq[-1], k[-1], sk[-1]), (k[-2], sk[-2], v[-2], sv[-2])])
    batch, meets = broadcast([q[:-2], k[:-2], v[:-2]], [sq[:-2], sk[:-2], sv[:-2]], ctx.out_shapes[0][:-2])
    if meets:
        ctx.event("broadcast", meets=meets)
    return [tuple(batch) + (q[-2], v[-1])]


@semantics("contract", F.multi_head_attention_forward)
def _mha(ctx):
    q = ctx.in_labels[0]
    outs = [q[:-1] + (ctx.new("attention output", ctx.out_shapes[0][-1]),)]
    return outs + [None] * (len(ctx.outs) - 1)


@semantics("loss", F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.binary_cross_entropy,
           F.binary_cross_entropy_with_logits, F.soft_margin_loss, F.kl_div, F.poisson_nll_loss,
           F.gaussian_nll_loss)
def _pairwise_loss(ctx):
    labels, meets = broadcast(ctx.in_labels[:2], ctx.in_shapes[:2], torch.broadcast_shapes(*ctx.in_shapes[:2]))
    if meets:
        ctx.event("broadcast", meets=meets)
    return [() if ctx.out_shapes[0] == [] else labels]


@semantics("loss", F.cross_entropy, F.nll_loss)
def _class_loss(ctx):
    lab = ctx.in_labels[0]
    if len(lab) >= 2:
        ctx.event("role", labels=[lab[0]], role="batch")
    return [() if ctx.out_shapes[0] == [] else lab[:1] + lab[2:]]


@semantics("reduce", F.cosine_similarity, F.pairwise_distance)
def _cosine(ctx):
    labels, meets = broadcast(ctx.in_labels[:2], ctx.in_shapes[:2], torch.broadcast_shapes(*ctx.in_shapes[:2]))
    if meets:
        ctx.event("broadcast", meets=meets)
    n = len(labels)
    d = _dim(ctx.arg(2, "dim", 1) if ctx.func is F.cosine_similarity else -1, n)
    ctx.event("reduce", axes=[d], labels=[labels[d]], keepdim=False)
    return [labels[:d] + labels[d + 1:]]


