"""The run manifest: what a report was made with, so that two runs can be compared.

Every ``--json`` report carries one under the key ``"manifest"`` (added by the CLI's one output
sink, :meth:`layerlab.cli.output.Output.json`, so every command has it without work of its own), and
``layerlab diff`` shows where two manifests differ next to where the results do. In Python,
:func:`manifest` makes one for a module, a spec and a seed of your own.

What it records, and why each one can change a result::

    layerlab, torch, cuda, python, platform   the code that computed (kernels change between versions)
    device, gpu                               where it ran (cpu, cuda:0 and the GPU's name)
    dtype                                     the floating dtype of the module (first floating parameter)
    threads                                   torch's intra-op threads (reduction order → last bits)
    seed                                      the seed weights and inputs were drawn with
    deterministic                             torch.use_deterministic_algorithms and cuDNN's settings
    spec                                      the spec file's path as given and the sha256 of its bytes
    target, command                           what was named, and the command line
    layers                                    for ``--all``: the registry layers run, in order

Fields nobody can know are ``null``: ``seed``/``dtype``/``spec`` for ``list`` and ``explain-shape``
(no model), ``threads``/``deterministic`` when the command never loaded torch. A ``--all`` run
(``gradcheck --all``, ``export-check --all``) records its seed, ``target: "--all"`` and ``layers``;
it has no spec file (``spec: null``) and no one dtype (each layer has its own). This module never
imports torch: ``explain-shape`` and ``--help`` stay torch-free, so the torch version then comes
from the installed package's metadata (the same string as ``torch.__version__``).

Why the name is not ``manifest.py``: ``layerlab.manifest`` is the public function; a submodule of
that name would replace it as an attribute of the package the moment it is imported.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from layerlab._version import __version__

__all__ = ["MANIFEST_SCHEMA", "manifest", "cli_manifest", "begin_run", "remember_target", "remember_selection"]

#: Bumped only when a manifest key is removed or changes meaning.
MANIFEST_SCHEMA = 1


@dataclass
class _Run:
    """What the CLI learned about the command now running (one process runs one command; the
    in-process test runner starts each with :func:`begin_run`)."""

    argv: Optional[List[str]] = None
    targets: List[Dict[str, Any]] = field(default_factory=list)
    selection: Optional[Dict[str, Any]] = None


_RUN = _Run()


def begin_run(argv: Sequence[str]) -> None:
    """A new command line starts: forget the previous command's targets."""
    global _RUN
    _RUN = _Run(argv=["layerlab", *argv])


def remember_target(text: str, target: Any) -> None:
    """Record the target a command built (from ``layerlab.cli.target_arg.resolve``): its spec file
    (path and hash), seed, dtype and device, read off the built module and inputs."""
    from layerlab.target.build import is_spec_path

    dtype, device = _dtype_device(target.module, target.values())
    _RUN.targets.append({
        "target": text, "spec": spec_facts(text) if is_spec_path(text) else None,
        "seed": target.seed, "dtype": dtype, "device": device,
    })


def remember_selection(named: str, layers: Sequence[str], seed: int, device: Any = None) -> None:
    """Record a run over many registry layers (``--all``): what was named, the layers in the order
    they ran, the seed every one was built with and, when the command set one, the device."""
    _RUN.selection = {"target": named, "layers": list(layers), "seed": seed,
                      "device": str(device) if device is not None else None}


def spec_facts(path: Any) -> Optional[Dict[str, str]]:
    """``{"path": as given, "sha256": of the file's bytes}``; ``None`` when it cannot be read."""
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
    return {"path": str(path), "sha256": digest}


