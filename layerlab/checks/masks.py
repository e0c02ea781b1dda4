"""Check 9: attention masks mean what the user thinks, and what torch means.

torch's conventions, which a custom attention layer is expected to follow:

* a **float** mask is *added* to the attention scores: ``−inf`` blocks, ``0`` keeps. A float 0/1
  mask therefore blocks nothing (it nudges the scores by 1);
* a **bool** ``attn_mask`` / ``key_padding_mask`` of ``nn.MultiheadAttention`` and the transformer
  layers: ``True`` = *blocked*. ``F.scaled_dot_product_attention`` uses the opposite: ``True`` =
  *may attend*. Mixing the two inverts the mask;
* ``key_padding_mask`` is ``(B, S)`` — batch first even when ``batch_first=False``;
* a query row with every key blocked gives NaN (softmax of all ``−inf``).

What is checked: the masks the user passes (a float 0/1 mask, a bool causal mask in the other
convention, a key_padding_mask of the wrong shape or dtype, NaN from fully masked rows), and — by
probing the layer with masks that block the last key — whether a float ``−inf`` mask blocks, which
bool convention the layer follows, whether that is the reference's, and whether the mask is used
at all.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    Arg, Case, batch_layout, call, cast_args, float_leaves, forward_params, generator, grad_inputs, is_mask_name,
    map_args, module_copy, randn_like, reference_copy, time_dim,
)
from layerlab.checks import mask_forms as mf
from layerlab.checks.exact_dtype import ExactDtype, exact_dtype
from layerlab.checks.report import CheckResult, Status

SELF_MASKS = ("attn_mask", "src_mask", "tgt_mask", "mask")
PADDING_MASKS = ("key_padding_mask", "src_key_padding_mask", "tgt_key_padding_mask")


def mask_params(module: nn.Module) -> List[str]:
    return [n for n in forward_params(module) if is_mask_name(n)]


def masks(case: Case, opts: Any = None) -> CheckResult:
    """Float/bool mask conventions, key_padding_mask shape and dtype, NaN from fully masked rows."""
    params = mask_params(case.module)
    given = [a for a in case.args if is_mask_name(a.name) and isinstance(a.value, Tensor)]
    if not params and not given:
        return CheckResult("masks", Status.SKIP, "the layer takes no mask")
    exact = exact_dtype(case)  # float64, or float32 where a kernel refuses float64
    module = module_copy(case.module, exact.dtype, train=False)
    args = cast_args(case.args, exact.dtype)
    geo = _geometry(case, module, args)
    findings: List[Tuple[Status, str, str, str]] = []  # (status, where, message, hint)
    details: Dict[str, Any] = {"mask_params": params, "given": {a.name: {"dtype": str(a.value.dtype).replace(
        "torch.", ""), "shape": list(a.value.shape)} for a in given}}
    probes = _probe(case, module, args, geo, details) if geo else {}
    semantics = probes.get("bool")
    for a in given:
        findings.extend(_inspect_given(a, geo, semantics, probes.get("blocks_float")))
    with torch.no_grad():
        try:
            out = float_leaves(call(module, args))
        except Exception as exc:
            out = []
            details["error"] = f"{type(exc).__name__}: {exc}"
    if given and out and not torch.isfinite(out[0][1]).all():
        rows = _nan_rows(out[0][1], geo)
        findings.append((Status.FAIL, given[0].name,
                         f"fully masked query rows give NaN in {out[0][0]}{f' (rows {rows})' if rows else ''}",
                         "keep at least one key per query row, or replace the NaN rows afterwards "
                         "(out.nan_to_num(0.0)); for padded queries mask their outputs instead"))
    findings.extend(probes.get("findings", []))
    findings.extend(_padding_unused(module, args, details, exact))
    if not findings:
        parts = []
        if "float_blocks" in probes:
            parts.append("a float −inf mask blocks")
        if semantics:
            parts.append(f"bool masks: {semantics}")
        if probes.get("matches_reference"):
            parts.append("the same convention as the reference")
        text = "; ".join(parts) or ("masks passed are well-formed" if given else
                                    f"no mask was passed ({', '.join(params)} left at the default): nothing to check")
        return CheckResult("masks", Status.PASS, text, details=details)
    details["findings"] = [{"status": str(s), "where": w, "message": m, "hint": h} for s, w, m, h in findings]
    status = Status.FAIL if any(f[0] == Status.FAIL for f in findings) else Status.WARN
    first = findings[0]  # the cause comes first (an inverted mask), its consequences (NaN rows) after
    return CheckResult("masks", status, "; ".join(f[2] for f in findings), where=first[1], hint=first[3],
                       details=details)


def _geometry(case: Case, module: nn.Module, args: Sequence[Arg]) -> Optional[Dict[str, Any]]:
    """Where the query and the keys are: tensors, time dims, B, L, S."""
    ins = grad_inputs(args)
    if not ins:
        return None
    qname, q = ins[0]
    named_kv = [t for n, t in ins if n.split("[")[0] in ("key", "value")]
    kv = named_kv or [q]
    k = kv[0]
    qd, kd = _seq_dim(module, q), _seq_dim(module, k)
    if qd is None or kd is None:
        return None
    B, _ = batch_layout(case, args)
    # each sequence input's length: a `memory_key_padding_mask` pads `memory`, not the query
    lengths = {n.split("[")[0]: t.shape[d] for n, t in ins for d in [_seq_dim(module, t)] if d is not None}
    return {"query": qname, "q": q, "kv": kv, "q_td": qd, "k_td": kd, "L": q.shape[qd], "S": k.shape[kd], "B": B,
            "lengths": lengths,
            "self": any(t is q for t in kv),
            # the probe reads the output rows as the query's rows: sure only for attention with named
            # key/value, or a layer with one sequence input (not an encoder-decoder)
            "simple": bool(named_kv) or len(ins) == 1}


def _seq_dim(module: nn.Module, t: Tensor) -> Optional[int]:
    """The sequence dim: scaled_dot_product_attention's ``(B, H, T, E)`` has it at −2."""
    return t.dim() - 2 if t.dim() == 4 else time_dim(module, t)


