"""``F.pad`` with ``mode='reflect' | 'replicate' | 'circular'``: the shape it returns and where it raises.

Conv modules with ``padding_mode != 'zeros'`` call ``F.pad(x, pads, mode)`` before a convolution
with padding 0 (shape_rules.md §1.6), so every check below runs *before* the convolution's own
checks, input rank included. ``pads`` is in F.pad's order: ``(left_W, right_W, left_H, right_H,
…)`` — last dim first.

Rules (torch 2.13, CPU), in the order torch checks them:

1. ``len(pads) ≤ 2·input.dim()`` →
   ``RuntimeError: Padding length should be less than or equal to two times the input dimension …``
2. Only ``len(pads) = 2m`` with ``input.dim() ∈ {m+1, m+2}`` and ``m ∈ {1, 2, 3}`` is implemented →
   ``NotImplementedError: Padding size P is not supported for DD input tensor.``
3. reflect / replicate: every dim except a batch dim must be non-empty
   (``Expected 3D or 4D (batch mode) tensor with possibly 0 batch size …``).
4. reflect: per dim, **last dim first**, ``pad_left < L`` and ``pad_right < L``
   (``Argument #4/#6/#8: Padding size should be less than the corresponding input dimension …``).
5. reflect / replicate: error only if **every** padded output size is < 1 (``input (…) is too
   small``); a negative size next to a positive one fails when the tensor is allocated
   (``Trying to create tensor with negative dimension``). Since torch 2.14 replicate padding of
   2 or 3 dims fails if **any** size is < 1 (``Calculated output H: … must be >= 1 in every
   dimension (input H: …)``; change ``replicate-pad-every-dim`` in :mod:`torch_version`).
6. circular: per dim, **first padded dim first**: ``pad ≤ L`` on both sides (``Padding value causes
   wrapping around more than once.``), then ``L + pl + pr ≥ 0`` (0 is allowed).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from layerlab.errors import TorchWouldRaise
from layerlab.shapes.torch_version import TorchRules, torch_rules


def shape_str(shape: Sequence) -> str:
    """ATen's ``IntArrayRef`` printing: ``[1, 3, 8, 8]`` (how torch's messages write sizes; the
    messages of every shape module use this one)."""
    return "[" + ", ".join(str(x) for x in shape) + "]"


def _fail(exc: str, torch_message: str, message: str, **kw) -> TorchWouldRaise:
    return TorchWouldRaise(message, torch_exception=exc, torch_message=torch_message, rule="§1.6", **kw)


def negative_dimension(shape: Sequence[int]) -> str:
    """The message of ``torch.empty(shape)`` with a negative size (the first one is named)."""
    first = next(x for x in shape if x < 0)
    return f"Trying to create tensor with negative dimension {first}: {shape_str(shape)}"


def pad_nonconstant(shape: Sequence[int], pads: Sequence[int], mode: str,
                    names: Optional[Sequence[str]] = None, rules: Optional[TorchRules] = None) -> Tuple[int, ...]:
    """The shape of ``F.pad(torch.empty(shape), pads, mode)``; raises like torch.

    ``mode`` is ``'reflect'``, ``'replicate'`` or ``'circular'``; ``names`` name the padded dims
    (``H``, ``W``) in the errors' ``where``; ``rules``: the torch version to predict (default: the
    installed one).
    """
    rules = rules or torch_rules()
    shape = tuple(shape)
    D, P = len(shape), len(pads)
    _even(P)
    _at_most_two_per_dim(D, P, f"padding_mode={mode!r} pads the input with F.pad first, and a {D}-D input cannot "
                         f"take {P // 2} padded dims", where="input", got=list(shape))
    m = P // 2
    if m not in (1, 2, 3) or D not in (m + 1, m + 2):
        raise _fail(
            "NotImplementedError",
            f"Padding size {P} is not supported for {D}D input tensor.",
            f"padding_mode={mode!r} runs F.pad, which pads {m} dim(s) only of a {m + 1}-D or {m + 2}-D "
            f"tensor; this input is {D}-D",
            where="input", expected=f"{m + 1}-D or {m + 2}-D input", got=list(shape),
            suggestions=[f"an input of rank {m + 1} (unbatched) or {m + 2} (batched)"],
        )
    lead = D - m  # non-padded leading dims (1: unbatched, 2: batched)
    # pads for padded dim i (0 = first padded dim) sit at 2·(m−1−i) and 2·(m−1−i)+1
    pl = [pads[2 * (m - 1 - i)] for i in range(m)]
    pr = [pads[2 * (m - 1 - i) + 1] for i in range(m)]
    sizes = [shape[lead + i] for i in range(m)]
    outs = [sizes[i] + pl[i] + pr[i] for i in range(m)]
    new_shape = shape[:lead] + tuple(outs)
    where = list(names) if names is not None and len(names) == m else [f"dim {lead + i}" for i in range(m)]

    if mode == "circular":
        for i in range(m):
            if pl[i] > sizes[i] or pr[i] > sizes[i]:
                raise _fail(
                    "RuntimeError", "Padding value causes wrapping around more than once.",
                    f"circular padding ({pl[i]}, {pr[i]}) is larger than the input size {sizes[i]} it wraps around",
                    where=where[i], expected=f"padding ≤ {sizes[i]}", got=(pl[i], pr[i]),
                    suggestions=[f"padding ≤ {sizes[i]}", "padding_mode='replicate'"],
                )
            if outs[i] < 0:
                raise _fail(
                    "RuntimeError", "Negative padding value is resulting in an empty dimension",
                    f"padding ({pl[i]}, {pr[i]}) removes more than the {sizes[i]} pixels there are",
                    where=where[i],
                )
        return new_shape

    # reflect / replicate: only a batch dim may be empty
    checked = shape[1:] if D == m + 2 else shape
    if any(x == 0 for x in checked):
        raise _fail(
            "RuntimeError",
            f"Expected {m + 1}D or {m + 2}D (batch mode) tensor with possibly 0 batch size and other "
            f"non-zero dimensions for input, but got: {shape_str(shape)}",
            f"{mode} padding needs every dim except the batch to be non-empty",
            where="input", got=list(shape),
        )
    if mode == "reflect":
        for i in reversed(range(m)):  # the last dim is checked first
            if not (pl[i] < sizes[i] and pr[i] < sizes[i]):
                arg = 4 + 2 * (m - 1 - i)
                raise _fail(
                    "RuntimeError",
                    f"Argument #{arg}: Padding size should be less than the corresponding input dimension, "
                    f"but got: padding ({pl[i]}, {pr[i]}) at dimension {lead + i} of input {shape_str(shape)}",
                    f"reflect padding must be smaller than the input size: padding ({pl[i]}, {pr[i]}) on a "
                    f"dim of size {sizes[i]} (a reflection cannot repeat the edge pixel)",
                    where=where[i], expected=f"padding ≤ {sizes[i] - 1}", got=(pl[i], pr[i]),
                    suggestions=[f"padding ≤ {sizes[i] - 1}", "padding_mode='replicate'"],
                )
    if mode == "replicate" and m > 1 and rules.has("replicate-pad-every-dim") and any(o < 1 for o in outs):
        raise _fail(
            "RuntimeError", _every_dim_message(sizes, outs),
            "padding must leave at least one pixel in every padded dim",
            where=",".join(w for w, o in zip(where, outs) if o < 1), got=outs,
            hint=f"torch {rules.version}: replicate padding rejects any padded size < 1 (before 2.14 only when "
                 "every size was < 1)",
        )
    if all(o < 1 for o in outs):
        if m == 1:
            inp, out = f"W: {sizes[0]}", f"W: {outs[0]}"
        elif m == 2:
            space = " " if mode == "replicate" else ""  # sic: replication_pad2d prints "W: 4 )"
            inp, out = f"H: {sizes[0]}, W: {sizes[1]}{space}", f"H: {outs[0]} W: {outs[1]}"
        else:
            inp = f"D: {sizes[0]} H: {sizes[1]}, W: {sizes[2]}"
            out = f"D: {outs[0]} H: {outs[1]} W: {outs[2]}"
        raise _fail(
            "RuntimeError", f"input ({inp}) is too small. Calculated output {out}",
            "negative padding leaves no pixel in any padded dim",
            where=",".join(where), got=outs,
        )
    if any(o < 0 for o in outs):
        # reflection_pad2d *resizes* its output: the size product overflows, unless an empty batch
        # makes it 0 first, and then the negative size goes through unchecked (the conv's kernel
        # check reports it). The other kernels allocate their output, which names the size.
        if mode == "reflect" and m == 2:
            if D == m + 2 and shape[0] == 0:
                return new_shape
            text = "numel: integer multiplication overflow"
        else:
            text = negative_dimension(new_shape)
        raise _fail(
            "RuntimeError", text,
            "negative padding makes a dim negative", where="input", got=list(new_shape),
        )
    return new_shape


def _at_most_two_per_dim(D: int, P: int, because: str, **fields) -> None:
    """torch's first check in F.pad: at most two padding values per input dim."""
    if P > 2 * D:
        raise _fail(
            "RuntimeError",
            f"Padding length should be less than or equal to two times the input dimension but got "
            f"padding length {P} and input of dimension {D}",
            because, **fields)


