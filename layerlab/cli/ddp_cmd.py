"""``layerlab ddp-check NAME|SPEC``: N ranks of DistributedDataParallel against one process.

Parse → :func:`layerlab.distributed.run.check_target` → :mod:`layerlab.cli.render_ddp`. Exit codes:
0 the DDP step matches (warnings allowed), 1 a check failed or a rank failed, 2 bad usage or spec,
130 Ctrl-C (the ranks are stopped first). Under torchrun (its variables set) this process is one
rank: every rank runs the check, rank 0 prints, all exit with the same code.
"""

from __future__ import annotations

from typing import Optional

import typer
from typing import Annotated

from layerlab.cli.options import DeviceOpt, DtypeOpt, InputShapeOpt, JsonOpt, ModeOpt, SeedOpt, overrides
from layerlab.cli.target_arg import AllowImportOpt, device_of, refuse_meta, resolve

TargetArg = Annotated[str, typer.Argument(
    metavar="NAME|SPEC", help="A layerlab registry name (linear) or a YAML spec (its ddp: section is read).",
    show_default=False)]
NprocOpt = Annotated[Optional[int], typer.Option(
    "--nproc", help="Ranks to start on this machine (the spec's ddp: nproc, else 2). Ignored under torchrun.",
    show_default=False)]
TimeoutOpt = Annotated[Optional[float], typer.Option(
    "--timeout", help="Seconds any collective may wait before its rank gives up (default 60).", show_default=False)]
FindUnusedOpt = Annotated[Optional[bool], typer.Option(
    "--find-unused-parameters/--no-find-unused-parameters",
    help="DDP's find_unused_parameters as you train (the spec's ddp:, else off).", show_default=False)]
RanksJsonOpt = Annotated[bool, typer.Option(
    "--ranks-json", help="Print each rank's raw results as JSON (losses, gradient norms, modules that ran).")]


def command(
    target: TargetArg,
    nproc: NprocOpt = None,
    timeout: TimeoutOpt = None,
    find_unused_parameters: FindUnusedOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    input_shape: InputShapeOpt = None,
    seed: SeedOpt = None,
    allow_import: AllowImportOpt = False,
    ranks_json: RanksJsonOpt = False,
    json: JsonOpt = False,
) -> int:
    """Check a DistributedDataParallel step against one process on the whole batch.

    Starts N ranks here (gloo on CPU, NCCL on CUDA), splits the batch across them, runs forward +
    backward under DDP, and checks: gradients after the all-reduce (equal across ranks and to one
    process, else the likely cause), unused parameters and rank-dependent control flow, buffers
    that differ between ranks, per-rank shapes; a failed or hung rank is named with where it was.

    [b]Examples[/b]

      layerlab ddp-check configs/ddp_mlp.yaml
      layerlab ddp-check configs/cnn_block.yaml --nproc 4 --json
      torchrun --nproc-per-node 2 -m layerlab ddp-check configs/ddp_mlp.yaml
    """
    from layerlab.cli.output import Output
    from layerlab.distributed import options as ddp_options
    from layerlab.distributed import torchrun

    out = Output(json_mode=json or ranks_json)
    device_of(device)
    if nproc is not None:  # before the fork server below: a bad option starts no process at all
        ddp_options.check_nproc(nproc)
    if timeout is not None:
        ddp_options.check_timeout(timeout)
    if torchrun.environment() is None:
        from layerlab.distributed.launch import prestart

        prestart()  # the ranks' imports run while this process builds the spec
    from layerlab.distributed.run import whole_run_limit
    from layerlab.faults import run_guard

    # ddp-check's --timeout is the collectives'; the command's own wall clock follows from it, so a
    # forward that never returns (in the spec's shape-only memory check, or the single-process step)
    # cannot hang it. Two guards in turn: the spec may set another collective timeout.
    with run_guard("ddp-check", whole_run_limit({"timeout": timeout})):
        resolved = resolve(target, options=overrides(device=device, dtype=dtype, seed=seed, mode=mode,
                                                     input_shape=input_shape),
                           allow_import=allow_import, reference=False)
        refuse_meta(resolved)
        opts = ddp_options.from_section(resolved.sections.get("ddp"), resolved.marks).with_(
            nproc=nproc, timeout=timeout, find_unused_parameters=find_unused_parameters)
        build = _build(target, device=device, dtype=dtype, seed=seed, mode=mode, input_shape=input_shape,
                       allow_import=allow_import)
    from layerlab.cli.progress import steps
    from layerlab.distributed.run import check_target

    env = torchrun.environment()
    with steps(out.err, "ddp-check", json_mode=out.json_mode or env is not None) as advance, \
            run_guard("ddp-check", whole_run_limit({"timeout": opts.timeout})):
        report = check_target(resolved, build, opts, allow_import=allow_import,
                              progress=lambda what: advance(what, 0, 0))
    if env is None or env.rank == 0:
        if ranks_json:
            out.json({"schema": 1, "kind": "ddp-check-ranks", "target": report.target, "ranks": report.raw})
        elif out.json_mode:
            out.json(report)
        else:
            from layerlab.cli.render_ddp import report as render

            out.show(*render(report))
    return 0 if report.ok else 1


def _build(target: str, **options):
    """How each rank builds the model: the spec again (with the same overrides), or the registry layer."""
    from layerlab.distributed.run import SpecBuild
    from layerlab.target.build import is_spec_path

    allow_import = options.pop("allow_import")
    shared = overrides(**options)
    if is_spec_path(target):
        return SpecBuild(target, shared, allow_import)
    return _EntryBuild(target, shared)


class _EntryBuild:
    """A registry layer, built again in the rank (its initial state is the driver's)."""

    def __init__(self, name: str, shared) -> None:
        self.name, self.shared = name, shared

    def __call__(self):
        from layerlab.target.build import from_entry

        return from_entry(self.name, overrides=self.shared, reference=False).module
