"""What every export path shares: the eval-mode layer, its example inputs, eager's outputs, the
input variants, and the output comparison.

Every path works on its own deep copy of the layer (tracing, scripting and exporting may attach
state), in eval mode (exported programs are for inference; dropout would make outputs differ),
under ``torch.no_grad()``. Eager's outputs on each variant are computed once and shared.

Every run whose outputs are compared — eager's, and each program's on the example and on every
variant — starts from the same RNG state (:meth:`Context.seeded`: the CPU generator and those of
the devices in use seeded with the check's seed, inside :func:`torch.random.fork_rng`). A forward
that draws with torch ops (``torch.randn_like`` in a VAE's reparameterisation, dropout left on)
is repeatable that way, and a traced, scripted, compiled or exported program draws the very same
numbers, so it is compared fairly; the user's own RNG stream is left as it was. Randomness that is
not torch's (``random.random()``) stays unrepeatable and :mod:`layerlab.deploy.repeatable` says so.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from layerlab.target.bind import Arg, flatten, map_args, positional_names
from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.checks.compare import compare
from layerlab.deploy.variants import Variant

#: (rtol, atol) per dtype: exported programs may reorder float ops, so looser than assert_close's
#: float32 default (1.3e-6); the values used are printed with every result
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-3),
}

_NOT_RUN = object()


@dataclass
class Context:
    """The layer under test and everything the paths compare against."""

    module: nn.Module
    args: List[Arg]
    variants: List[Variant]
    rtol: float
    atol: float
    compile_backend: str = DEFAULT_COMPILE_BACKEND
    batch_dims: Dict[str, Optional[int]] = field(default_factory=dict)
    seed: int = 0
    eager_out: Any = None
    _variant_out: Dict[str, Any] = field(default_factory=dict)

    def fresh(self) -> nn.Module:
        """A deep copy of the layer in eval mode (:func:`~layerlab.target.copying.copy_model`: the old
        ``weight_norm`` hooks copy too)."""
        from layerlab.target.copying import copy_model

        return copy_model(self.module).eval()

    def seeded(self) -> contextlib.AbstractContextManager:
        """Run the body from the RNG state every compared run starts from (the module docstring);
        the caller's RNG state comes back afterwards."""
        from layerlab.target.seeding import seeded

        return seeded(self.seed, self.module, [t for a in self.args for _, t in flatten(a.value)])

    def split(self, args: Optional[Sequence[Arg]] = None) -> Tuple[list, dict]:
        """``(positional, keyword)`` values of ``args`` (default: the example), as fresh copies: a
        forward that writes into its input (``x.add_(1)``) must not shift the input of every later
        run, or each path would be compared with eager on different numbers."""
        args = fresh_args(self.args if args is None else args)
        return [a.value for a in args if not a.keyword], {a.name: a.value for a in args if a.keyword}

    def as_kwargs(self, args: Optional[Sequence[Arg]] = None) -> Dict[str, Any]:
        """Every argument by name (positional ones by ``forward``'s parameter names)."""
        args = self.args if args is None else args
        pos = [a for a in args if not a.keyword]
        names = positional_names(self.module, len(pos))
        out = {n: a.value for n, a in zip(names, pos)}
        out.update({a.name: a.value for a in args if a.keyword})
        return out

    def variant_eager(self, variant: Variant) -> Any:
        """Eager's outputs on ``variant``, computed once; ``None`` if eager itself rejects it."""
        got = self._variant_out.get(variant.name, _NOT_RUN)
        if got is _NOT_RUN:
            try:
                with torch.no_grad(), self.seeded():
                    pos, kw = self.split(variant.args)
                    got = self.module_eval(*pos, **kw)
            except Exception:
                got = None
            self._variant_out[variant.name] = got
        return got

    def eager_module(self) -> nn.Module:
        """The copy eager runs on, made on first use (raises :class:`~layerlab.errors.UsageError` for a
        model :func:`~layerlab.target.copying.copy_model` cannot copy)."""
        if not hasattr(self, "_eager"):
            self._eager = self.fresh()
            self._other_eager: Dict[int, Any] = {}
        return self._eager

    def module_eval(self, *pos: Any, **kw: Any) -> Any:
        """Eager's outputs. A torch transformer layer in eval mode has two eager behaviours: with no
        grad it takes its inference fast path (nested tensors: padded positions come out 0), with
        autograd on the regular path, which is what compile and export trace. Both are eager's
        truth: :meth:`compare` accepts the second too, computed only when the first disagrees, so a
        path is not failed for the padded positions torch itself leaves undefined."""
        from layerlab.checks.case import has_inference_fast_path
        from layerlab.target.bind import map_tensors

        self.eager_module()
        fast_path = has_inference_fast_path(self._eager)
        unused = map_tensors((pos, kw), lambda t: t.clone()) if fast_path else None  # forward may write into them
        out = self._eager(*pos, **kw)
        if fast_path:
            def with_grad() -> Any:
                p2, k2 = unused
                with torch.enable_grad():
                    return map_tensors(self._eager(*p2, **k2), lambda t: t.detach())

            self._other_eager[id(out)] = (out, with_grad)
        return out

    def compare(self, actual: Any, expected: Any, label: str = "") -> Tuple[bool, List[dict], Optional[str]]:
        """Compare every output tensor, by position: ``(all equal, comparisons, first problem)``;
        where eager has two behaviours (:meth:`module_eval`), matching either one is equal."""
        ok, comps, problem = self._compare(actual, expected, label)
        kept = getattr(self, "_other_eager", {}).get(id(expected))
        if not ok and kept is not None and kept[0] is expected:
            with self.seeded():  # eager's second behaviour draws what the first drew
                other = kept[1]()
            self._other_eager[id(expected)] = (expected, lambda: other)  # computed once
            ok2, comps2, _ = self._compare(actual, other, label)
            if ok2:
                return True, comps2, None
        return ok, comps, problem

    def _compare(self, actual: Any, expected: Any, label: str = "") -> Tuple[bool, List[dict], Optional[str]]:
        exp = [t for _, t in flatten(expected)]
        names = [p for p, _ in flatten(expected)]
        act = [t for _, t in flatten(actual)]
        suffix = f" ({label})" if label else ""
        if len(act) != len(exp):
            return False, [], f"returns {len(act)} tensor(s), eager {len(exp)}{suffix}"
        comps, problem = [], None
        for name, a, e in zip(names, act, exp):
            a = a.to(e.device) if isinstance(a, Tensor) and a.device != e.device else a
            exact = not (e.is_floating_point() or e.is_complex())  # indices, ids, masks: exactly
            c = compare(a, e, name + suffix, rtol=0.0 if exact else self.rtol, atol=0.0 if exact else self.atol)
            comps.append(c.to_dict())
            if not c.ok and problem is None:
                problem = f"{name} {_short(c)}{suffix}"
        return problem is None, comps, problem


