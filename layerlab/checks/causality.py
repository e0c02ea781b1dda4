"""Check 7: causality, for layers that claim it.

A layer claims causality with a ``causal`` tag, an ``is_causal=True`` (or ``tgt_is_causal=True``)
input, a causal mask among its inputs, or a ``causal``/``is_causal`` attribute set to ``True`` on it
or a submodule (Hugging Face's GPT-2 attention has ``is_causal = True``). Such a library attribute
alone only tells the attention kernel to mask, so a leak there is a warning; but when it sits inside
a ``transformers.PreTrainedModel`` under test (Phi3, GPT-2, Llama: the model builds its causal mask
itself; the decoder of an encoder-decoder, for ``decoder_input_ids``), the model is built causal and
a leak is a FAIL, whatever mask the caller passed. A BERT encoder sets no such flag and is not
judged. A causal mask is any triangle of :mod:`layerlab.checks.mask_forms` that looks like an
attempt at one — exact, or off by some diagonals (``triu(diagonal=2)`` sees the next position;
``diagonal=0`` masks the token itself), in bool, additive ``−inf`` or float 0/1 form — so a wrong
mask is checked, not skipped.

The sequence under the claim: a mask named ``<input>_mask`` governs ``<input>`` only (``tgt_mask``
→ ``tgt`` in ``nn.Transformer``; the source is read whole by the decoder's cross-attention, so it
is not perturbed); otherwise every sequence input of length T. Sequence inputs are floating
tensors and integer token ids (changed to other valid ids, see :mod:`layerlab.checks.token_ids`).

The test, eval mode, float64 (float32 where a kernel refuses float64,
:mod:`layerlab.checks.exact_dtype`): the output must be finite on finite inputs (a NaN is reported
with its positions, never compared away); then for ``t = 0, 1, …, T−2`` the sequence inputs are
changed at all positions after ``t`` and the main output at positions ``≤ t`` must not move.
Positions before ``t`` were already tested with a larger change, so the first ``t`` that moves is
the first leaking position; the input position it sees is then found by changing one position at a
time.
The hint names the cause the evidence points to: the mask passed (read under each bool convention,
the one that explains what was seen wins), or the leak's pattern when no mask is passed.

Legend: T sequence length · t output position · s input position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks import mask_forms as mf
from layerlab.checks.case import (
    Arg, Case, call, cast_args, float_leaves, generator, grad_inputs, is_mask_name, map_args, module_copy, randn_like,
    time_dim,
)
from layerlab.checks.exact_dtype import exact_dtype
from layerlab.checks.report import CheckResult, Status
from layerlab.checks.token_ids import change_ids, token_inputs, vocab_sizes


@dataclass
class Claim:
    """Why the layer is expected to be causal, and the mask that says so (if one was passed)."""

    reason: str
    mask_name: Optional[str] = None
    mask: Optional[mf.Triangle] = None
    governs: Optional[str] = None  # the one input the mask or flag is about (``tgt``); None: all
    #: only a library class's ``is_causal`` attribute claims it: a hint to the attention kernel, not a promise
    #: (Hugging Face's eager attention ignores it and relies on the mask the model builds)
    from_attribute: bool = False
    #: a transformers model under test that builds its own causal mask (:func:`built_causal`)
    built: bool = False


def causal_claim(case: Case) -> Optional[Claim]:
    """The layer's causal claim, or ``None``. A triangular mask passed along is kept for the hint
    even when a tag or flag is the reason."""
    names = {a.name for a in case.args}
    mask_claim = None
    for a in case.args:
        # a (B, S) padding mask can be a triangle by chance (lengths 1, 2, …, B): it claims nothing
        tri = mf.triangle(a.value) if is_mask_name(a.name) and "padding" not in a.name.lower() else None
        if tri is not None and tri.claims_causal:
            prefix = a.name[: -len("_mask")] if a.name.endswith("_mask") else ""
            what = "a causal mask" if mf.is_exactly_causal(tri) else f"a near-causal mask ({tri.code()})"
            mask_claim = Claim(f"{what} is passed as {a.name!r}", a.name, tri, prefix if prefix in names else None)
            break
    flag = next((a for a in case.args if a.name.endswith("is_causal") and a.value is True), None)
    reason, kernel_hint = None, False
    if "causal" in case.tags:
        reason = "tagged causal"
    elif flag is not None:
        reason = f"{flag.name}=True"
    elif mask_claim is not None:
        return mask_claim
    else:
        owner = ""
        for name, m in case.module.named_modules():
            for attr in ("causal", "is_causal"):
                if reason is None and getattr(m, attr, None) is True:
                    reason = f"`{name or type(m).__name__}.{attr}` is True"
                    kernel_hint = attr == "is_causal" and _library_class(type(m))
                    owner = name
        if kernel_hint:
            built = built_causal(case.module, owner, names)
            if built is not None:
                reason, governs = built
                claim = mask_claim or Claim(reason)
                claim.reason, claim.governs, claim.built = reason, governs, True
                return claim
    if reason is None:
        return None
    claim = mask_claim or Claim(reason)
    claim.from_attribute = "causal" not in case.tags and flag is None and mask_claim is None and kernel_hint
    claim.reason = reason
    if flag is not None and flag.name != "is_causal" and flag.name[: -len("_is_causal")] in names:
        claim.governs = flag.name[: -len("_is_causal")]
    return claim


def built_causal(module: nn.Module, owner: str, names: Set[str]) -> Optional[Tuple[str, Optional[str]]]:
    """``(reason, governed input)`` when the causal attention at ``owner`` belongs to a Hugging Face model
    under test (a ``transformers.PreTrainedModel``, by class): such a model builds its causal mask
    itself, from its config, so its output must be causal whatever mask the caller passes; ``None``
    otherwise (an attention class alone only tells its kernel, see :class:`Claim`). In an
    encoder-decoder model (``config.is_encoder_decoder``) only the decoder's ids are under the claim;
    without ``decoder_input_ids`` there is no claim about the output."""
    import sys

    base = getattr(sys.modules.get("transformers"), "PreTrainedModel", None)  # loaded if the model is one
    if base is None:
        return None
    model = next(((n, m) for n, m in module.named_modules() if isinstance(m, base)
                  and (not n or owner == n or owner.startswith(n + "."))), None)
    if model is None:
        return None
    path, found = model
    config = getattr(found, "config", None)
    what = f"`{type(found).__name__}`" + (f" (at `{path}`)" if path else "")
    if getattr(config, "is_encoder_decoder", False):
        if "decoder_input_ids" not in names:
            return None
        return (f"{what} is an encoder-decoder transformers model whose decoder self-attention is causal "
                f"(`{owner}.is_causal`): it builds the decoder's causal mask itself", "decoder_input_ids")
    return (f"{what} is a transformers model built causal (`{owner}.is_causal` is True): it builds its causal "
            "mask itself", None)


def _library_class(cls: type) -> bool:
    """Is ``cls`` an installed library's (Hugging Face's attention), not the user's own code? A library's
    ``is_causal`` tells its attention kernel what to do; a user's own flag is their claim."""
    import inspect
    import sysconfig

    try:
        path = inspect.getfile(cls)
    except (TypeError, OSError):
        return False
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return any(path.startswith(root) for root in roots) or "site-packages" in path or "dist-packages" in path