def _inspect_given(a: Arg, geo: Optional[Dict[str, Any]], semantics: Optional[str],
                   blocks_float: Optional[bool]) -> List[Tuple[Status, str, str, str]]:
    out = []
    m = a.value
    name = a.name
    if m.is_floating_point():
        out.extend(_float01(a, semantics, blocks_float))
    if "padding" in name.lower() and geo and geo["B"]:
        padded = name.lower().replace("_key_padding_mask", "").replace("_padding_mask", "")
        want = (geo["B"], geo.get("lengths", {}).get(padded, geo["S"]))
        if tuple(m.shape) != want:
            flipped = tuple(m.shape) == want[::-1]
            out.append((Status.FAIL, name, f"{name} has shape {tuple(m.shape)}, expected (B, S) = {want}"
                        + (" — it is transposed" if flipped else ""),
                        "key_padding_mask is (B, S), batch first even with batch_first=False"
                        + (": pass mask.T" if flipped else "")))
        elif m.dtype != torch.bool and not m.is_floating_point():
            out.append((Status.WARN, name, f"{name} is {str(m.dtype).replace('torch.', '')}",
                        "pass a bool mask (True = padding, blocked) or a float additive mask"))
    out.extend(_triangle_defects(a, semantics, blocks_float))
    return out


def _float01(a: Arg, semantics: Optional[str], blocks_float: Optional[bool]) -> List[Tuple[Status, str, str, str]]:
    """A float 0/1 mask is added to the scores: it blocks nothing. When its pattern says what it was
    meant to block (a causal triangle, padded keys), that is a bug, not a style question."""
    m, name = a.value, a.name
    vals = torch.unique(m)
    if not (bool(((vals == 0) | (vals == 1)).all()) and bool((vals == 1).any())):
        return []
    tri = mf.triangle(m)
    if "padding" in name.lower() or _padding_columns(m):
        meant, one_means = "padding mask", None
    elif tri is not None and tri.claims_causal:
        meant, one_means = f"causal mask ({tri.code()}, 1 = {tri.one_means})", tri.one_means
    else:
        return [(Status.WARN, name, f"{name} is a float 0/1 mask: torch adds float masks to the scores, so it "
                 "blocks nothing", mf.float01_fix(None, semantics))]
    if blocks_float:  # the probe saw this layer add float masks to the scores, as torch does
        return [(Status.FAIL, name, f"{name} is a float 0/1 {meant}: float masks are added to the scores, so it "
                 "blocks nothing (a 1 only nudges a score by 1)", mf.float01_fix(one_means, semantics))]
    # unprobed (or a layer that reads float masks its own way): say what torch would do, no verdict
    return [(Status.WARN, name, f"{name} is a float 0/1 {meant}: torch adds float masks to the scores, so in "
             "torch's convention it blocks nothing (not probed for this layer)", mf.float01_fix(one_means, semantics))]


def _padding_columns(m: Tensor) -> bool:
    """An attention mask that blocks whole keys: every column constant over the query rows, not all equal."""
    if m.dim() < 2 or m.shape[-2] < 2:
        return False
    return bool((m == m.narrow(-2, 0, 1)).all()) and not bool((m == m.flatten()[0]).all())


