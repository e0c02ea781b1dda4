"""What a spec may name without ``--allow-import``: things that build modules, found without calling anything.

A package prefix is not a safe allow-list: ``torch`` re-exports ``os`` (``torch:os.system``),
``torch:load`` unpickles, ``torch.hub:load`` imports a directory's ``hubconf.py`` and
``layerlab.spec:load_spec`` imports a ``.py``. So an import path reaches the object it names by
walking its attribute chain, and every hop is judged *before* anything is called:

* every part of the path is a plain public name: nothing starting with ``_`` (no ``__class__``,
  ``__globals__``, ``__builtins__``, ``__subclasses__``, no private module);
* the package is one of :data:`ML_PACKAGES`, imported from where it is installed: a directory
  named ``timm`` or ``transformers`` next to the spec (or in the working directory) is the spec
  author's code, and is refused;
* a module reached on the way must itself belong to one of those packages (``torch.os`` is the
  module ``os``) and not be one of :data:`LOADERS` (modules that load pickles, import, compile or
  spawn code);
* an attribute of a class is followed only when it is a vetted factory (``AutoModel.from_config``);
* the object named must be an ``nn.Module`` subclass or a Hugging Face config class defined in
  that package's model code (:data:`HOMES`), a vetted factory (:data:`FACTORIES`), or, where a
  callable is wanted (a ``{class: …}`` argument, a loss), a ``torch.nn.functional`` function.
  Its ``__module__`` must be a real module of the package that holds that very object (a
  re-export or a spoofed ``__module__`` is refused), and its ``__init__``/``__new__``/metaclass
  must be the package's own code (or CPython's). ``__init_subclass__`` never runs: nothing is
  subclassed.

The arguments are data, and some data makes a vetted builder load code or files: that is
:mod:`layerlab.spec.argument_safety`. With ``--allow-import`` none of this applies: the spec is
trusted like the user's own script.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Tuple

from layerlab.errors import SpecError

#: the packages whose model classes and vetted factories a spec may name without ``--allow-import``
ML_PACKAGES = ("torch", "torchvision", "transformers", "timm", "layerlab")

#: libraries whose code the ML packages build their classes with (transformers 5's configs get their
#: ``__init__`` from huggingface_hub's strict dataclasses): accepted as a class's constructor, never named
HELPERS = ("huggingface_hub",)

#: where (``__module__``) a class named without the flag may be defined: model code, not tooling
HOMES = {
    "torch": ("torch.nn", "torch.ao.nn"),
    "torchvision": ("torchvision.models", "torchvision.ops"),
    "transformers": ("transformers.models", "transformers.configuration_utils", "transformers.modeling_utils",
                     "transformers.pytorch_utils", "transformers.activations"),
    "timm": ("timm.models", "timm.layers"),
    "layerlab": ("layerlab.layers",),
}

#: modules of those packages that load pickles, import, compile or spawn code: never walked through
LOADERS = {
    "torch.hub": "imports a repository's hubconf.py and downloads code",
    "torch.package": "imports code from a package archive",
    "torch.jit": "loads and compiles TorchScript",
    "torch.serialization": "reads and writes pickle files (unpickling runs code)",
    "torch.utils.cpp_extension": "compiles and loads C++ code",
    "torch.utils.model_zoo": "downloads and unpickles files",
    "torch.compiler": "compiles code",
    "torch.fx": "generates and runs Python code",
    "torch.export": "loads and generates code",
    "torch.onnx": "writes and loads files",
    "torch.distributed": "starts processes and connects to other machines",
    "torch.multiprocessing": "starts processes",
    "torch.library": "registers operators",
    "torch.ops": "loads shared libraries",
    "torch.utils.data": "starts worker processes",
    "transformers.dynamic_module_utils": "imports code from a model repository",
    "layerlab.spec": "reads spec files and imports their code",
    "layerlab.cli": "runs commands",
    "layerlab.target": "reads spec files and imports their code",
}

#: vetted factories, by the ``(__module__, __qualname__)`` of their function: each returns a module
#: (or a config) from plain data, and :func:`check_arguments` refuses the data that would make it load
FACTORIES = {
    ("torch.nn.utils.parametrizations", "weight_norm"),
    ("torch.nn.utils.parametrizations", "spectral_norm"),
    ("torch.nn.utils.parametrizations", "orthogonal"),
    ("torch.nn.utils.weight_norm", "weight_norm"),
    ("torch.nn.utils.spectral_norm", "spectral_norm"),
    ("transformers.models.auto.auto_factory", "_BaseAutoModelClass.from_config"),
    ("transformers.models.auto.configuration_auto", "AutoConfig.for_model"),
    ("timm.models._factory", "create_model"),
    ("torchvision.models._api", "get_model"),
}


FIX = "pass --allow-import if you trust this file (allow_import=True in Python)"
_WITHOUT = ("without it a spec may name torch.nn classes, layerlab's layers, Hugging Face model and config "
            "classes, and vetted factories (torch.nn.utils.parametrizations:weight_norm, "
            "transformers:AutoModel.from_config, timm:create_model)")


@dataclass(frozen=True)
class Allowed:
    """An object a spec may name without the flag: what it is (``module``, ``config``, ``factory``,
    ``function``) and the path that reached it."""

    obj: Any
    kind: str
    path: str


class NotOurs(Exception):
    """The path is not into one of :data:`ML_PACKAGES`: the user's own code (needs the flag)."""


