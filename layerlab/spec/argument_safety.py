"""Arguments that would make a vetted builder fetch or run code: refused without ``--allow-import``.

A spec without the flag may call only the model classes, config classes and factories that
:mod:`layerlab.spec.allowlist` accepts — but their arguments are the spec's data, and some data
turns them into loaders: ``trust_remote_code: true`` or an ``auto_map`` makes
``AutoModel.from_config`` import a repository's Python file, an ``attn_implementation`` naming a
Hub repository downloads a compiled kernel, ``pretrained: true`` / ``weights:`` /
``use_pretrained_backbone`` download weights, a timm name ``hf-hub:…`` / ``local-dir:…`` fetches a
model. :func:`check_arguments` refuses :data:`LOADING_ARGUMENTS` under any key at any depth of a
layer's arguments (nested ``{class: …}`` objects included) and :data:`SOURCES` in any string, with
the ``file:line:col`` of the value. layerlab builds models from their config, with random weights.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from layerlab.errors import SpecError
from layerlab.spec.allowlist import FIX


def _truthy(value: Any) -> bool:
    return bool(value) and value not in ("false", "False", "0", "no")


def _hub_kernel(value: Any) -> bool:
    return isinstance(value, str) and ("/" in value or ":" in value)


#: argument names (at any depth) whose value makes a vetted builder import code, download or read files
LOADING_ARGUMENTS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "trust_remote_code": (_truthy, "runs the Python code of a model repository"),
    "auto_map": (lambda v: v is not None, "points a config at a model repository's own Python code"),
    "code_revision": (lambda v: v is not None, "picks the revision of a model repository's Python code"),
    "use_kernels": (_truthy, "downloads and loads compiled kernels from the Hugging Face Hub"),
    "kernel_config": (lambda v: v is not None, "downloads and loads compiled kernels from the Hugging Face Hub"),
    "attn_implementation": (_hub_kernel, "names a kernel on the Hugging Face Hub, downloaded and loaded"),
    "_attn_implementation": (_hub_kernel, "names a kernel on the Hugging Face Hub, downloaded and loaded"),
    "use_pretrained_backbone": (_truthy, "downloads and loads a backbone's weights"),
    "backbone_kwargs": (lambda v: bool(v), "is passed to a backbone's from_pretrained"),
    "pretrained": (_truthy, "downloads and loads weights"),
    "weights": (lambda v: v is not None and v is not False, "downloads and loads weights"),
    "weights_backbone": (lambda v: v is not None and v is not False, "downloads and loads weights"),
    "checkpoint_path": (lambda v: bool(v), "loads a checkpoint file"),
    "pretrained_cfg": (lambda v: v is not None, "may point at weights to load"),
    "pretrained_cfg_overlay": (lambda v: v is not None, "may point at a file to load"),
}


def check_arguments(args: list, kwargs: dict, marks: Callable[..., str], path: tuple, *, factory: str = "") -> None:
    """Refuse :data:`LOADING_ARGUMENTS` anywhere in a layer's arguments (``args`` / ``kwargs`` as written at
    ``path``), and a timm model name that points at the Hub or a directory (``factory``: the layer's path)."""
    if factory.endswith("create_model"):
        _check_timm_name(kwargs or args, marks, path)
    stack = [(a, path + (i,)) for i, a in enumerate(args)] + [(kwargs, path)]
    for i, a in enumerate(args):
        _check_source(a, marks, path + (i,))
    seen = set()
    while stack:
        v, at = stack.pop()
        if id(v) in seen:  # a YAML alias: the same data, already checked
            continue
        if isinstance(v, (dict, list)):
            seen.add(id(v))
        if isinstance(v, dict):
            for k, item in v.items():
                rule = LOADING_ARGUMENTS.get(k) if isinstance(k, str) else None
                if rule is not None and rule[0](item):
                    raise SpecError(
                        f"argument {k}: {item!r} is refused without --allow-import: it {rule[1]}",
                        where=marks(*at, k), got=item, hint=f"{FIX}; or remove {k}: (layerlab builds a "
                        "model from its config, with random weights)")
                stack.append((item, at + (k,)))
                _check_source(item, marks, at + (k,))
            if isinstance(v.get("class"), str) and v["class"].strip().endswith("create_model"):
                _check_timm_name(v.get("args"), marks, at + ("args",))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                stack.append((item, at + (i,)))
                _check_source(item, marks, at + (i,))


#: a string value in these forms names a place timm (and transformers' timm wrappers) fetch models from
SOURCES = ("hf-hub:", "hf_hub:", "local-dir:")


def _check_source(value: Any, marks: Callable[..., str], at: tuple) -> None:
    if isinstance(value, str) and value.strip().lower().startswith(SOURCES):
        raise SpecError(f"value {value!r} is refused without --allow-import: it names the Hugging Face Hub or a "
                        "directory, whose files a model builder would download or read", where=marks(*at),
                        got=value, hint=f"{FIX}; or name an architecture (resnet18)")


def _check_timm_name(args: Any, marks: Callable[..., str], at: tuple) -> None:
    """timm's ``create_model('hf-hub:…' | 'local-dir:…')`` downloads or reads a directory: refused."""
    name, where = None, marks(*at)
    if isinstance(args, dict):
        name, where = args.get("model_name"), marks(*at, "model_name")
    elif isinstance(args, list) and args:
        name, where = args[0], marks(*at, 0)
    elif isinstance(args, str):
        name = args
    if isinstance(name, str) and (":" in name or "/" in name):
        raise SpecError(f"model name {name!r} is refused without --allow-import: it points at the Hugging Face "
                        "Hub or a directory, whose files would be downloaded or read", where=where, got=name,
                        hint=f"{FIX}; or name an architecture (resnet18)")


__all__ = ["LOADING_ARGUMENTS", "SOURCES", "check_arguments"]