def causality(case: Case, opts: Any = None) -> CheckResult:
    """Changing inputs after position t leaves the output at positions ≤ t unchanged."""
    claim = causal_claim(case)
    if claim is None:
        return CheckResult("causality", Status.SKIP,
                           "the layer does not claim causality (no causal tag, is_causal=True, causal mask or "
                           "causal attribute)")
    exact = exact_dtype(case)  # float64, or float32 where a kernel refuses float64
    details: Dict[str, Any] = {"claim": claim.reason, "mode": "eval", "dtype": str(exact.dtype).replace("torch.", "")}
    if exact.fallback:
        details["precision"] = exact.to_dict()
    names = {a.name for a in case.args}
    if claim.governs == "src" and "tgt" in names:
        return CheckResult("causality", Status.SKIP,
                           f"{claim.reason}: it makes the encoder causal, but the output reads the whole source "
                           "through cross-attention; pass tgt_mask to check the decoder's causality", details=details)
    module = module_copy(case.module, exact.dtype, train=False)
    args = cast_args(case.args, exact.dtype)
    T, seq = _sequences(module, args, claim)
    if not seq:
        return CheckResult("causality", Status.SKIP, f"{claim.reason}, but no sequence input with length ≥ 2 was found"
                           + (f" (looked for {claim.governs!r})" if claim.governs else ""), details=details)
    details.update(length=T, sequence_inputs={s.name: s.dim for s in seq})
    if any(s.vocab for s in seq):
        details["token_vocab"] = {s.name: s.vocab_source for s in seq if s.vocab}
    with torch.no_grad():
        base = float_leaves(call(module, args))
    if not base:
        return CheckResult("causality", Status.SKIP, "no floating output", details=details)
    path, y0 = base[0]
    otd = next((d for d in (seq[0].dim,) + tuple(range(y0.dim())) if d < y0.dim() and y0.shape[d] == T), None)
    if otd is None:
        return CheckResult("causality", Status.SKIP, f"{path} has no dimension of length T = {T}", details=details)
    details.update(output=path, output_time_dim=otd)
    nonfinite = _nonfinite_positions(y0, otd)
    if nonfinite:
        return _nonfinite_result(claim, args, path, nonfinite, details)
    gen = generator(case.seed, 7)
    precision = f"; {exact.note()}" if exact.fallback else ""
    tol = exact.absolute + exact.relative * (float(y0.abs().max()) or 1.0)

    def moved(positions: Sequence[int], upto: int, only_at: bool = False) -> float:
        y = _run(module, args, seq, positions, gen)
        a, b = (y.narrow(otd, upto, 1), y0.narrow(otd, upto, 1)) if only_at else \
            (y.narrow(otd, 0, upto + 1), y0.narrow(otd, 0, upto + 1))
        return float((a - b).abs().nan_to_num(nan=float("inf")).max())  # a NaN that appears is a change

    for t in range(T - 1):
        change = moved(range(t + 1, T), t)
        if change > tol:
            source = next((s for s in range(t + 1, T) if moved([s], t, only_at=True) > tol), None)
            beyond = t + 2 < T and moved(range(t + 2, T), t, only_at=True) > tol
            details.update(first_leaking_position=t, leaks_from=source, sees_beyond_next=beyond, max_change=change)
            seen = f"input position {source}" if source is not None else "later inputs"
            summary = (f"the output at position {t} changes when only inputs after {t} change: it sees {seen} "
                       f"(first leaking position t = {t}, max change {change:.3g})")
            if claim.from_attribute:  # an attribute is no promise that the module masks by itself: say what is seen
                masks = [a.name for a in case.args if is_mask_name(a.name) and isinstance(a.value, Tensor)]
                how = f"with {', '.join(repr(m) for m in masks)} passed" if masks else "called without a mask"
                return CheckResult(
                    "causality", Status.WARN, f"{claim.reason}, but {how} {summary}",
                    where=f"{path} position {t}", details=details,
                    hint="an is_causal attribute often only tells the attention kernel (SDPA) to mask; eager "
                         "attention (Hugging Face's included) relies on the causal mask its model builds: pass a "
                         "causal mask, or tag the layer causal if it must be causal on its own")
            return CheckResult(
                "causality", Status.FAIL, summary + precision,
                where=f"{path} position {t}", hint=_leak_hint(claim, module, t, source, beyond, case), details=details)
    return CheckResult("causality", Status.PASS,
                       f"{claim.reason}: the output at every position t < {T} ignores inputs after t" + precision,
                       details=details)


