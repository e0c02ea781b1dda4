"""``layerlab.verify`` (alias ``layerlab.gradcheck``): run the checks that find real layer bugs, and say where the bug is.

    >>> import torch, layerlab
    >>> lstm = MyLSTM(8, 16, batch_first=True)
    >>> report = layerlab.verify(lstm, torch.randn(4, 7, 8),
    ...                          reference=torch.nn.LSTM(8, 16, batch_first=True))
    >>> report.ok, [(c.name, c.status.value, c.where) for c in report.failures]
    (False, [('forward_parity', 'fail', 'output[0]'), ('backward_parity', 'fail', 'weight_ih_l0, …')])

The checks, cheapest and most telling first (``layerlab.checks``): ``runs`` (shape and dtype
contract), ``forward_parity`` and ``backward_parity`` against a reference carrying the same
weights, ``gradcheck`` (float64, inputs and parameters, each named), ``param_grads``,
``batch_independence`` and ``batch_consistency``, ``causality``, ``recurrent_state``, ``masks``;
with ``deep=True`` also ``gradgradcheck``, ``noncontiguous``, ``determinism`` and ``compile``.
Checks that do not apply are skipped with the reason. Nothing is changed on the module or the
inputs passed in: every check works on copies.

:mod:`layerlab.checks.targets` verifies a registry layer (``verify_entry``), a YAML spec
(``verify_spec``) and every registry layer (``verify_all``), as :mod:`layerlab.checks.resolve` builds them.
"""

from __future__ import annotations

import functools
import re
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.target.bind import describe as _describe  # what an input is, shown in reports
from layerlab.checks.case import ComplexState
from layerlab.checks.report import CheckResult, Status, VerifyReport
from layerlab.errors import UsageError, debug_enabled
from layerlab.target.entry import entry_point

__all__ = ["verify", "run_checks", "VerifyOptions", "CHECK_NAMES", "DEEP_CHECK_NAMES"]

#: the checks in the order they run (cheapest and most telling first)
CHECK_NAMES = ("runs", "forward_parity", "backward_parity", "gradcheck", "param_grads", "batch_independence",
               "batch_consistency", "causality", "recurrent_state", "masks")
#: the ``--deep`` checks, run after the others
DEEP_CHECK_NAMES = ("gradgradcheck", "noncontiguous", "determinism", "compile")


def _registry() -> Dict[str, Callable]:
    from layerlab.checks import batch, causality, deep, gradients, masks, parity, recurrent, runs, train_mode

    return {
        "runs": runs.runs,
        "forward_parity": parity.forward_parity,
        "backward_parity": parity.backward_parity,
        "gradcheck": train_mode.gradcheck,  # numgrad's, and in train mode too for a stochastic layer
        "param_grads": gradients.param_grads,
        "batch_independence": batch.batch_independence,
        "batch_consistency": batch.batch_consistency,
        "causality": causality.causality,
        "recurrent_state": recurrent.recurrent_state,
        "masks": masks.masks,
        "gradgradcheck": deep.gradgradcheck,
        "noncontiguous": deep.noncontiguous,
        "determinism": deep.determinism,
        "compile": deep.compile_parity,
    }


@dataclass
class VerifyOptions:
    """How the checks run.

    Attributes:
        deep: also run the deep checks (gradgradcheck, non-contiguous, determinism, torch.compile).
        seed: seeds every random tensor the checks draw.
        only: run just these checks (names from :data:`CHECK_NAMES` / :data:`DEEP_CHECK_NAMES`).
        slow_cap: the largest Jacobian (elements) slow-mode gradcheck may build.
        compile_backend: the ``torch.compile`` backend of the deep compile check.
        threads: torch's intra-op threads while the checks run (restored afterwards): the checks
            use small tensors, which run fastest on one thread; ``None`` leaves torch's setting.
        auto_reference: without a reference, compare a layer that plainly mirrors a torch.nn layer
            with it (:mod:`layerlab.checks.auto_reference`).
        progress: ``progress(what, i, n)``, called during long checks (gradcheck of a big model).
    """

    deep: bool = False
    seed: int = 0
    only: Optional[Sequence[str]] = None
    slow_cap: int = 1_000_000
    compile_backend: str = DEFAULT_COMPILE_BACKEND
    threads: Optional[int] = 1
    auto_reference: bool = True
    progress: Optional[Callable[[str, int, int], None]] = None

    @property
    def gradcheck(self):
        from layerlab.checks.numgrad import GradcheckOptions

        return GradcheckOptions(slow_cap=self.slow_cap, progress=self.progress)

    def selected(self) -> List[str]:
        names = list(CHECK_NAMES) + (list(DEEP_CHECK_NAMES) if self.deep else [])
        if self.only:
            unknown = [n for n in self.only if n not in CHECK_NAMES + DEEP_CHECK_NAMES]
            if unknown:
                import difflib

                close = difflib.get_close_matches(unknown[0], CHECK_NAMES + DEEP_CHECK_NAMES, n=1)
                raise UsageError(f"no check called {unknown[0]!r}", where="--only",
                                 expected="one of " + ", ".join(CHECK_NAMES + DEEP_CHECK_NAMES), got=unknown[0],
                                 hint=f"did you mean {close[0]!r}?" if close else None)
            names = [n for n in CHECK_NAMES + DEEP_CHECK_NAMES if n in self.only]
        return names


