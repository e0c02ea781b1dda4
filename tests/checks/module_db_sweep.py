"""Run ``layerlab.inspect`` and ``layerlab.verify`` over the samples torch tests its own modules with.

``torch.testing._internal.common_modules.module_db`` lists ~114 torch.nn modules, each with the
sample inputs torch's own test-suite feeds them (needs the ``expecttest`` package). Every sample is
a module nobody here wrote, on inputs nobody here chose: a verdict of "the layer is wrong" on any of
them is a false alarm, except where the sample itself is degenerate by design (listed in
:data:`TRUE_BY_DESIGN` with the reason).

Used by ``tests/checks/test_module_db.py`` (a few samples per module) and runnable as a script for
the full sweep::

    python tests/checks/module_db_sweep.py [--per-module N] [--modules Name,Name]

which prints one line per finding and the totals.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

#: check verdicts that are true by design of the sample, not false alarms: (module, check) → why
TRUE_BY_DESIGN: Dict[tuple, str] = {}


@dataclass
class Sample:
    module: str
    index: int
    desc: str
    training: bool
    build: Any  # () -> nn.Module
    args: tuple
    kwargs: dict


@dataclass
class Finding:
    sample: str
    tool: str
    what: str
    detail: str = ""


@dataclass
class SweepResult:
    samples: int = 0
    findings: List[Finding] = field(default_factory=list)
    seconds: float = 0.0


def module_infos(names: Optional[Sequence[str]] = None):
    from torch.testing._internal.common_modules import module_db

    for info in module_db:
        name = info.module_cls.__name__
        if names and name not in names:
            continue
        yield info


def samples(per_module: int = 2, names: Optional[Sequence[str]] = None) -> Iterator[Sample]:
    """Up to ``per_module`` samples of every module in train and in eval (float32, CPU)."""
    for info in module_infos(names):
        name = info.module_cls.__name__
        for training in (True, False):
            try:
                inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                                 requires_grad=True, training=training)
            except Exception:  # torch's own sample factory needs something not here (e.g. a GPU)
                continue
            for i in _spread(len(inputs), per_module):
                mi = inputs[i]
                ci, fi = mi.constructor_input, mi.forward_input

                def build(ci=ci, cls=info.module_cls, training=training):
                    torch.manual_seed(0)
                    m = cls(*ci.args, **ci.kwargs)
                    return m.train(training)

                yield Sample(name, i, mi.desc or "", training, build, tuple(fi.args), dict(fi.kwargs))


def _spread(n: int, k: int) -> List[int]:
    """``k`` indices spread evenly over ``range(n)`` (first and last included): torch lists a
    module's samples from plain to exotic, so the spread sees both."""
    if k >= n:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


def _label(s: Sample) -> str:
    return f"{s.module}[{s.index}{':' + s.desc if s.desc else ''}]({'train' if s.training else 'eval'})"


def run_sample(s: Sample, tools=("inspect", "verify")) -> List[Finding]:
    import layerlab

    out: List[Finding] = []
    label = _label(s)
    try:
        module = s.build()
    except Exception as exc:  # the sample does not build on this torch: not ours to judge
        return out
    # the sample's own forward must run, or there is nothing to judge
    try:
        with torch.no_grad():
            copy.deepcopy(module)(*copy.deepcopy(s.args), **copy.deepcopy(s.kwargs))
    except Exception:
        return out
    if "inspect" in tools:
        try:
            rep = layerlab.inspect(copy.deepcopy(module), *copy.deepcopy(s.args), **copy.deepcopy(s.kwargs))
            if rep.failure is not None:
                out.append(Finding(label, "inspect", "failure", str(rep.failure.message)[:200]))
        except Exception as exc:
            out.append(Finding(label, "inspect", "crash", f"{type(exc).__name__}: {str(exc)[:160]}"))
    if "verify" in tools:
        try:
            rep = layerlab.verify(copy.deepcopy(module), *copy.deepcopy(s.args), **copy.deepcopy(s.kwargs))
            for c in rep.checks:
                if c.status.value == "fail" and (s.module, c.name) not in TRUE_BY_DESIGN:
                    out.append(Finding(label, "verify", c.name, f"{c.summary[:160]} | where={c.where}"))
        except Exception as exc:
            out.append(Finding(label, "verify", "crash",
                               f"{type(exc).__name__}: {str(exc)[:160]} @ {traceback.extract_tb(exc.__traceback__)[-1].name}"))
    return out


def sweep(per_module: int = 2, names: Optional[Sequence[str]] = None, tools=("inspect", "verify"),
          progress: bool = False) -> SweepResult:
    result = SweepResult()
    t0 = time.perf_counter()
    for s in samples(per_module, names):
        result.samples += 1
        found = run_sample(s, tools)
        result.findings.extend(found)
        if progress:
            for f in found:
                print(f"{f.sample}  {f.tool}:{f.what}  {f.detail}", flush=True)
    result.seconds = time.perf_counter() - t0
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-module", type=int, default=1000)
    p.add_argument("--modules", default="")
    p.add_argument("--tools", default="inspect,verify")
    a = p.parse_args(argv)
    names = [n for n in a.modules.split(",") if n] or None
    r = sweep(a.per_module, names, tuple(a.tools.split(",")), progress=True)
    by_kind: Dict[str, int] = {}
    for f in r.findings:
        by_kind[f"{f.tool}:{f.what}"] = by_kind.get(f"{f.tool}:{f.what}", 0) + 1
    print(f"{r.samples} samples, {len(r.findings)} findings in {r.seconds:.0f} s: {by_kind}")
    return 1 if r.findings else 0


if __name__ == "__main__":
    sys.exit(main())