# -- the sequences and how they are changed -------------------------------------------------------------

@dataclass
class _Seq:
    name: str
    tensor: Tensor
    dim: int
    vocab: int = 0  # > 0: integer token ids in [0, vocab)
    vocab_source: str = ""


def _sequences(module: nn.Module, args: Sequence[Arg], claim: Claim) -> Tuple[int, List[_Seq]]:
    """``(T, sequence inputs of length T ≥ 2)``: the governed input only, when the claim names one."""
    found = [(n, t, False) for n, t in grad_inputs(args)] + [(n, t, True) for n, t in token_inputs(args)]
    if claim.governs:
        found = [f for f in found if f[0].split("[", 1)[0] == claim.governs]
    vocab = vocab_sizes(module, args, [(n, t) for n, t, ids in found if ids]) if any(f[2] for f in found) else {}
    T = claim.mask.size if claim.mask is not None and claim.mask_name else None
    out: List[_Seq] = []
    for name, t, ids in found:
        td = _time_dim(module, t, T)
        if td is None:
            continue
        if T is None:
            T = t.shape[td]
        V, source = vocab.get(id(t), (0, ""))
        if t.shape[td] == T and (not ids or V >= 2):
            out.append(_Seq(name, t, td, V if ids else 0, source))
    return (T or 0), (out if T and T >= 2 else [])


def _time_dim(module: nn.Module, t: Tensor, T: Optional[int]) -> Optional[int]:
    """The time dim: :func:`time_dim`'s guess, except that SDPA's ``(B, H, T, E)`` layout has it at −2,
    and a known T (from the mask) picks the dim of that length when the guess has another."""
    td = t.dim() - 2 if t.dim() == 4 and t.is_floating_point() else time_dim(module, t)
    if td is not None and td < t.dim() and (T is None or t.shape[td] == T):
        return td
    if T is None:
        return None
    return next((d for d in (t.dim() - 2, *range(t.dim())) if 0 <= d < t.dim() and t.shape[d] == T), None)


def _run(module: nn.Module, args: Sequence[Arg], seq: Sequence[_Seq], positions, gen: torch.Generator) -> Tensor:
    targets = {id(s.tensor): s for s in seq}
    pos = list(positions)

    def change(t: Tensor) -> Tensor:
        s = targets.get(id(t))
        if s is None:
            return t
        if s.vocab:
            return change_ids(t, s.dim, pos, s.vocab, gen)
        idx = torch.tensor(pos, dtype=torch.long, device=t.device)
        return t.index_copy(s.dim, idx, randn_like(t.index_select(s.dim, idx), gen))

    with torch.no_grad():
        return float_leaves(call(module, map_args(args, change)))[0][1]


