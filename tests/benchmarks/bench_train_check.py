"""Cost of ``layerlab train-check`` (default run) next to 50 plain optimizer steps, per configs/ example.

    python tests/benchmarks/bench_train_check.py                 # every runnable configs/*.yaml
    python tests/benchmarks/bench_train_check.py configs/gru.yaml --repeats 5

"train-check" is :func:`layerlab.train.run.train_target` on the built spec with its defaults (Adam
lr 1e-2, 50 steps, MSE to a random target unless the spec's ``train:`` says otherwise): the whole
call, trackers, hooks, graph walk and report included. "plain" is the same number of steps of the
same loop without layerlab — ``zero_grad``, forward, the same loss on the same output and target,
``backward``, ``step`` — on its own copy of the model, with the optimizer train-check used.
Both run alternately in one process after a warm-up; medians over ``--repeats``; ratio =
train-check / plain. Wall time (on a shared machine it includes waiting for a core). The issue's
target: a default train-check run < 10 s on every configs/ example.
"""

from __future__ import annotations

import argparse
import copy
import glob
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from layerlab.errors import LayerlabError  # noqa: E402
from layerlab.target.bind import map_args  # noqa: E402
from layerlab.target.build import resolve  # noqa: E402
from layerlab.train.run import train_target  # noqa: E402


def _plain(built, report, steps: int) -> float:
    """``steps`` bare optimizer steps with the loss train-check used (same output, same target)."""
    from layerlab.train import loss as L

    model = copy.deepcopy(built.module)
    args = map_args(built.args, lambda t: t.detach())
    pos = [a.value for a in args if not a.keyword]
    kw = {a.name: a.value for a in args if a.keyword}
    out = model(*pos, **kw)
    name, fn = L.loss_function(report.loss, "loss")
    pred = L.select(out, report.output)
    target = None if fn is None else L.make_target(name, pred, built.seed)
    if report.target_source.startswith("the spec"):  # a spec target: rebuild it the way train-check does
        from layerlab.train.objective import spec_target as _spec_target
        from layerlab.train.section import parse_section

        section = parse_section(built.sections.get("train"), built.marks, base_dir=built.base_dir)
        target = _spec_target(section.target, pred, built, args)
    lr = report.lr or 1e-2
    opt_cls = torch.optim.SGD if report.optimizer.startswith("sgd") else torch.optim.Adam
    opt = opt_cls([p for p in model.parameters() if p.requires_grad], lr=lr)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        pred = L.select(model(*pos, **kw), report.output)
        loss = pred if fn is None else fn(pred, target)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", help="spec files (default: configs/*.yaml)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    specs = args.specs or sorted(glob.glob(str(Path(__file__).resolve().parents[2] / "configs" / "*.yaml")))
    print(f"{'spec':42s} {'train-check s':>13s} {'plain 50 s':>10s} {'ratio':>6s}  verdict")
    for spec in specs:
        label = str(Path(spec).name)
        try:
            built = resolve(spec, allow_import=True, reference=False)
            train_target(built, steps=2)  # warm-up (and: does it run at all?)
        except LayerlabError as exc:
            print(f"{label:42s} {'—':>13s} {'—':>10s} {'—':>6s}  not runnable: {exc.message[:60]}")
            continue
        checked, plain, report = [], [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            report = train_target(built)
            checked.append(time.perf_counter() - t0)
            plain.append(_plain(built, report, report.steps))
        c, p = statistics.median(checked), statistics.median(plain)
        flag = "" if c < 10 else "  ← over 10 s"
        print(f"{label:42s} {c:13.2f} {p:10.2f} {c / p:5.2f}×  {report.fit.verdict}, ok={report.ok}{flag}")


if __name__ == "__main__":
    main()
