"""``layerlab ddp-check``: the DistributedDataParallel step against one process, on torch.distributed.

* :mod:`~layerlab.distributed.run`: :func:`ddp_check` and :func:`check_target` (the entry points).
* :mod:`~layerlab.distributed.options`: the spec's ``ddp:`` section and the arguments.
* :mod:`~layerlab.distributed.shard`: the batch split across ranks; :mod:`~layerlab.distributed.loss`:
  the loss both sides minimise; :mod:`~layerlab.distributed.step`: one recorded step.
* :mod:`~layerlab.distributed.single`: the single-process runs; :mod:`~layerlab.distributed.worker`:
  one rank; :mod:`~layerlab.distributed.launch`: starting and stopping ranks here, which read their
  job from :mod:`~layerlab.distributed.transport`'s file; :mod:`~layerlab.distributed.torchrun`:
  being one rank under torchrun (joining through :mod:`~layerlab.distributed.rendezvous`).
* :mod:`~layerlab.distributed.compare` (gradients) and :mod:`~layerlab.distributed.checks` (ranks,
  unused parameters, buffers, shapes), :mod:`~layerlab.distributed.first_step` (DDP's first step under
  the user's find_unused_parameters=False) → :mod:`~layerlab.distributed.assemble` →
  :mod:`~layerlab.distributed.report`.

Dependencies: cli → distributed → (checks.layout, target, spec) → errors. Importing the package
imports nothing; its modules import torch.
"""