@entry_point("gradcheck")
def verify(
    module: Any,
    *inputs: Any,
    reference: Any = None,
    weight_map: Optional[Dict[str, str]] = None,
    deep: bool = False,
    tags: Iterable[str] = (),
    seed: int = 0,
    only: Optional[Sequence[str]] = None,
    slow_cap: int = 1_000_000,
    batch_dims: Optional[Dict[str, Optional[int]]] = None,
    reference_output: Optional[str] = None,
    compile_backend: str = DEFAULT_COMPILE_BACKEND,
    target: Optional[str] = None,
    forward_kwargs: Optional[Dict[str, Any]] = None,
    auto_reference: bool = True,
    **kwargs: Any,
) -> VerifyReport:
    """Verify ``module`` on ``inputs``; return a :class:`~layerlab.checks.report.VerifyReport`.

    Args:
        module (nn.Module): the layer under test (left unchanged: checks work on copies).
        *inputs: positional forward arguments.
        reference (nn.Module or callable, optional): what the layer should equal. A module gets
            ``module``'s weights copied in (by name, ``weight_map``, or ``module.to_torch()``);
            a function is called with the same inputs. Default: ``None`` (parity checks skip).
        weight_map (dict, optional): ``{our_name: their_name}`` for names that differ;
            ``their_name.T`` copies transposed. Default: ``None``.
        deep (bool, optional): add the deep checks. Default: ``False``.
        tags (iterable of str, optional): claims: ``causal``, ``recurrent``, ``mixes_batch``,
            ``stochastic``. Default: none.
        seed (int, optional): seed of every random tensor the checks draw. Default: ``0``.
        only (sequence of str, optional): run only these checks. Default: all.
        slow_cap (int, optional): largest Jacobian slow-mode gradcheck may build. Default: 1e6.
        batch_dims (dict, optional): input name → batch dim (``None``: shared), where the guess
            (dim 0; dim 1 for ``batch_first=False`` sequences and recurrent states) is wrong.
        reference_output (str, optional): a chain of tensor methods that brings the reference's
            output to the layer's layout, e.g. ``"flatten(2).transpose(1, 2)"``. Default: ``None``.
        compile_backend (str, optional): ``torch.compile`` backend of the deep compile check.
            Default: ``"aot_eager"`` (:mod:`layerlab.backends` says why).
        target (str, optional): the name shown in the report. Default: the class name.
        forward_kwargs (dict, optional): keyword forward arguments whose names clash with the above.
        auto_reference (bool, optional): without ``reference``, compare a layer that plainly mirrors a
            torch.nn layer (``MyGRUCell`` with ``GRUCell``'s attributes and weights) with it. Default: ``True``.
        **kwargs: keyword forward arguments (``attn_mask=…``).
    """
    from layerlab.arguments import check_module, check_seed
    from layerlab.checks.case import Arg, positional_names

    check_module(module, "layerlab.verify")
    check_seed(seed)  # 0 … 2**63−1, as in every command and API entry
    names = positional_names(module, len(inputs))
    args = [Arg(n, v, False) for n, v in zip(names, inputs)]
    args += [Arg(n, v, True) for n, v in {**kwargs, **(forward_kwargs or {})}.items()]
    opts = VerifyOptions(deep=deep, seed=seed, only=only, slow_cap=slow_cap, compile_backend=compile_backend,
                         auto_reference=auto_reference)
    return verify_args(module, args, reference, weight_map, frozenset(tags), opts, target or type(module).__name__,
                        batch_dims or {}, reference_output)