# -- NaN -------------------------------------------------------------------------------------------------

def _nonfinite_positions(y: Tensor, td: int) -> List[int]:
    bad = ~torch.isfinite(y)
    if not bool(bad.any()):
        return []
    return [int(i) for i in torch.nonzero(bad.movedim(td, 0).reshape(y.shape[td], -1).any(dim=1)).flatten()]


def _nonfinite_result(claim: Claim, args: Sequence[Arg], path: str, positions: List[int],
                      details: Dict[str, Any]) -> CheckResult:
    details["nonfinite_positions"] = positions
    shown = ", ".join(map(str, positions[:12])) + (", …" if len(positions) > 12 else "")
    inputs_finite = all(bool(torch.isfinite(t).all()) for _, t in grad_inputs(args))
    if not inputs_finite:
        return CheckResult("causality", Status.SKIP,
                           f"{path} holds NaN/inf at positions {shown}, and so do the inputs: causality cannot "
                           "be compared", where=path, details=details)
    hint = None
    if claim.mask is not None and claim.mask.encoding != "float01":
        for reading, blocked in claim.mask.readings():
            if mf.reading_explains(blocked, None, positions):
                hint = _mask_hint(claim, reading, blocked)
                break
    return CheckResult(
        "causality", Status.FAIL,
        f"{path} holds NaN/inf at positions {shown} on finite inputs: nothing can be compared there",
        where=f"{path} position {positions[0]}",
        hint=hint or "a query row with every key masked (softmax of all −inf), or a log/division of 0 — "
                     "torch.autograd.detect_anomaly() or layerlab probe finds the op",
        details=details)


# -- hints: the cause the evidence points to -----------------------------------------------------------

def _mask_hint(claim: Claim, reading: str, blocked: Tensor) -> str:
    tri = claim.mask
    problem = mf.defect(tri, blocked)
    return (f"{claim.mask_name} is {tri.code()}; read as {reading}, {problem}. Use {mf.fix_for(tri, reading)}")


def _leak_hint(claim: Claim, module: nn.Module, t: int, source: Optional[int], beyond: bool, case: Case) -> str:
    tri = claim.mask
    passed = [a.name for a in case.args if is_mask_name(a.name) and isinstance(a.value, Tensor) and a.value.dim() >= 3]
    if claim.built and tri is None and passed and source is not None:
        shape = tuple(next(a.value for a in case.args if a.name == passed[0]).shape)
        return (f"the {passed[0]!r} passed ({shape}) lets position {t} see position {source}: a (B, 1, T, T) "
                "mask replaces the model's own causal mask, "
                "so it must block every key after the query (built with torch.tril(ones(T, T)) for allowed keys, or "
                "pass the 2-D (B, T) padding mask and let the model add the causal part)")
    if tri is not None and tri.encoding == "float01" and source is not None:
        if mf.reading_explains(tri.readings()[0][1], (t, source), []):  # what a mask that blocks nothing gives
            return (f"{claim.mask_name} is a float 0/1 mask ({tri.code()}): torch adds float masks to the scores, "
                    f"so it masks nothing. {mf.float01_fix(tri.one_means, None)}")
    elif tri is not None and source is not None:
        explaining = [(r, b) for r, b in tri.readings() if mf.reading_explains(b, (t, source), [])]
        if explaining:
            reading, blocked = explaining[0]
            hint = _mask_hint(claim, reading, blocked)
            if mf.is_exactly_causal(tri):
                hint += (f" — {claim.mask_name} itself is a correct causal mask in the other convention: the layer "
                         "reads it inverted, or ignores it (the masks check probes which)")
            return hint
        return (f"{claim.mask_name} is {tri.code()}, which does not explain position {t} seeing {source}: the layer "
                "ignores the mask, or another part of it sees the future")
    if source == t + 1 and not beyond:
        first = ("a convolution padded on both sides (pad only the left, by (kernel_size − 1)·dilation)"
                 if any(isinstance(m, nn.Conv1d) for m in module.modules()) else
                 "an off-by-one causal mask (torch.triu(ones(T, T), diagonal=2) where diagonal=1 is meant)")
        second = ("an off-by-one causal mask (diagonal=2 instead of 1)" if first.startswith("a convolution")
                  else "a convolution padded on both sides")
        return f"position {t} sees exactly one step ahead: {first}, or {second}"
    return ("something sees further ahead than one step: a missing or ignored mask, a bidirectional part, an "
            "off-by-one mask compounded over layers, or a lookahead in a convolution")