def _even(P: int) -> None:
    if P % 2:
        raise _fail("RuntimeError", "Padding length must be divisible by 2",
                    f"padding has {P} values: F.pad takes (left, right) pairs, last dim first",
                    where="padding", got=P, suggestions=[f"padding with {P - 1} or {P + 1} values"])


def pad_constant(shape: Sequence[int], pads: Sequence[int], names: Optional[Sequence[str]] = None) -> Tuple[int, ...]:
    """The shape of ``F.pad(torch.empty(shape), pads, 'constant')`` (``nn.ConstantPad*``, ``nn.ZeroPad*``).

    Any rank with ``len(pads) ≤ 2·rank``; the last ``len(pads)/2`` dims are padded. Negative
    pads crop: torch first ``narrow`` s every negative side (left, then right, per dim), so it
    fails when ``L + min(pl, 0) + min(pr, 0) < 0`` — even where positive padding on the other
    side would give a size ≥ 0. A size of 0 is fine; empty inputs are fine.
    """
    shape = tuple(shape)
    D, P = len(shape), len(pads)
    _even(P)
    _at_most_two_per_dim(D, P, f"{P} padding values pad {P // 2} dims, but the input has {D}", where="padding",
                         got=list(pads), suggestions=[f"at most {2 * D} padding values"])
    m = P // 2
    lead = D - m
    out = list(shape)
    for i in range(m):
        pl, pr = pads[2 * (m - 1 - i)], pads[2 * (m - 1 - i) + 1]
        L = shape[lead + i]
        if L + min(pl, 0) + min(pr, 0) < 0:
            where = names[i] if names is not None and len(names) == m else f"dim {lead + i}"
            raise _fail("RuntimeError", "narrow(): length must be non-negative.",
                        f"negative padding ({pl}, {pr}) crops more than the {L} pixels there are",
                        where=where, expected=f"−(negative padding) ≤ {L}", got=(pl, pr))
        out[lead + i] = L + pl + pr
    return tuple(out)


def _every_dim_message(sizes: Sequence[int], outs: Sequence[int]) -> str:
    """torch ≥ 2.14's replication_pad2d/3d wording (sic: commas in the input part only)."""
    labels = "DHW"[3 - len(sizes):]
    out = " ".join(f"{n}: {o}" for n, o in zip(labels, outs))
    inp = ", ".join(f"{n}: {v}" for n, v in zip(labels, sizes))
    return f"Calculated output {out} must be >= 1 in every dimension (input {inp})"


def source_index(x: int, L: int, mode: str) -> int:
    """The real pixel that padded position ``x`` (real coordinates, may be < 0 or ≥ L) copies.

    ``-1`` for zero padding outside the input. Used to find pixels that no window reads.
    """
    if 0 <= x < L:
        return x
    if mode == "replicate":
        return 0 if x < 0 else L - 1
    if mode == "circular":
        return x % L
    if mode == "reflect":
        period = 2 * (L - 1)
        if period == 0:
            return 0
        x = x % period
        return x if x < L else period - x
    return -1
