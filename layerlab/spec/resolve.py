"""Layer names in a spec → the class to build.

A name is looked up in this order:

1. ``nn.X`` / ``torch.nn.X``: that torch.nn class;
2. an import path (``my_layers:Gate``, ``pkg.mod.Gate``, ``./file.py:Gate``). Without
   ``allow_import`` (``--allow-import``) only paths into torch, torchvision, transformers, timm and
   layerlab resolve, and only to what :mod:`layerlab.spec.allowlist` accepts: an ``nn.Module``
   class of their model code, a Hugging Face config class (as a ``{class: …}`` argument), or a
   vetted factory such as ``torch.nn.utils.parametrizations:weight_norm`` or
   ``transformers:AutoModel.from_config`` — found by walking the path without calling anything,
   so ``torch:os.system``, ``torch:load`` or ``torch.hub:load`` are refused before they run. Any
   other path is the user's own code: importing it runs it, so it needs the flag. With the flag
   the path may name an ``nn.Module`` class or any *factory*: a callable whose result must be an
   ``nn.Module`` (checked when it is built: :func:`layerlab.spec.build.build`);
3. a torch.nn class name as torch spells it (``Conv2d``, ``GRU``, ``TransformerEncoderLayer``);
4. a layerlab registry name (``conv2d``, ``multihead_attention``; case, ``-`` and ``_`` ignored):
   layerlab's reference layer;
5. a torch.nn class ignoring case, ``_`` and ``-`` (``relu``, ``maxpool2d``, ``batch_norm2d``).

So ``conv2d`` is layerlab's convolution and ``Conv2d`` torch's. Unknown names get a
did-you-mean over both tables.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from layerlab.errors import SpecError
from layerlab.spec import allowlist


@dataclass(frozen=True)
class Resolved:
    """A resolved layer: the class, and where it came from (``torch``, ``registry``, ``import``)."""

    cls: type
    kind: str
    name: str
    #: ``cls`` is a factory (a callable that returns the module), not an ``nn.Module`` class
    factory: bool = False


def _torch_modules() -> Dict[str, type]:
    import torch.nn as nn

    table = {}
    for attr in dir(nn):
        obj = getattr(nn, attr)
        if isinstance(obj, type) and issubclass(obj, nn.Module) and not attr.startswith("_"):
            table[attr] = obj
    return table


def _fold(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def is_import_path(name: str) -> bool:
    """``mod:Class``, ``pkg.mod.Class`` or ``file.py:Class`` (and not an ``nn.``/``torch.`` name)."""
    stripped = name.strip()
    if stripped.startswith(("nn.", "torch.")):
        return False
    return ":" in stripped or "." in stripped


#: packages whose model classes and vetted factories need no ``allow_import`` (see :mod:`layerlab.spec.allowlist`)
TRUSTED_PACKAGES = allowlist.ML_PACKAGES


def is_trusted(text: str) -> bool:
    """May a spec name ``text`` without ``--allow-import``? Only what :mod:`~layerlab.spec.allowlist`
    accepts as a callable (a model or config class, a vetted factory, a torch.nn.functional function);
    nothing is called to decide, and a path into anything else (``torch:os.system``) is not trusted."""
    try:
        allowlist.resolve(str(text), where="", what="name", callable_ok=True)
    except Exception:  # refused, not ours, missing, or broken: not trusted
        return False
    return True


def resolve_layer(name: str, *, where: str, allow_import: bool = False, base_dir: Optional[str] = None) -> Resolved:
    """The class (or factory) named ``name`` (see the module docstring for the order); :class:`SpecError` if none."""
    from layerlab import registry

    text = str(name).strip()
    torch_table = _torch_modules()
    if ":" in text and allowlist.is_ml_path(text):  # torch.nn.utils.parametrizations:weight_norm
        return _import_path(text, where=where, allow_import=allow_import, base_dir=base_dir)
    if text.startswith(("torch.nn.", "nn.")):
        attr = text.split(".")[-1]
        if attr in torch_table:
            return Resolved(torch_table[attr], "torch", f"nn.{attr}")
        _unknown(text, where, torch_table, registry.names())
    if is_import_path(text):
        return _import_path(text, where=where, allow_import=allow_import, base_dir=base_dir)
    if text in torch_table:
        return Resolved(torch_table[text], "torch", f"nn.{text}")
    entry = registry.find(text)
    if entry is not None:
        return Resolved(entry.load(), "registry", entry.name)
    folded = {_fold(k): k for k in torch_table}
    if _fold(text) in folded:
        attr = folded[_fold(text)]
        return Resolved(torch_table[attr], "torch", f"nn.{attr}")
    _unknown(text, where, torch_table, registry.names())
    raise AssertionError("unreachable")  # pragma: no cover


def _unknown(text: str, where: str, torch_table: Dict[str, type], registry_names: List[str]) -> None:
    candidates: Dict[str, List[str]] = {}
    for name in [*torch_table, *registry_names]:
        candidates.setdefault(_fold(name), []).append(name)
    key = _fold(text.split(".")[-1])
    close = [n for c in difflib.get_close_matches(key, list(candidates), n=3, cutoff=0.6) for n in candidates[c]]
    raise SpecError(
        f"unknown layer {text!r}",
        where=where,
        expected="a layerlab name (layerlab list), a torch.nn class (Conv2d, nn.GRU) or an import path",
        got=text,
        hint=("did you mean " + " or ".join(map(repr, close[:4])) + "?") if close else
        "see `layerlab list` for layerlab's layers; torch.nn classes are spelled as in torch",
    )


def _import_path(text: str, *, where: str, allow_import: bool, base_dir: Optional[str],
                 any_callable: bool = False) -> Resolved:
    """An import path: anything with ``allow_import``; without it, what the allow-list accepts."""
    if allow_import:
        return _import(text, where=where, allow_import=True, base_dir=base_dir, any_callable=any_callable)
    what = "class" if any_callable else "layer"
    try:
        allowed = allowlist.resolve(text, where=where, what=what, callable_ok=any_callable, base_dir=base_dir)
    except allowlist.NotOurs:  # the user's own code (or another package): refused below
        return _import(text, where=where, allow_import=False, base_dir=base_dir, any_callable=any_callable)
    return Resolved(allowed.obj, "import", text, factory=not isinstance(allowed.obj, type))


def _import(text: str, *, where: str, allow_import: bool, base_dir: Optional[str],
            any_callable: bool = False) -> Resolved:
    if not allow_import:
        raise SpecError(
            f"{'class' if any_callable else 'layer'} {text!r} is an import path: importing it runs its code, and a spec file never does "
            "that by itself",
            where=where,
            hint="pass --allow-import if you trust this file (layerlab.load_spec(..., allow_import=True) in Python); "
                 "without it, paths into torch, transformers, timm, torchvision and layerlab may name their model "
                 "classes and vetted factories",
        )
    module_part, sep, attr = text.partition(":") if ":" in text else text.rpartition(".")
    if not attr:
        raise SpecError(f"import path {text!r} names no class", where=where, hint="write module:Class")
    try:
        module = _import_module(module_part, base_dir)
    except SpecError:
        raise
    except Exception as exc:
        from layerlab.spec.objects import import_site

        raise SpecError(
            f"importing {module_part!r} failed at {import_site(exc)}: {type(exc).__name__}: {exc}", where=where,
            hint="the module must be importable from the current directory or the spec's directory",
        ) from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            raise SpecError(
                f"{module_part!r} has no attribute {part!r}", where=where,
                hint=("did you mean " + " or ".join(map(repr, close)) + "?") if close else None,
            )
        obj = getattr(obj, part)
    if any_callable:
        if not callable(obj):
            raise SpecError(f"{text!r} is not a class or a callable: it is {_kind(obj)}", where=where,
                            got=type(obj).__name__, hint="class: names what to call with args:")
        return Resolved(obj, "import", text, factory=not isinstance(obj, type))
    import torch.nn as nn

    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return Resolved(obj, "import", text)
    if isinstance(obj, type) or not callable(obj):
        raise SpecError(
            f"{text!r} is not an nn.Module class nor a factory: it is {_kind(obj)}", where=where,
            expected="an nn.Module class, or a callable (function, classmethod) that returns an nn.Module",
            got=type(obj).__name__,
            hint="name the model's class (transformers:GPT2Model) or the function that makes it "
                 "(torchvision.models:resnet18, ./models.py:make_model)",
        )
    return Resolved(obj, "import", text, factory=True)


def resolve_callable(name: str, *, where: str, allow_import: bool = False, base_dir: Optional[str] = None) -> Resolved:
    """What a ``{class: …}`` argument names: any class or callable by import path, else a layer name.

    Unlike :func:`resolve_layer`, an import path may name any class (``transformers:GPT2Config``) with
    ``allow_import``; without it, a model or config class, a vetted factory or a ``torch.nn.functional``
    function (:mod:`layerlab.spec.allowlist`).
    """
    text = str(name).strip()
    if (is_import_path(text) and not text.startswith(("nn.", "torch."))) or (":" in text and allowlist.is_ml_path(text)):
        return _import_path(text, where=where, allow_import=allow_import, base_dir=base_dir, any_callable=True)
    return resolve_layer(text, where=where, allow_import=allow_import, base_dir=base_dir)


def _kind(obj) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__name__}, not an nn.Module subclass"
    return f"a {type(obj).__name__} value"


def _import_module(module_part: str, base_dir: Optional[str]):
    if module_part.endswith(".py"):
        path = Path(module_part)
        if not path.is_absolute() and base_dir:
            path = Path(base_dir) / path
        if not path.exists():
            raise SpecError(f"no such file: {path}", hint="a file path is relative to the spec's directory")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
        return module
    extra = [p for p in (str(Path.cwd()), base_dir) if p and p not in sys.path]
    sys.path[:0] = extra
    try:
        return importlib.import_module(module_part)
    finally:
        for p in extra:
            sys.path.remove(p)