def verify_args(module, args, reference, weight_map, tags, opts: VerifyOptions, target: str,
                 batch_dims: Dict[str, Optional[int]], reference_output: Optional[str] = None) -> VerifyReport:
    from torch import nn

    from layerlab.arguments import check_not_meta
    from layerlab.checks.case import Case, class_path
    from layerlab.checks.reference import prepare

    check_not_meta(module, [a.value for a in args])  # every check compares values
    t0 = time.perf_counter()
    module = materialized(module, args)
    if isinstance(reference, nn.Module):
        reference = materialized(reference, args)
    alignment = prepare(module, args, reference, weight_map, reference_output, auto=opts.auto_reference)
    case = Case(module=module, args=list(args), target=target, reference=alignment.reference,
                param_map=alignment.param_map, reference_note=alignment.note, reference_error=alignment.error,
                reference_auto=alignment.auto, reference_suspect=alignment.suspect, tags=tags, seed=opts.seed, batch_dims=dict(batch_dims))
    results = run_checks(case, opts)
    return VerifyReport(
        target=target, module=class_path(module),
        reference=alignment.label or (class_path(reference) if reference is not None else None),
        checks=results,
        settings={"seed": opts.seed, "deep": opts.deep, "slow_cap": opts.slow_cap, "tags": sorted(tags),
                  "compile_backend": opts.compile_backend if opts.deep else None,
                  "mode": "train" if module.training else "eval", "reference_weights": alignment.note or None,
                  "inputs": {a.name: _describe(a.value) for a in args}},
        seconds=time.perf_counter() - t0,
    )


def materialized(module: Any, args) -> Any:
    """``module`` itself, or, when it holds lazy parameters (``nn.LazyLinear``, ``LazyConv2d`` …),
    a copy whose shapes one forward (no grad, RNG restored) has fixed: every check needs real
    parameters, and the user's module must stay as it was."""
    import torch
    from torch.nn.parameter import is_lazy

    from layerlab.checks.case import call, module_copy

    if not any(is_lazy(p) for p in module.parameters()) and not any(is_lazy(b) for b in module.buffers()):
        return module
    copy_ = module_copy(module)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        call(copy_, args)
    return copy_


def run_checks(case, opts: VerifyOptions) -> List[CheckResult]:
    """Run the selected checks on ``case``; a layer that does not run skips the rest."""
    import torch

    from layerlab.target.seeding import rng_untouched

    previous = torch.get_num_threads()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        with rng_untouched(case.module, [a.value for a in case.args]):  # the user's random stream stays put
            return _run_checks(case, opts)
    finally:
        torch.set_num_threads(previous)


def _run_checks(case, opts: VerifyOptions) -> List[CheckResult]:
    table = _registry()
    results: List[CheckResult] = []
    skip_why: Optional[str] = None

    def timed(checked_case, name: str) -> CheckResult:
        """One check on ``checked_case``; a raise in it is the check's result (see check_raised)."""
        t0 = time.perf_counter()
        try:
            result = table[name](checked_case, opts)
        except ComplexState as held:  # a float64 copy would be another layer: no verdict on it
            result = CheckResult(name, Status.SKIP, f"not judged: {held} {'is' if len(held.names) == 1 else 'are'} "
                                 "complex, and this check runs a float64 copy, which would drop the imaginary part",
                                 where=held.names[0], details={"complex": held.names})
        except Exception as exc:
            if debug_enabled():
                raise
            result = check_raised(name, exc)
        result.seconds = time.perf_counter() - t0
        return result

    for name in opts.selected():
        if skip_why is not None and name != "runs":
            results.append(CheckResult(name, Status.SKIP, skip_why))
            continue
        result = timed(case, name)
        results.append(result)
        if name == "runs" and result.status == Status.FAIL and result.details.get("exception"):
            skip_why = "skipped: the layer does not run (see runs)"
        elif name == "runs" and result.details.get("outside_domain"):
            skip_why = ("skipped: torch's own module returns non-finite values for these inputs (see runs); "
                        "comparing values needs inputs in its domain")
    from layerlab.checks.repeatable import reexplain

    return reexplain(case, results, timed)  # one random forward fails every comparison: say so, once


@functools.lru_cache(maxsize=1)
def _code_roots() -> Tuple[str, str, Tuple[str, ...]]:
    """layerlab's package folder, its reference layers' folder, and the library folders (stdlib,
    site-packages): found once, not for every traceback frame."""
    import os
    import sysconfig

    import layerlab

    package = os.path.dirname(os.path.abspath(layerlab.__file__))
    libraries = tuple(sorted({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                              for k in ("stdlib", "purelib", "platlib")}))
    return package + os.sep, os.path.join(package, "layers") + os.sep, libraries