def split(text: str) -> Tuple[str, str]:
    """``module:attr.attr`` or ``pkg.mod.Attr`` → (module, attribute chain)."""
    text = text.strip()
    if ":" in text:
        module, _, attr = text.partition(":")
        return module, attr
    module, _, attr = text.rpartition(".")
    return module, attr


def is_ml_path(text: str) -> bool:
    """Does ``text`` read as a path into one of :data:`ML_PACKAGES` (not a ``.py`` file)?"""
    module, _ = split(str(text))
    parts = module.split(".")
    return not module.endswith(".py") and all(p.isidentifier() for p in parts) and parts[0] in ML_PACKAGES


def resolve(text: str, *, where: str, what: str, callable_ok: bool, base_dir: Optional[str] = None) -> Allowed:
    """The object the import path ``text`` names, if a spec may use it without ``--allow-import``.

    ``what`` names the role in messages (``layer``, ``class``); ``callable_ok``: a
    ``torch.nn.functional`` function and a config class are accepted too. Raises :class:`NotOurs`
    for a path outside :data:`ML_PACKAGES`, :class:`SpecError` for a refused one — before anything
    is called (only the package's own modules are imported)."""
    text = text.strip()
    module_name, attr = split(text)
    if not is_ml_path(text):
        raise NotOurs(text)

    def refuse(why: str, got: Any = None) -> SpecError:
        return SpecError(f"{what} {text!r} is refused without --allow-import: {why}", where=where, got=got,
                         hint=f"{FIX}; {_WITHOUT}")

    if not attr:
        raise SpecError(f"import path {text!r} names no class", where=where, hint="write module:Class")
    chain = attr.split(".")
    for part in module_name.split(".") + chain:
        if not part.isidentifier():
            raise refuse(f"{part!r} is not a Python name")
        if part.startswith("_"):
            raise refuse(f"{part!r} is a private or special attribute (such names reach interpreter internals)")
    loader = _loader(module_name)
    if loader is not None:
        raise refuse(f"{loader} {LOADERS[loader]}")
    module = _import_installed(module_name, base_dir, where, refuse)
    obj: Any = module
    walked = module_name
    for part in chain:
        if isinstance(obj, types.ModuleType):
            try:
                nxt = getattr(obj, part)
            except AttributeError:
                raise _no_attribute(walked, part, obj, where) from None
            if isinstance(nxt, types.ModuleType):
                _check_module_hop(nxt, f"{walked}.{part}", refuse)
        elif isinstance(obj, type):
            _check_identity(obj, walked, refuse)  # the class holding the factory is the package's own
            try:
                raw = inspect.getattr_static(obj, part)
            except AttributeError:
                raise _no_attribute(walked, part, obj, where) from None
            func = getattr(raw, "__func__", None) if isinstance(raw, (classmethod, staticmethod)) else None
            if func is None or _key(func) not in FACTORIES:
                raise refuse(f"{walked}.{part} is {_describe(raw)} of a class, not a factory layerlab has vetted "
                             "(AutoModel.from_config is one; from_pretrained loads files and code)")
            nxt = getattr(obj, part)
        else:
            raise refuse(f"{walked} is {_describe(obj)}, not a module or a class")
        obj, walked = nxt, f"{walked}.{part}"
    return Allowed(_classify(obj, walked, callable_ok, refuse, module_name), _kind_of(obj), text)


def _kind_of(obj: Any) -> str:
    if isinstance(obj, type):
        import torch.nn as nn

        return "module" if issubclass(obj, nn.Module) else "config"
    return "factory"


