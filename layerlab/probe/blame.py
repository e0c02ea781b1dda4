"""Why did this layer raise? Explanations from each layer's contract, with the fix.

:func:`diagnose` looks at the module that failed and the inputs it was really given (the call is
still open when the exception arrives, so its arguments are at hand) and returns a
:class:`Diagnosis`: the rule, expected versus got, and how to fix it. The generic device and
dtype rules come first (their torch messages are the least readable), then one rule per layer
family. ``None`` means no rule recognised the failure; torch's own message is then shown alone.

Shape symbols: N batch, C channels, L/S sequence lengths (query/key), E embedding, H hidden size,
D directions (2 if bidirectional else 1).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
import torch.nn as nn

from layerlab.probe.formula import explain_failure
from layerlab.probe.hooks import dtype_name, flatten, forward_arg_names
from layerlab.probe.report import Diagnosis


def _tensors(args: tuple, kwargs: dict) -> List[torch.Tensor]:
    leaves = [v for _, v in flatten(list(args))] + [v for _, v in flatten(dict(kwargs))]
    return [v for v in leaves if isinstance(v, torch.Tensor)]


def _arg(module: nn.Module, args: tuple, kwargs: dict, name: str, position: int) -> Any:
    if name in kwargs:
        return kwargs[name]
    names = forward_arg_names(type(module))
    if name in names:
        position = names.index(name)
    return args[position] if position < len(args) else None


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


# -- generic rules ------------------------------------------------------------------------------
def _device_rule(module, args, kwargs, exc) -> Optional[Diagnosis]:
    own = [t for t in [*module.parameters(), *module.buffers()]]
    if not own:
        return None
    where = own[0].device
    for t in _tensors(args, kwargs):
        if t.device != where:
            return Diagnosis(
                f"{type(module).__name__}'s parameters are on {where} but an input is on {t.device}",
                expected=f"inputs on {where}",
                got=f"input {_shape(t)} on {t.device}",
                hint=f"move the input with x.to('{where}'), or the module with module.to('{t.device}') "
                "(--device sets both)",
                rule="every tensor of one op must be on the same device",
            )
    return None


def _dtype_rule(module, args, kwargs, exc) -> Optional[Diagnosis]:
    floats = [p for p in module.parameters() if p.is_floating_point()]
    if not floats or isinstance(module, nn.Embedding):
        return None
    want = floats[0].dtype
    for t in _tensors(args, kwargs):
        if t.is_floating_point() and t.dtype != want:
            return Diagnosis(
                f"{type(module).__name__}'s parameters are {dtype_name(want)} but an input is "
                f"{dtype_name(t.dtype)}",
                expected=f"inputs of dtype {dtype_name(want)}",
                got=f"input {_shape(t)} of dtype {dtype_name(t.dtype)}",
                hint=f"convert the input with x.to(torch.{dtype_name(want)}), or the module with "
                f"module.to(torch.{dtype_name(t.dtype)}) (--dtype sets both)",
                rule="an op's inputs and weights must share one dtype (outside autocast)",
            )
    return None


# -- layer rules --------------------------------------------------------------------------------
def _linear(module: nn.Linear, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] == module.in_features:
        return None
    got = x.shape[-1]
    return Diagnosis(
        f"Linear expects last dim = in_features = {module.in_features}, got {got} "
        f"(input {_shape(x)})",
        expected=f"[*, {module.in_features}]",
        got=_shape(x),
        hint=f"set in_features={got}, or reshape the input so that its last dim is {module.in_features}",
        rule="Linear: input [*, in_features] → output [*, out_features]",
    )


def _conv(module: nn.modules.conv._ConvNd, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    nd = len(module.kernel_size)
    name = type(module).__name__
    dims = "".join("DHW"[3 - nd:])
    if x.dim() not in (nd + 1, nd + 2):
        return Diagnosis(
            f"{name} expects a {nd + 1}-D (C, {', '.join(dims)}) or {nd + 2}-D "
            f"(N, C, {', '.join(dims)}) input, got {x.dim()}-D {_shape(x)}",
            expected=f"{nd + 2}-D (N, C, {', '.join(dims)})", got=_shape(x),
            hint="add or remove a dimension (x.unsqueeze(0) for a single sample; check a Flatten or view before it)",
            rule=f"{name}: input (N, C_in, {', '.join(dims)})",
        )
    channels = x.shape[1] if x.dim() == nd + 2 else x.shape[0]
    if channels != module.in_channels:
        return Diagnosis(
            f"{name} expects C = in_channels = {module.in_channels} input channels, got {channels} "
            f"(input {_shape(x)})",
            expected=module.in_channels, got=channels,
            hint=f"set in_channels={channels}, or make the previous layer output {module.in_channels} channels",
            rule=f"{name}: input (N, C_in = in_channels, *) — weight {_shape(module.weight)}, groups={module.groups}",
        )
    return _formula(module, x)


def _formula(module, x) -> Optional[Diagnosis]:
    err = explain_failure(module, _shape(x))
    if err is None:
        return None
    return Diagnosis(err.message, expected=err.expected, got=err.got, hint=err.hint, rule=err.rule)


def _shape_layer(module, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    return _formula(module, x) if isinstance(x, torch.Tensor) else None


def _rnn(module: nn.RNNBase, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    name = type(module).__name__
    layout = "(N, L, input_size)" if module.batch_first else "(L, N, input_size)"
    if x.dim() not in (2, 3):
        return Diagnosis(
            f"{name} expects a 3-D input {layout} or a 2-D unbatched (L, input_size), got {x.dim()}-D {_shape(x)}",
            expected=layout, got=_shape(x), hint="reshape the input to 3-D",
            rule=f"{name}: input {layout} (batch_first={module.batch_first})",
        )
    if x.shape[-1] != module.input_size:
        return Diagnosis(
            f"{name} expects last dim = input_size = {module.input_size}, got {x.shape[-1]} (input {_shape(x)})",
            expected=module.input_size, got=x.shape[-1],
            hint=f"set input_size={x.shape[-1]}, or project the input to {module.input_size} features",
            rule=f"{name}: input {layout} (batch_first={module.batch_first})",
        )
    return _rnn_hidden(module, x, _arg(module, args, kwargs, "hx", 1))


def _rnn_hidden(module: nn.RNNBase, x: torch.Tensor, hx: Any) -> Optional[Diagnosis]:
    if hx is None:
        return None
    name = type(module).__name__
    d = 2 if module.bidirectional else 1
    lead = [module.num_layers * d]
    if x.dim() == 3:
        lead.append(x.shape[0] if module.batch_first else x.shape[1])
    h_size = module.proj_size if getattr(module, "proj_size", 0) else module.hidden_size
    wanted = [("h0", lead + [h_size])]
    states = [hx]
    if isinstance(module, nn.LSTM):
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            return Diagnosis(
                "LSTM expects its state as a tuple (h0, c0)", expected="(h0, c0)", got=type(hx).__name__,
                hint="pass hx=(h0, c0), or nothing for zeros", rule="LSTM: hx = (h0, c0)",
            )
        wanted.append(("c0", lead + [module.hidden_size]))
        states = list(hx)
    for (label, want), state in zip(wanted, states):
        if isinstance(state, torch.Tensor) and _shape(state) != want:
            got = _shape(state)
            swap = "" if sorted(got) != sorted(want) else (
                " — it looks like batch-first; use h0.transpose(0, 1).contiguous()"
            )
            return Diagnosis(
                f"{name} expects {label} of shape [num_layers·D, N, H] = {want}, got {got}"
                + (" (the batch is dim 1 even with batch_first=True)" if module.batch_first else ""),
                expected=want, got=got,
                hint=f"build {label} as torch.zeros({', '.join(map(str, want))}){swap}",
                rule=f"{name}: {label} [num_layers·D, N, H], D = {d}, H = {want[-1]}; batch_first never applies to states",
            )
    return None


def _mha(module: nn.MultiheadAttention, args, kwargs, exc) -> Optional[Diagnosis]:
    q = _arg(module, args, kwargs, "query", 0)
    k = _arg(module, args, kwargs, "key", 1)
    v = _arg(module, args, kwargs, "value", 2)
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None
    layout = "(N, L, E)" if module.batch_first else "(L, N, E)"
    rule = f"MultiheadAttention: query {layout}, key/value {layout.replace('L', 'S')}, batch_first={module.batch_first}"
    for label, t, want in (("query", q, module.embed_dim), ("key", k, module.kdim), ("value", v, module.vdim)):
        if t.shape[-1] != want:
            attr = "embed_dim" if label == "query" else ("kdim" if label == "key" else "vdim")
            return Diagnosis(
                f"MultiheadAttention expects {label}'s last dim = {attr} = {want}, got {t.shape[-1]} "
                f"({label} {_shape(t)})",
                expected=want, got=t.shape[-1],
                hint=f"set {attr}={t.shape[-1]}" + (" (and num_heads dividing it)" if attr == "embed_dim" else ""),
                rule=rule,
            )
    batched = q.dim() == 3
    n = (q.shape[0] if module.batch_first else q.shape[1]) if batched else None
    L = q.shape[-2] if (batched and module.batch_first) or not batched else q.shape[0]
    S = k.shape[-2] if (batched and module.batch_first) or not batched else k.shape[0]
    mask = _arg(module, args, kwargs, "attn_mask", 5)
    if isinstance(mask, torch.Tensor):
        ok2 = [L, S]
        ok3 = [n * module.num_heads, L, S] if n is not None else None
        if _shape(mask) not in (ok2, ok3):
            return Diagnosis(
                f"attn_mask must be (L, S) = {ok2}" + (f" or (N·num_heads, L, S) = {ok3}" if ok3 else "")
                + f", got {_shape(mask)}",
                expected=ok2, got=_shape(mask),
                hint=f"build it for L = {L} queries and S = {S} keys, e.g. "
                f"nn.Transformer.generate_square_subsequent_mask({L}) for a causal mask",
                rule="attn_mask: True / −inf = may not attend; 2-D is shared by every batch and head",
            )
    kpm = _arg(module, args, kwargs, "key_padding_mask", 3)
    if isinstance(kpm, torch.Tensor) and n is not None and _shape(kpm) != [n, S]:
        return Diagnosis(
            f"key_padding_mask must be (N, S) = {[n, S]}, got {_shape(kpm)}",
            expected=[n, S], got=_shape(kpm),
            hint="one row per sequence, one column per key; True marks padding to ignore",
            rule="key_padding_mask (N, S): True = ignore this key",
        )
    return None


def _layer_norm(module: nn.LayerNorm, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    want = list(module.normalized_shape)
    if not isinstance(x, torch.Tensor) or _shape(x)[-len(want):] == want:
        return None
    tail = _shape(x)[-len(want):] if x.dim() >= len(want) else _shape(x)
    return Diagnosis(
        f"LayerNorm normalizes the last {len(want)} dim(s) and expects them = normalized_shape = {want}, "
        f"got {tail} (input {_shape(x)})",
        expected=[ "*", *want], got=_shape(x),
        hint=f"set normalized_shape={tail if len(tail) > 1 else tail[0]}",
        rule="LayerNorm: input [*, *normalized_shape]",
    )


def _batch_norm(module: nn.modules.batchnorm._BatchNorm, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    name = type(module).__name__
    dims = {"BatchNorm1d": (2, 3), "BatchNorm2d": (4,), "BatchNorm3d": (5,)}.get(name)
    if dims and x.dim() not in dims:
        return Diagnosis(
            f"{name} expects a {' or '.join(f'{d}-D' for d in dims)} input, got {x.dim()}-D {_shape(x)}",
            expected=" or ".join(f"{d}-D" for d in dims), got=_shape(x),
            hint="BatchNorm1d for (N, C) or (N, C, L), BatchNorm2d for (N, C, H, W), BatchNorm3d for (N, C, D, H, W)",
            rule=f"{name}: input (N, C = num_features, *)",
        )
    if x.dim() >= 2 and x.shape[1] != module.num_features:
        return Diagnosis(
            f"{name} expects C = num_features = {module.num_features} (dim 1), got {x.shape[1]} (input {_shape(x)})",
            expected=module.num_features, got=x.shape[1],
            hint=f"set num_features={x.shape[1]}",
            rule=f"{name}: input (N, C = num_features, *)",
        )
    per_channel = x.numel() // max(x.shape[1], 1) if x.dim() >= 2 else x.numel()
    if module.training and per_channel <= 1:
        return Diagnosis(
            f"{name} in training mode needs more than 1 value per channel to compute batch statistics, "
            f"got input {_shape(x)}",
            expected="N·(spatial) > 1", got=_shape(x),
            hint="use a batch of 2 or more, or run in eval mode (--mode eval)",
            rule="BatchNorm (train): statistics over N and the spatial dims",
        )
    return None


def _embedding(module: nn.Embedding, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    if not isinstance(x, torch.Tensor):
        return None
    if x.is_floating_point() or x.dtype == torch.bool:
        return Diagnosis(
            f"Embedding expects integer ids (int64 or int32), got {dtype_name(x.dtype)}",
            expected="int64", got=dtype_name(x.dtype),
            hint="pass token ids as x.long() (in a spec: dtype: int64 with low/high)",
            rule="Embedding: ids (*) integer in [0, num_embeddings)",
        )
    if x.numel() == 0:
        return None
    lo, hi = int(x.min()), int(x.max())
    n = module.num_embeddings
    if lo >= 0 and hi < n:
        return None
    bad = hi if hi >= n else lo
    return Diagnosis(
        f"Embedding index {bad} out of range: num_embeddings = {n} allows ids 0..{n - 1}; "
        f"the input's ids span {lo}..{hi}",
        expected=f"0 ≤ id < {n}", got=bad,
        hint=(f"set num_embeddings={hi + 1} (or larger), or remap the ids" if bad >= n
              else "negative ids are never valid: remap them (padding ids must be ≥ 0)"),
        rule="Embedding: ids (*) integer in [0, num_embeddings) → (*, embedding_dim)",
    )


def _group_norm(module: nn.GroupNorm, args, kwargs, exc) -> Optional[Diagnosis]:
    x = _arg(module, args, kwargs, "input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[1] == module.num_channels:
        return None
    return Diagnosis(
        f"GroupNorm expects C = num_channels = {module.num_channels} (dim 1), got {x.shape[1]}",
        expected=module.num_channels, got=x.shape[1], hint=f"set num_channels={x.shape[1]}",
        rule="GroupNorm: input (N, C = num_channels, *)",
    )


_RULES: List[tuple] = [
    (nn.Linear, _linear),
    (nn.modules.conv._ConvNd, _conv),
    (nn.RNNBase, _rnn),
    (nn.MultiheadAttention, _mha),
    (nn.LayerNorm, _layer_norm),
    (nn.modules.batchnorm._BatchNorm, _batch_norm),
    (nn.GroupNorm, _group_norm),
    (nn.Embedding, _embedding),
]


def diagnose(module: nn.Module, args: tuple, kwargs: dict, exc: BaseException) -> Optional[Diagnosis]:
    """Explain why ``module(*args, **kwargs)`` raised ``exc``, or ``None`` when no rule applies."""
    rules: List[Callable] = [_device_rule, _dtype_rule]
    rules += [rule for cls, rule in _RULES if isinstance(module, cls)]
    rules.append(_shape_layer)
    for rule in rules:
        try:
            found = rule(module, args, kwargs, exc)
        except Exception:  # a rule that cannot read these inputs has nothing to say
            found = None
        if found is not None:
            return found
    return None