def _frame_owner(filename: str) -> str:
    """Whose code a traceback frame is: ``"harness"`` (layerlab's checks and tools), ``"torch"``
    (torch, other installed libraries, the standard library) or ``"layer"`` (the code under test:
    the user's files and layerlab's own reference layers)."""
    import os

    package, layers, libraries = _code_roots()
    path = os.path.abspath(filename)
    if path.startswith(package):
        return "layer" if path.startswith(layers) else "harness"
    if path.startswith(libraries) or filename.startswith("<frozen"):
        return "torch"
    return "layer"


#: autograd's message when the forward overwrote a tensor it saved for backward
_INPLACE_SAVED = re.compile(r"modified by an inplace operation(?::[^\n]*?, which is (?P<which>output \d+ of \w+))?")

#: layerlab's torch function / dispatch modes (float32 islands, the op trace) pass each op through
_PASS_THROUGH = ("__torch_function__", "__torch_dispatch__")


def _through_modes(frames: list, owners: List[str]) -> tuple:
    """The traceback without the innermost frames of a layerlab mode that was passing an op through
    (and torch's below it): a raise there is the op's, and belongs to the code that called the op
    (``x.sub_(…)`` on a leaf that requires grad, in the layer's forward), not to layerlab."""
    for i in range(len(frames) - 1, -1, -1):
        if owners[i] == "harness" and frames[i].name in _PASS_THROUGH:
            if i and all(o == "torch" for o in owners[i + 1:]):
                return frames[:i], owners[:i]
            break
        if owners[i] != "torch":
            break
    return frames, owners


def check_raised(name: str, exc: BaseException) -> CheckResult:
    """The verdict of a check that raised, by whose code raised it.

    A raise in the layer's own code (or a torch call made from it) under the check's conditions
    (float64, one sample, perturbed inputs) is a failure of the layer. A raise with no layer code on
    the stack comes from torch's own module meeting inputs the check made (a loss target pushed
    out of [0, 1], say): the check does not apply there, which is a warning, not a verdict on the
    layer. A raise inside layerlab itself is layerlab's bug and says so.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    owners = [_frame_owner(f.filename) for f in frames]
    frames, owners = _through_modes(frames, owners)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    last = frames[-1] if frames else None
    layer_frames = [f for f, o in zip(frames, owners) if o == "layer"]
    where_frame = layer_frames[-1] if layer_frames else last
    where = f"{where_frame.filename.rsplit('/', 1)[-1]}:{where_frame.lineno} ({where_frame.name})" if where_frame else None
    details = {"exception": type(exc).__name__, "message": str(exc)[:2000], "raised_in": owners[-1] if owners else None}
    inplace = _INPLACE_SAVED.search(str(exc)) if isinstance(exc, RuntimeError) else None
    if inplace:
        # autograd raises this in backward, with no layer frame on the stack, but the cause is an in-place
        # op in the forward that overwrote a tensor autograd had saved: the layer's bug, not torch refusing inputs
        saved = inplace.group("which") or "a tensor"
        return CheckResult(name, Status.FAIL, f"backward is impossible: an in-place operation in the forward "
                           f"modified {saved}, which autograd saved for the backward",
                           where=f"forward ({saved})" if inplace.group("which") else where,
                           hint="an in-place op (x.mul_(…), x += …, x[idx] = …, relu(inplace=True)) overwrote a "
                           "tensor autograd needs: write the out-of-place form (s = s * 2, not s.mul_(2)); "
                           "torch.autograd.set_detect_anomaly(True) prints the forward line of the op",
                           details={**details, "inplace": True})
    if owners and owners[-1] == "harness":
        return CheckResult(name, Status.WARN, f"the check could not run: layerlab raised {type(exc).__name__}: {text}",
                           where=where, hint="this is a layerlab bug, not a finding about the layer; "
                           "LAYERLAB_DEBUG=1 shows the traceback — please report it", details=details)
    if layer_frames:
        return CheckResult(name, Status.FAIL, f"the layer raised {type(exc).__name__} under this check: {text}",
                           where=where, hint="the layer fails under this check's conditions (float64, eval mode, "
                           "one sample, perturbed inputs …); LAYERLAB_DEBUG=1 shows the traceback", details=details)
    return CheckResult(name, Status.WARN, f"the check does not apply: torch raised {type(exc).__name__} on the inputs "
                       f"this check made: {text}", where=where,
                       hint="no code of the layer under test was running, so this says nothing about the layer: "
                       "torch's own module refused the check's inputs (e.g. values outside its domain)",
                       details=details)