def _classify(obj: Any, walked: str, callable_ok: bool, refuse, module_name: str) -> Any:
    import torch.nn as nn

    if isinstance(obj, types.ModuleType):
        raise refuse(f"{walked} is a module, not a class or a function")
    if isinstance(obj, type):
        config = _is_hf_config(obj)
        if not (issubclass(obj, nn.Module) or config):
            raise refuse(f"{walked} is the class {_qualified(obj)}, neither an nn.Module nor a model config class")
        if config and not callable_ok:
            raise refuse(f"{walked} is a config class, not a layer (give it as {{class: …}} to a model's config:)")
        _check_home(obj, walked, refuse)
        _check_own_code(obj, walked, refuse)
        return obj
    func = getattr(obj, "__func__", obj)  # a bound classmethod: the function it wraps
    if isinstance(func, types.FunctionType) and _key(func) in FACTORIES:
        if not isinstance(getattr(obj, "__self__", None), type):  # a classmethod: its class was checked on the way
            _check_identity(func, walked, refuse)
        return obj
    if _torchvision_builder(func):
        return obj
    if callable_ok and module_name == "torch.nn.functional" and _functional(func):
        return obj
    loader = _loader(getattr(func, "__module__", None) or "")
    if loader is not None:
        raise refuse(f"{walked} is {_qualified(func)}: {loader} {LOADERS[loader]}")
    if callable(obj):
        raise refuse(f"{walked} is {_describe(obj)} ({_qualified(func)}), not a class that builds a module nor a "
                     "factory layerlab has vetted")
    raise refuse(f"{walked} is {_describe(obj)}, not a class or a function", got=type(obj).__name__)


def _functional(func: Any) -> bool:
    """A function of ``torch.nn.functional`` itself (not a helper it imports from elsewhere)."""
    module = getattr(func, "__module__", None)
    if isinstance(func, types.FunctionType):
        return module == "torch.nn.functional"
    return isinstance(func, types.BuiltinFunctionType) and module in ("torch", "torch._C._nn")


def _torchvision_builder(func: Any) -> bool:
    """A model builder torchvision registers (``torchvision.models:resnet18``)."""
    module = getattr(func, "__module__", None) or ""
    if not (isinstance(func, types.FunctionType) and module.startswith("torchvision.models")):
        return False
    try:
        import torchvision.models as tvm

        return func.__name__ in tvm.list_models() and _defined_as(func)
    except Exception:
        return False


def _is_hf_config(cls: type) -> bool:
    return any(base.__name__ in ("PretrainedConfig", "PreTrainedConfig")
               and base.__module__ == "transformers.configuration_utils" for base in cls.__mro__)


def _key(func: Any) -> Tuple[str, str]:
    """``(module, qualname)`` of a function; the module is where its code is (its globals), not the
    ``__module__`` it claims."""
    globals_ = getattr(func, "__globals__", None)
    module = globals_.get("__name__") if isinstance(globals_, dict) else getattr(func, "__module__", None)
    return module or "", getattr(func, "__qualname__", None) or ""


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None) or '?'}.{getattr(obj, '__qualname__', None) or type(obj).__name__}"


def _describe(obj: Any) -> str:
    if isinstance(obj, (classmethod, staticmethod)):
        return f"a {type(obj).__name__}"
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return "a function"
    if isinstance(obj, type):
        return f"the class {obj.__name__}"
    return f"a {type(obj).__name__} value"


def _top(name: str) -> str:
    return name.partition(".")[0]


def _loader(module_name: str) -> Optional[str]:
    return next((m for m in LOADERS if module_name == m or module_name.startswith(m + ".")), None)


def _check_module_hop(module: types.ModuleType, walked: str, refuse) -> None:
    name = getattr(module, "__name__", "") or ""
    if _top(name) not in ML_PACKAGES:
        raise refuse(f"{walked} is the module {name!r}, which {_top(walked)} imports: it is not part of "
                     f"{_top(walked)}")
    if any(p.startswith("_") for p in name.split(".")):
        raise refuse(f"{walked} is the private module {name!r}")
    loader = _loader(name)
    if loader is not None:
        raise refuse(f"{walked} {LOADERS[loader]}" if walked == name else f"{walked} is {name}, which {LOADERS[loader]}")


