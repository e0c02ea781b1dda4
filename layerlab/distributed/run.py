"""``layerlab.ddp_check``: does N ranks of DistributedDataParallel take the step one process takes?

    >>> import torch, layerlab
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    >>> report = layerlab.ddp_check(model, torch.randn(8, 16), nproc=2)   # doctest: +SKIP
    >>> report.ok, report.titles()                                        # doctest: +SKIP
    (True, [])

The model is a module (pickled to the ranks: its class must be importable), a factory (a picklable
callable returning the module, called on every rank) or a spec path (built on every rank). The
single-process runs happen here (:mod:`~layerlab.distributed.single`); the ranks run under
``torch.distributed`` (:mod:`~layerlab.distributed.launch`, or torchrun itself: when torchrun's
variables are set, this process *is* one rank, see :mod:`~layerlab.distributed.torchrun`); the
comparison is :mod:`~layerlab.distributed.assemble`'s. Backend: gloo on CPU, NCCL on CUDA (one GPU
per rank). The user's module is never modified: every run uses a copy.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Callable, Dict, Optional

import torch

from layerlab.distributed.options import DdpOptions, check_nproc, check_timeout
from layerlab.errors import CheckFailed, UsageError
from layerlab.target.entry import entry_point

__all__ = ["ddp_check", "check_target", "SpecBuild"]


class SpecBuild:
    """Builds the spec's model in a rank (a spec's classes may come from a ``./file.py`` that cannot be
    pickled; the spec can always be read again). The driver's initial state is loaded after."""

    def __init__(self, path: str, overrides: Any, allow_import: bool) -> None:
        self.path, self.overrides, self.allow_import = path, overrides, allow_import

    def __call__(self) -> torch.nn.Module:
        from layerlab.target.build import from_spec

        return from_spec(self.path, overrides=self.overrides, allow_import=self.allow_import, reference=False).module


class ConfigBuild:
    """Builds a Hugging Face model in a rank from its class and config, as a training script does; the
    driver's state is loaded after. Used only where pickle refuses the module itself: a weight-norm
    parametrization (Wav2Vec2's positional conv) holds a function pickle cannot send."""

    def __init__(self, cls: type, config: Any) -> None:
        self.cls, self.config = cls, config

    @classmethod
    def of(cls, module: torch.nn.Module) -> Optional["ConfigBuild"]:
        """A rebuild for ``module`` (a transformers model pickle refused) that can be pickled, else ``None``."""
        config = getattr(module, "config", None)
        if config is None or not type(module).__module__.startswith("transformers."):
            return None
        build = cls(type(module), config)
        try:
            _check_picklable(build)
        except UsageError:
            return None
        return build

    def __call__(self) -> torch.nn.Module:
        return self.cls(self.config)