def cli_manifest() -> Dict[str, Any]:
    """The manifest of the command now running (what :func:`remember_target` recorded)."""
    targets = _RUN.targets
    first = targets[0] if targets else {}
    chosen = _RUN.selection or {}
    m = _environment(device=first.get("device", chosen.get("device")))
    m.update(dtype=first.get("dtype"), seed=first.get("seed", chosen.get("seed")), spec=first.get("spec"),
             target=first.get("target", chosen.get("target")), command=list(_RUN.argv or ["layerlab", *sys.argv[1:]]))
    if chosen:
        m["layers"] = list(chosen["layers"])
    if len({t["target"] for t in targets}) > 1:  # a command that built several: all of them, in order
        m["targets"] = [dict(t) for t in targets]
    return m


def manifest(spec: Any = None, *, module: Any = None, inputs: Sequence[Any] = (), seed: Optional[int] = None,
             dtype: Any = None, device: Any = None, command: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The manifest of a run of your own, as ``--json`` reports carry it (a plain dict).

    Args:
        spec (str or Path, optional): the spec file the run was built from (path and sha256 recorded).
        module (nn.Module, optional): the model; its dtype and device are read off its first floating
            parameter (or of ``inputs``) unless ``dtype``/``device`` are given.
        inputs (sequence, optional): the forward inputs (for a module without parameters).
        seed (int, optional): the seed weights and inputs were drawn with.
        dtype, device (optional): what to record when there is no module to read them from.
        command (sequence of str, optional): the command line; default ``sys.argv``.

    Example::

        >>> m = layerlab.manifest(module=torch.nn.Linear(4, 2), seed=0)
        >>> m["dtype"], m["device"], m["threads"] == torch.get_num_threads()
        ('float32', 'cpu', True)
    """
    found_dtype, found_device = _dtype_device(module, list(inputs)) if module is not None or inputs else (None, None)
    device = str(device) if device is not None else found_device
    m = _environment(device=device)
    m.update(dtype=str(dtype).replace("torch.", "") if dtype is not None else found_dtype, seed=seed,
             spec=spec_facts(spec) if spec is not None else None,
             target=str(spec) if spec is not None else (type(module).__name__ if module is not None else None),
             command=list(command) if command is not None else list(sys.argv))
    return m


def _environment(device: Optional[str]) -> Dict[str, Any]:
    """The facts of this process: versions, platform, threads, determinism, the GPU's name."""
    torch = sys.modules.get("torch")  # only if the command loaded it: never imported here
    env: Dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "layerlab": __version__,
        "torch": getattr(torch, "__version__", None) or _installed_version("torch"),
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "gpu": _gpu_name(torch, device),
        "threads": torch.get_num_threads() if torch is not None else None,
        "deterministic": _determinism(torch),
    }
    return env


def _installed_version(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _determinism(torch: Any) -> Optional[Dict[str, bool]]:
    if torch is None:
        return None
    cudnn = torch.backends.cudnn
    return {
        "algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "cudnn_benchmark": bool(cudnn.benchmark),
    }


def _gpu_name(torch: Any, device: Optional[str]) -> Optional[str]:
    if torch is None or device is None or not str(device).startswith("cuda"):
        return None
    try:
        return torch.cuda.get_device_name(torch.device(device))
    except Exception:  # a device string torch cannot open here: the manifest still says "cuda:N"
        return None


def _dtype_device(module: Any, values: Sequence[Any]):
    """The dtype and device the run computed in: of the module's first floating parameter or
    buffer, else of its first floating tensor input; ``(None, None)`` when there is none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    tensors: List[Any] = []
    if module is not None and hasattr(module, "parameters"):
        tensors += list(module.parameters()) + list(module.buffers())
    tensors += [v for v in _flat(values) if isinstance(v, torch.Tensor)]
    for t in tensors:
        if t.is_floating_point() or t.is_complex():
            return str(t.dtype).replace("torch.", ""), str(t.device)
    if tensors:
        return None, str(tensors[0].device)
    return None, None


def _flat(values: Any) -> List[Any]:
    out: List[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out += _flat(v)
        elif isinstance(v, dict):
            out += _flat(list(v.values()))
        else:
            out.append(v)
    return out