def _check_home(cls: type, walked: str, refuse) -> None:
    module = getattr(cls, "__module__", "") or ""
    homes = HOMES.get(_top(module), ())
    if not any(module == h or module.startswith(h + ".") for h in homes):
        where = " or ".join(h for hs in HOMES.values() for h in hs)
        raise refuse(f"{walked} is {_qualified(cls)}, defined outside the model code of {', '.join(ML_PACKAGES)} "
                     f"({where})")
    _check_identity(cls, walked, refuse)


def _defined_as(obj: Any) -> bool:
    """Does ``obj.__module__`` really hold ``obj`` at ``obj.__qualname__`` (no re-export, no spoofed name)?"""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    qualname = getattr(obj, "__qualname__", None) or ""
    if module is None or "<locals>" in qualname or not qualname:
        return False
    found: Any = module
    for part in qualname.split("."):
        try:
            found = inspect.getattr_static(found, part)
        except AttributeError:
            return False
    found = getattr(found, "__func__", found)
    return found is obj


def _check_identity(obj: Any, walked: str, refuse) -> None:
    if not _defined_as(obj):
        raise refuse(f"{walked} claims to be {_qualified(obj)}, but that module does not define it there")


def _own_code(fn: Any) -> bool:
    """Is ``fn`` (an ``__init__``, ``__new__`` or metaclass) the ML package's own code or CPython's?"""
    fn = getattr(fn, "__func__", fn)
    if isinstance(fn, (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodWrapperType,
                       types.BuiltinMethodType)):
        return True
    if not isinstance(fn, types.FunctionType):
        return False
    module = fn.__globals__.get("__name__", "") or ""  # where the code is, whatever functools.wraps copied
    if module in ("warnings", "typing_extensions") and _own_code(getattr(fn, "__wrapped__", None)):
        return True  # @deprecated's __new__: warns, then calls the class's own
    return _top(module) in ML_PACKAGES + HELPERS


def _check_own_code(cls: type, walked: str, refuse) -> None:
    meta = type(cls)
    if meta not in (type, abc.ABCMeta) and _top(getattr(meta, "__module__", "") or "") not in ML_PACKAGES:
        raise refuse(f"{walked} has the metaclass {_qualified(meta)}, code outside {', '.join(ML_PACKAGES)}")
    for name in ("__init__", "__new__", "__call__"):
        target = meta if name == "__call__" else cls
        try:
            fn = inspect.getattr_static(target, name)
        except AttributeError:
            continue
        if not _own_code(fn):
            raise refuse(f"{walked}.{name} is {_qualified(getattr(fn, '__func__', fn))}, code outside "
                         f"{', '.join(ML_PACKAGES)}")


def _no_attribute(walked: str, part: str, obj: Any, where: str) -> SpecError:
    import difflib

    names = [n for n in dir(obj) if not n.startswith("_")] if isinstance(obj, types.ModuleType) else []
    close = difflib.get_close_matches(part, names, n=3)
    return SpecError(f"{walked!r} has no attribute {part!r}", where=where,
                     hint=("did you mean " + " or ".join(map(repr, close)) + "?") if close else None)


def _import_installed(module_name: str, base_dir: Optional[str], where: str, refuse) -> types.ModuleType:
    """Import ``module_name`` from the installed package, never from the spec's or the working directory."""
    top = _top(module_name)
    if top not in sys.modules:
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise SpecError(f"{top!r} is not installed" + ("" if module_name == top else f", so {module_name!r} "
                            "cannot be imported"),
                            where=where, hint=f"pip install {top}")
        location = found.origin if found.origin not in (None, "namespace") else next(
            iter(found.submodule_search_locations or []), None)
        if location is None or _local(Path(location), base_dir):
            raise refuse(f"{top!r} here is {location}, a local copy next to the spec or in the working directory, "
                         f"not the installed package")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == top and exc.name != top:
            raise SpecError(f"{top!r} has no module {exc.name!r}", where=where,
                            hint="check the module path before the ':'") from None
        raise
    _check_module_hop(module, module_name, refuse)
    return module


def _local(location: Path, base_dir: Optional[str]) -> bool:
    """Is the package at ``location`` a directory (or file) placed in the working or the spec's directory?"""
    parent = location.resolve().parent
    if location.name == "__init__.py":
        parent = parent.parent
    local = {Path(os.getcwd()).resolve()}
    if base_dir:
        local.add(Path(base_dir).resolve())
    return parent in local


__all__ = ["Allowed", "FACTORIES", "FIX", "HOMES", "LOADERS", "ML_PACKAGES", "NotOurs", "is_ml_path", "resolve",
           "split"]