class _Given:
    """The module as pickled to the rank (its state arrives with it).

    The driver pickles a copy, never the user's module. Each rank unpickles a copy of its own (from
    the launcher's job file, or torchrun's ``broadcast_object_list``; under torchrun rank 0 keeps
    the driver's copy, which nothing else uses), so the rank takes that module as it is: a second
    copy would double the rank's memory for nothing (500 MB for GPT-2)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module: Optional[torch.nn.Module] = module

    def __call__(self) -> torch.nn.Module:
        module, self.module = self.module, None
        if module is None:
            raise RuntimeError("layerlab: a rank builds its model once (the job's module was handed over already)")
        _register_output_capture(module)
        return module


def _register_output_capture(module: torch.nn.Module) -> None:
    """Redo, in this rank, what a Hugging Face model's ``__init__`` registers in a process-wide table.

    transformers ≥ 5 records ``hidden_states``/``attentions`` only for model classes its
    ``_CAN_RECORD_REGISTRY`` lists, and a model lists its class there when it is *built*
    (``PreTrainedModel.__init__``). A model unpickled in a fresh rank was never built there, so
    ``output_hidden_states=True`` returns ``None`` and Segformer's decode head raises "'NoneType' object
    is not subscriptable" on every rank: a failure of the transport, not of the model (a training
    script builds the model in each rank). Nothing happens without transformers, or where it has no
    such table."""
    import sys

    if "transformers" not in sys.modules:  # the model holds no transformers class: nothing to register
        return
    try:
        from transformers import PreTrainedModel
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # another transformers version: no per-process table to fill
        return
    for sub in module.modules():
        if isinstance(sub, PreTrainedModel):
            _CAN_RECORD_REGISTRY[sub] = sub._can_record_outputs


def whole_run_limit(kwargs: Dict[str, Any]) -> float:
    """The whole command's wall clock: twice the ranks' budget for the collective timeout (the
    single-process runs in this process take about as long as the ranks' step)."""
    from layerlab.distributed.launch import deadline_for
    from layerlab.distributed.options import DdpOptions

    t = kwargs.get("timeout")
    return 2 * deadline_for(float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0
                            else DdpOptions.timeout)


@entry_point("ddp-check", timeout_kwarg=False, run_limit=whole_run_limit)
def ddp_check(model: Any, *inputs: Any, nproc: Optional[int] = None, loss: Any = None,
              find_unused_parameters: Optional[bool] = None, broadcast_buffers: Optional[bool] = None,
              timeout: Optional[float] = None, seed: int = 0, batch_dims: Optional[Dict[str, Optional[int]]] = None,
              allow_import: bool = False, name: Optional[str] = None, **kwargs: Any):
    """Check a DDP step of ``model`` on ``inputs`` against one process; return a :class:`DdpReport`.

    Args:
        model (nn.Module | str | callable): the module, a YAML spec path, or a factory returning it.
        *inputs: the whole batch's positional forward arguments (none for a spec).
        nproc (int, optional): ranks. Default: the spec's ``ddp: nproc`` or 2.
        loss (str | callable, optional): ``fn(output, inputs) -> scalar`` (module level, so ranks can
            import it) or an import path. Default: a per-sample mean (:mod:`layerlab.distributed.loss`).
        find_unused_parameters, broadcast_buffers (bool, optional): DDP's options as you train.
        timeout (float, optional): seconds every collective may wait. Default: 60.
        seed (int, optional): seed of the loss weights and of every forward's RNG. Default: ``0``.
        batch_dims (dict, optional): input name → batch dim, where the layout inference should not guess.
        allow_import (bool): a spec's import paths (and ``ddp: loss``) may run their code.
        **kwargs: keyword forward arguments.
    """
    from layerlab.distributed.options import from_section
    from layerlab.spec import Overrides
    from layerlab.target.build import from_spec
    from layerlab.target.core import from_module

    from layerlab.distributed import launch, torchrun

    _refuse_in_a_starting_rank()
    if nproc is not None:  # before the fork server below: a bad argument starts no process at all
        check_nproc(nproc, "nproc")
    if timeout is not None:
        check_timeout(timeout, "timeout")
    if torchrun.environment() is None:
        launch.prestart(model)  # the ranks' imports overlap building the model and the single-process runs
    given = dict(nproc=nproc, loss=loss, find_unused_parameters=find_unused_parameters,
                 broadcast_buffers=broadcast_buffers, timeout=timeout)
    if isinstance(model, (str, os.PathLike)):
        if inputs or kwargs:
            raise UsageError("a spec brings its own inputs", where="inputs", hint="ddp_check('model.yaml', nproc=2)")
        target = from_spec(str(model), seed=seed, allow_import=allow_import, reference=False)
        options = from_section(target.sections.get("ddp"), target.marks).with_(**given)
        return check_target(target, SpecBuild(str(model), Overrides(seed=seed), allow_import), options,
                            allow_import=allow_import)
    if isinstance(model, torch.nn.Module):
        module, build = model, None
    elif callable(model):
        module, build = model(), model
        if not isinstance(module, torch.nn.Module):
            raise UsageError(f"the factory returned {type(module).__name__}, not an nn.Module", where="model")
    else:
        raise UsageError(f"ddp_check takes an nn.Module, a factory or a spec path, got {type(model).__name__}",
                         where="model")
    refuse_lazy(module)
    target = from_module(module, *inputs, seed=seed, batch_dims=batch_dims, name=name, **kwargs)
    if build is not None:
        _check_picklable(build)
    else:
        try:
            _check_picklable(module)
        except UsageError:  # a Hugging Face model that pickle refuses is rebuilt from its config
            build = ConfigBuild.of(module)
            if build is None:
                raise
    return check_target(target, build, DdpOptions().with_(**given), allow_import=allow_import)


def _refuse_in_a_starting_rank() -> None:
    """A rank re-imports the main script; unguarded, the script calls ddp_check again there. Say so in
    one line (the driver names the rank that died) instead of multiprocessing's page of traceback."""
    import multiprocessing
    import sys

    if getattr(multiprocessing.current_process(), "_inheriting", False):  # set while a child bootstraps
        # os._exit, not sys.exit: the command's guard turns a SystemExit into "the model called sys.exit"
        sys.stderr.write("error: layerlab.ddp_check was called while a rank imported the main script: put the call "
                         "under if __name__ == '__main__':\n")
        sys.stderr.flush()
        os._exit(1)


def refuse_lazy(module: torch.nn.Module) -> None:
    """A Lazy* module (weights sized by the first forward) fails DDP's constructor, as it would in training:
    say so with the module's path and the fix, before any copy of the model touches its unsized weights."""
    from torch.nn.parameter import is_lazy

    lazy = [name or "(root)" for name, m in module.named_modules()
            if any(is_lazy(t) for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)])]
    if lazy:
        named = dict(module.named_modules())
        shown = ", ".join(f"{n} ({type(named.get(n if n != '(root)' else '')).__name__})" for n in lazy[:4])
        raise CheckFailed(f"DistributedDataParallel(model) raises on this model: {shown} "
                          f"{'has' if len(lazy) == 1 else 'have'} uninitialized (lazy) parameters, and DDP must "
                          "know every parameter's size when it is built (torch: \"Modules with uninitialized "
                          "parameters can't be used with `DistributedDataParallel`\")", where=lazy[0],
                          hint="run one forward on a dummy batch before wrapping the model in DDP (and before "
                               "building the optimizer), or give the layer its input size (nn.Linear(in, out))")


