"""Keep a layer healthy in your own test suite: assertions that fail with layerlab's report.

Each function runs one layerlab check and returns its report when the check holds; when it does
not, it raises :class:`AssertionError` whose message is the report rendered as the CLI prints it
(``layerlab.render(report, width=100)``), headed by one line saying what failed. Plain pytest
shows that message under the failing test: no plugin, no fixture::

    import torch
    from layerlab.testing import assert_exports, assert_shapes, assert_verified

    def test_my_attention():
        layer = MyAttention(64, 8)
        x = torch.randn(2, 10, 64)
        assert_verified(layer, x, reference=torch.nn.MultiheadAttention(64, 8, batch_first=True))
        assert_shapes(layer, x, expected=(2, 10, 64))
        assert_exports(layer, x, paths=["trace", "export"])

* :func:`assert_verified` — ``layerlab.verify`` (gradcheck): parity with the reference, gradients,
  batch independence, …; fails when any check fails.
* :func:`assert_shapes` — ``layerlab.inspect``: the forward runs, every conv/pool/flatten output
  equals explain-shape's formula, and the outputs have the shapes you expect.
* :func:`assert_exports` — ``layerlab.export_check``: the paths you name trace/script/compile/export
  and equal eager; a warning (input-specific trace, graph break) fails only with ``strict=True``.

Torch is imported when a function runs, not when this module is imported.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

__all__ = ["assert_verified", "assert_shapes", "assert_exports"]

#: the width the report is rendered at in a failure message (pytest does not wrap it)
WIDTH = 100

Shape = Sequence[int]


def _fail(headline: str, report: Any) -> AssertionError:
    from layerlab.report_render import render

    return AssertionError(f"{headline}\n{render(report, width=WIDTH)}")


def assert_verified(module: Any, *inputs: Any, reference: Any = None, **verify_kwargs: Any):
    """Assert that every check of ``layerlab.verify`` passes; return the report.

    Args:
        module (nn.Module): the layer under test (checks never change it).
        *inputs: its forward arguments.
        reference (nn.Module, optional): the layer it must equal (weights copied by name).
            Default: none, or the torch.nn layer ``verify`` finds on its own (auto-reference).
        **verify_kwargs: passed to :func:`layerlab.verify` (``tags``, ``weight_map``, ``deep``,
            ``seed``, ``only``, ``forward_kwargs``, …).

    Raises:
        AssertionError: a check failed; the message names the failing checks, then the report.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    from layerlab.checks.run import verify

    report = verify(module, *inputs, reference=reference, **verify_kwargs)
    if not report.ok:
        names = ", ".join(c.name for c in report.failures)
        raise _fail(f"layerlab.verify: {len(report.failures)} check(s) failed: {names}", report)
    return report


def _as_shapes(expected: Union[Shape, Sequence[Shape]]) -> List[Tuple[int, ...]]:
    """One shape ``(2, 10)`` or one per output ``[(2, 10), (1, 2, 16)]`` → a list of tuples."""
    items = list(expected)
    if items and all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return [tuple(items)]
    shapes = []
    for item in items:
        if isinstance(item, (str, bytes)) or not all(isinstance(v, int) for v in item):
            raise TypeError(f"assert_shapes: expected= takes a shape such as (2, 10) or a list of them, "
                            f"got {expected!r}")
        shapes.append(tuple(item))
    return shapes


def assert_shapes(module: Any, *inputs: Any, expected: Optional[Union[Shape, Sequence[Shape]]] = None,
                  **inspect_kwargs: Any):
    """Assert that the forward runs, that every conv/pool/flatten call's output equals the size
    explain-shape's formula predicts for it, and (with ``expected``) the output shapes; return
    ``layerlab.inspect``'s report.

    Args:
        module (nn.Module): the layer or model.
        *inputs: its forward arguments.
        expected (shape or list of shapes, optional): the output's shape, e.g. ``(2, 16, 15, 15)``,
            or one shape per output tensor in the order ``inspect`` lists them (a tuple
            ``(output, (h, c))`` gives three). Default: only the run and the formula checks.
        **inspect_kwargs: passed to :func:`layerlab.inspect` (``mode``, ``backward``, ``seed``, …).

    Raises:
        AssertionError: the forward raised, a formula check failed, or a shape differs.
        TypeError: ``expected`` is not a shape or a list of shapes.
    """
    __tracebackhide__ = True
    from layerlab.probe.run import inspect

    wanted = None if expected is None else _as_shapes(expected)  # bad ``expected`` fails before running
    report = inspect(module, *inputs, **inspect_kwargs)
    if report.failure is not None:
        raise _fail(f"layerlab.inspect: the forward raised in {report.failure.path or '(root)'}", report)
    failed = report.checks_failed
    if failed:
        where = "; ".join(f"{c.path or '(root)'}: formula {tuple(c.predicted or ())}, actual {tuple(c.actual or ())}"
                          for c in failed)
        raise _fail(f"layerlab.inspect: {len(failed)} output size(s) differ from explain-shape's formula: {where}",
                    report)
    if wanted is not None:
        got = [tuple(o.shape) for o in report.outputs if o.is_tensor]
        if got != wanted:
            raise _fail(f"layerlab.inspect: output shape(s) {_show(got)}, expected {_show(wanted)}", report)
    return report


def _show(shapes: List[Tuple[int, ...]]) -> str:
    return ", ".join(str(s) for s in shapes) if shapes else "none"


def assert_exports(module: Any, *inputs: Any, paths: Optional[Sequence[str]] = None, strict: bool = False,
                   **export_kwargs: Any):
    """Assert that each export path runs and equals eager; return ``layerlab.export_check``'s report.

    Args:
        module (nn.Module): the layer (left unchanged: every path works on a copy in eval mode).
        *inputs: its forward arguments.
        paths (sequence of str, optional): ``trace``, ``script``, ``compile``, ``export``,
            ``export_dynamic``, ``onnx``. Default: all of them. A path that is skipped (ONNX
            without its packages) does not fail.
        strict (bool): a warning fails too (a trace that holds for the example size only, a
            graph break, a batch dim export cannot keep dynamic). Default: ``False``.
        **export_kwargs: passed to :func:`layerlab.export_check` (``compile_backend``, ``rtol``, …).

    Raises:
        AssertionError: a path failed (or, with ``strict``, warned).
    """
    __tracebackhide__ = True
    from layerlab.deploy.run import export_check

    report = export_check(module, *inputs, paths=paths, **export_kwargs)
    if not report.ok_for(strict):
        bad = {"fail", "warn"} if strict else {"fail"}
        names = ", ".join(f"{r.path} ({_status(r)})" for r in report.paths if _status(r) in bad)
        raise _fail(f"layerlab.export_check: {names}", report)
    return report


def _status(result: Any) -> str:
    return getattr(result.status, "value", str(result.status))