def _triangle_defects(a: Arg, semantics: Optional[str], blocks_float: Optional[bool]):
    """A causal-looking triangle that, read as this layer reads it, is inverted or off by one."""
    tri = mf.triangle(a.value) if "padding" not in a.name.lower() else None
    if tri is None or not tri.claims_causal or tri.encoding == "float01":
        return []
    if tri.encoding == "bool":
        if not semantics:
            return []
        reading = mf.TRUE_BLOCKS if semantics.startswith("True = blocked") else mf.TRUE_ATTENDS
        blocked = tri.marked if reading == mf.TRUE_BLOCKS else ~tri.marked
    elif blocks_float:
        reading, blocked = "−inf = blocked", tri.marked
    else:
        return []
    problem = mf.defect(tri, blocked)
    if problem is None:
        return []
    # a query row left with no key is broken whatever was meant (NaN here, or zeros in SDPA)
    status = Status.FAIL if mf.all_blocked_rows(blocked) else Status.WARN
    if problem.startswith("it is inverted"):
        return [(status, a.name, f"{a.name} ({tri.code()}) blocks the past and leaves the future open: it is a "
                 f"causal mask in the other bool convention, inverted for this layer, which reads {reading}",
                 f"pass ~mask, i.e. {mf.fix_for(tri, reading)}")]
    return [(status, a.name, f"{a.name} is {tri.code()}; read as {reading}, {problem}",
             f"use {mf.fix_for(tri, reading)}")]


def _nan_rows(y: Tensor, geo: Optional[Dict[str, Any]]) -> List[int]:
    if not geo:
        return []
    td = geo["q_td"] if geo["q_td"] < y.dim() else 0
    bad = ~torch.isfinite(y)
    dims = [d for d in range(y.dim()) if d != td]
    rows = bad.any(dim=dims[-1]) if dims else bad
    while rows.dim() > 1:
        rows = rows.any(dim=0 if td != 0 else 1)
    return [int(i) for i in torch.nonzero(rows).flatten()[:8]]


def _set_mask(args: Sequence[Arg], name: str, mask: Tensor) -> List[Arg]:
    out = [a for a in args if a.name != name]
    return out + [Arg(name, mask, True)]