def _check_picklable(obj: Any) -> None:
    """The ranks get the model (or the factory) by pickle: its classes must be importable there, and
    every attribute picklable (a lambda or a local function stored on a module is not). Tensors are
    left out of this trial (``persistent_id``): the check costs no copy of the weights."""
    import io

    class _NoTensors(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:  # the transport's copy leaves capture hooks behind
            return id(o) if isinstance(o, torch.Tensor) or _capture_hook(o) else None

    try:
        _NoTensors(io.BytesIO()).dump(obj)
    except Exception as exc:
        what = "the factory" if not isinstance(obj, torch.nn.Module) else f"the model ({type(obj).__qualname__})"
        raise UsageError(f"the ranks cannot receive {what}: {type(exc).__name__}: {exc}", where="model",
                         hint="define the model's classes (or the factory) at module level in an importable file, "
                         "not inside a function or a notebook cell, and keep lambdas off the module (or pass a "
                         "factory: ddp_check(make_model, x))") from None


def check_target(target: Any, build: Optional[Callable[[], torch.nn.Module]], options: DdpOptions, *,
                 allow_import: bool = False, progress: Optional[Callable[[str], None]] = None):
    """The check on a built :class:`~layerlab.target.Target`: ``build`` makes the model in a rank
    (``None``: the target's module is pickled to them).

    This process uses the intra-op threads one rank gets (``cores // world``; restored after): the
    fork server and the ranks run beside its single-process runs and comparisons, and on a busy
    2-core machine two OpenMP threads fighting them made a 20 ms step take 300 ms. One thread per
    side also sums in the same order on both sides."""
    before = torch.get_num_threads()
    try:
        return _check(target, build, options, allow_import, progress or (lambda what: None))
    finally:
        torch.set_num_threads(before)


def _check(target: Any, build: Optional[Callable[[], torch.nn.Module]], options: DdpOptions, allow_import: bool,
           tell: Callable[[str], None]):
    from layerlab.distributed import torchrun
    from layerlab.distributed.loss import MeanLoss, UserLoss
    from layerlab.distributed.report import DdpReport
    from layerlab.distributed.shard import plan
    from layerlab.distributed.single import run_single
    from layerlab.distributed.worker import RankJob
    from layerlab.target.bind import class_path, map_args

    t0 = time.perf_counter()
    env = torchrun.environment()
    world = env.world if env else check_nproc(options.nproc, "nproc")
    threads = max(1, (os.cpu_count() or 1) // (env.local_world if env else world))
    torch.set_num_threads(threads)
    check_timeout(options.timeout, "timeout")
    module = target.module
    refuse_lazy(module)
    device = _device(module, world, env)
    the_plan = plan(module, target.args, target.batch_dims, world)
    if options.loss is None:
        loss = MeanLoss(target.seed)
    else:
        where = target.marks("ddp", "loss") if target.marks else "loss"
        loss = UserLoss(options.loss, allow_import=allow_import, base_dir=target.base_dir, where=where)
        loss.load()  # a bad path or a refused import: exit 2 now, not in every rank
    job_args = map_args(target.args, lambda t: t.detach().cpu().requires_grad_(t.requires_grad))
    job = RankJob(build=build or _Given(_picklable(module)), state=None if build is None else _cpu_state(module),
                  mode=target.mode, args=job_args, plan=the_plan, loss=loss, options=options,
                  backend="nccl" if device == "cuda" else "gloo", device=device, seed=target.seed,
                  threads=threads, env={"OMP_NUM_THREADS": "1"})
    base = DdpReport(target=target.name, model=class_path(module), world_size=world, backend=job.backend,
                     device=device, launcher="torchrun" if env else "layerlab", batch=the_plan.batch,
                     batch_dims=dict(the_plan.dims), loss=loss.description,
                     options={"find_unused_parameters": options.find_unused_parameters,
                              "broadcast_buffers": options.broadcast_buffers, "timeout_s": options.timeout},
                     tolerance={})

    def driver():
        tell("one process: the whole batch and each shard")
        single = run_single(module, target.args, the_plan, loss, seed=target.seed)
        return job, single

    if env:
        return torchrun.run(env, job.backend, options.timeout, driver,
                            lambda job, single, results: _finish(base, module, single, results, options, loss, t0))
    job, single = driver()
    tell(f"{world} ranks of DistributedDataParallel ({job.backend})")
    from layerlab.distributed.launch import launch

    t1 = time.perf_counter()
    results = launch(job, world)
    base.seconds["ranks"] = time.perf_counter() - t1
    return _finish(base, module, single, results, options, loss, t0)


def _finish(base, module, single, results, options, loss, t0):
    from layerlab.distributed.assemble import assemble

    from layerlab.distributed.worker import shared_grads

    report = assemble(base, module, single, shared_grads(results), options.find_unused_parameters)
    report.seconds["single"] = single.seconds  # with the shard runs a finding asked for
    left_out = getattr(loss, "left_out", [])
    if left_out:
        report.notes.append(f"the default loss leaves out {', '.join(left_out)}: no dim of it splits with the batch")
    blocks = getattr(loss, "blockwise", {})
    if blocks:
        said = ", ".join(f"{p} (dims {', '.join(map(str, d))})" for p, d in blocks.items())
        report.notes.append(f"{said} split with the batch on several dims (a similarity of every sample with every "
                            "other): each rank computes only the pairs within its shard, so the default loss reads "
                            "the whole batch's the same way and leaves out the pairs across shards; a contrastive "
                            "loss trained under DDP sees only those negatives too unless it all_gathers the "
                            "embeddings")
    report.seconds["total"] = time.perf_counter() - t0
    return report


def _picklable(module: torch.nn.Module) -> torch.nn.Module:
    from layerlab.target.copying import picklable_copy

    twin = picklable_copy(module)
    for sub in twin.modules():  # transformers' capture hooks: local functions, reinstalled on the next forward
        keys = [k for k, hook in sub._forward_hooks.items() if _capture_hook(hook)]
        for hooks in (sub._forward_hooks, sub._forward_hooks_with_kwargs, sub._forward_hooks_always_called):
            for key in keys:
                hooks.pop(key, None)
        if getattr(sub, "_output_capturing_hooks_installed", False):
            sub._output_capturing_hooks_installed = False
    return twin


def _capture_hook(obj: Any) -> bool:
    """A forward hook transformers ≥ 5 installs on a model's first forward to collect hidden states: a
    local function (pickle refuses it) that the model installs again when it finds none."""
    return getattr(obj, "__name__", None) == "output_capturing_hook" and "<locals>" in getattr(obj, "__qualname__", "")


def _cpu_state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def _device(module: torch.nn.Module, world: int, env: Any) -> str:
    """``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per local rank): where the model is."""
    on_cuda = any(p.device.type == "cuda" for p in module.parameters())
    if not on_cuda:
        return "cpu"
    local = env.local_world if env else world
    have = torch.cuda.device_count()
    if have < local:
        raise UsageError(f"{local} ranks on CUDA need {local} GPUs (NCCL gives each rank its own), this machine "
                         f"has {have}", where="--nproc", expected=f"--nproc ≤ {have}", got=local,
                         hint="use --nproc " + str(max(have, 1)) + ", or --device cpu to check on gloo")
    return "cuda"