def _short(c) -> str:
    """One clause for a matrix cell; the full numbers stay in ``comparisons``."""
    if c.note and c.total == 0:
        return c.note
    return (f"differs: max abs diff {c.max_abs_diff:.3g}, {c.mismatched}/{c.total} elements beyond "
            f"atol {c.atol:g} + rtol {c.rtol:g}·|eager|")


def tolerances_for(args: Sequence[Arg], module: nn.Module) -> Tuple[float, float]:
    dtype = next((t.dtype for a in args for _, t in flatten(a.value) if t.is_floating_point()), None)
    if dtype is None:
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


def fresh_args(args: Sequence[Arg]) -> List[Arg]:
    """Copies of the tensors in ``args`` (one tensor passed twice stays one tensor)."""
    return map_args(args, lambda t: t.clone())


def changed_inputs(before: Sequence[Arg], after: Sequence[Arg]) -> List[str]:
    """The names of the inputs whose values differ between ``before`` and the copies in ``after``
    that a forward ran on: the inputs it writes into."""
    def same(b: Tensor, a: Tensor) -> bool:
        return b.shape == a.shape and torch.equal(b.nan_to_num(), a.nan_to_num())

    return [b.name for b, a in zip(before, after)
            if not all(same(tb, ta) for (_, tb), (_, ta) in zip(flatten(b.value), flatten(a.value)))]


def detached(args: Sequence[Arg]) -> List[Arg]:
    """The example inputs without autograd history (exports run under no_grad)."""
    return map_args(args, lambda t: t.detach())


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence what torch prints while exporting (graph dumps, logging, deprecation warnings)."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