def _probe(case: Case, module: nn.Module, args: Sequence[Arg], geo: Dict[str, Any], details: Dict[str, Any]):
    """Block the last key with each kind of mask and see whether the outputs ignore it."""
    exact = exact_dtype(case)
    params = forward_params(module)
    name = next((n for n in SELF_MASKS if n in params), None)
    res: Dict[str, Any] = {"findings": []}
    if name is None:
        return res
    L, S = geo["L"], geo["S"]
    if S < 2:
        return res
    gen = generator(case.seed, 9)
    base = [a for a in args if not is_mask_name(a.name) and a.name != "is_causal"]
    device = geo["q"].device
    col = torch.zeros(L, S, dtype=torch.bool, device=device)
    col[:, S - 1] = True
    float_mask = torch.zeros(L, S, dtype=geo["q"].dtype, device=device).masked_fill(col, float("-inf"))
    try:
        blocks_float = _blocks(module, base, name, float_mask, geo, gen, exact)
        blocks_true = _blocks(module, base, name, col, geo, gen, exact)
        blocks_false = _blocks(module, base, name, ~col, geo, gen, exact)
        unused = _same(module, base, name, col, exact)
    except Exception as exc:  # the layer rejects the probe mask (shape conventions of its own)
        details["probe_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return res
    semantics = ("True = blocked (nn.MultiheadAttention's convention)" if blocks_true else
                 "True = attend (scaled_dot_product_attention's convention)" if blocks_false else None)
    details["probe"] = {"mask": name, "float_minus_inf_blocks": blocks_float, "bool_semantics": semantics,
                        "mask_changes_output": not unused}
    res["bool"] = semantics
    if blocks_float and geo["simple"]:
        res["float_blocks"] = True
    res["blocks_float"] = blocks_float if geo["simple"] else None
    if not geo["simple"]:
        details["probe"]["note"] = ("several sequence inputs: which output rows the mask governs is not known, so "
                                    "the probe is only compared with the reference's")
        res["bool"] = None
    elif unused:
        res["findings"].append((Status.FAIL, name, f"{name} has no effect on the output", f"apply {name} to the "
                                "attention scores before the softmax (scores + mask, or masked_fill for bool)"))
    elif not blocks_float:
        res["findings"].append((Status.FAIL, name, f"a float {name} with −inf at a key does not block that key",
                                "float masks are added to the scores (scores + mask), not multiplied or cast to bool"))
    elif semantics is None:
        res["findings"].append((Status.WARN, name, f"a bool {name} blocks the key neither as True nor as False",
                                "use torch's convention: True = blocked (nn.MultiheadAttention)"))
    ref = case.reference
    if isinstance(ref, nn.Module) and name in forward_params(ref):
        r = reference_copy(ref, exact.dtype, False)
        try:
            ref_true = _blocks(r, base, name, col, geo, gen, exact)
            ref_false = _blocks(r, base, name, ~col, geo, gen, exact)
        except Exception:
            return res
        ref_sem = ("True = blocked (nn.MultiheadAttention's convention)" if ref_true else
                   "True = attend (scaled_dot_product_attention's convention)" if ref_false else None)
        details["probe"]["reference_bool_semantics"] = ref_sem
        if ref_sem and semantics and ref_sem != semantics:
            res["findings"].append((Status.FAIL, name, f"the bool {name} is inverted: this layer reads {semantics}, "
                                    f"the reference {ref_sem}",
                                    "invert it inside the layer (masked_fill(mask, -inf) for True = blocked)"))
        elif ref_sem == semantics:
            res["matches_reference"] = True
    return res


def _padding_unused(module: nn.Module, args: Sequence[Arg], details: Dict[str, Any], exact: ExactDtype):
    """A padding mask the layer never reads: pad one more real key (the last one of a sample with
    at least two) and see whether anything in the output moves. torch's ``key_padding_mask``
    convention (bool, True = pad) for names with "padding"; Hugging Face's ``attention_mask``
    (1 = token, 0 = pad) for that name. Float additive masks are left to the other probes."""
    found = []
    for a in args:
        m, low = a.value, a.name.lower()
        if not isinstance(m, Tensor) or m.dim() != 2:
            continue
        if "padding" in low and m.dtype == torch.bool:
            keep = ~m
        elif low == "attention_mask" and (m.dtype == torch.bool or not m.is_floating_point()):
            keep = m.bool()
        else:
            continue
        rows = [b for b in range(keep.shape[0]) if int(keep[b].sum()) >= 2]
        if not rows:
            continue
        b = rows[0]
        j = int(keep[b].nonzero()[-1])
        changed = m.clone()
        changed[b, j] = True if m.dtype == torch.bool and "padding" in low else 0
        try:
            same = _same(module, list(args), a.name, changed, exact)
        except Exception as exc:  # the layer refuses the probe: no verdict
            details.setdefault("padding_probe_error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        details.setdefault("padding_probe", {})[a.name] = {"sample": b, "position": j, "changes_output": not same}
        if same:
            found.append((Status.FAIL, a.name, f"{a.name} has no effect on the output: marking position {j} of "
                          f"sample {b} as padding changed nothing",
                          f"pass {a.name} on to the attention (masked_fill of the scores before the softmax, or "
                          "the attention call's own mask argument)"))
    return found


def _first(module: nn.Module, args: Sequence[Arg]) -> Tensor:
    with torch.no_grad():
        return float_leaves(call(module, args))[0][1]


def _blocks(module, base, name, mask, geo, gen, exact) -> bool:
    """Does ``mask`` (blocking key S−1 if it works as meant) make the outputs ignore key S−1?"""
    args = _set_mask(base, name, mask)
    y = _first(module, args)
    S = geo["S"]
    targets = {id(t) for t in geo["kv"]}

    def change(t: Tensor) -> Tensor:
        if id(t) not in targets:
            return t
        out = t.clone()
        td = geo["k_td"]
        idx = torch.tensor([S - 1], device=out.device)
        return out.index_copy(td, idx, randn_like(out.index_select(td, idx), gen))

    y2 = _first(module, map_args(args, change))
    td = geo["q_td"] if geo["q_td"] < y.dim() else 0
    rows = geo["L"] - 1 if geo["self"] else geo["L"]
    if rows < 1:
        return False
    a, b = y.narrow(td, 0, rows), y2.narrow(td, 0, rows)
    fin = torch.isfinite(a) & torch.isfinite(b)
    if not exact.fallback:
        return bool(((a - b).abs()[fin] <= 1e-9 * (1 + a.abs()[fin])).all())
    return not bool(fin.any()) or not exact.exceeds(float((a - b).abs()[fin].max()), float(a.abs()[fin].max()))


def _same(module, base, name, mask, exact: ExactDtype) -> bool:
    y0 = _first(module, base)
    y1 = _first(module, _set_mask(base, name, mask))
    if not exact.fallback:
        return bool(torch.allclose(y0, y1, rtol=0, atol=1e-12))
    return y0.shape == y1.shape and not exact.exceeds(float((y0 - y1).abs().nan_to_num(nan=float("inf")).max()),
                                                      float(y0.abs().nan_to_num(nan=0.0).max()))
