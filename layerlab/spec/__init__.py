"""YAML specs: load, check and build a layer or a block and its inputs.

    >>> from layerlab.spec import load_spec, build
    >>> spec = load_spec("configs/conv2d.yaml")
    >>> built = build(spec)
    >>> report = layerlab.inspect(built.module, *built.args, mode=built.mode, **built.kwargs)

Everything is checked before anything is built: YAML syntax (line and column), key names, layer
names and constructor arguments (did-you-mean), value types, inputs against ``forward``, and the
limits of :mod:`layerlab.spec.limits` (file size, aliases, nesting, ``repeat:``, sizes, memory).
Errors are :class:`~layerlab.errors.SpecError` (exit 2) naming ``file:line:col``; whatever they
echo from the spec is made terminal-safe. Reading and building a spec never
runs code it chooses: without ``allow_import=True`` (``--allow-import``) an import path may name
only the model classes, config classes and vetted factories of torch, torchvision, transformers,
timm and layerlab, found without calling anything, and arguments that would make them fetch or run
code are refused (:mod:`~layerlab.spec.allowlist`); anything else — the user's own files included —
needs the flag.

What a spec can say beyond ``layer:`` + ``args:`` (details in the modules named):

* ``build: ./models.py:make_model`` (same as ``layer:``): a factory — any callable returning an
  ``nn.Module`` with the flag; without it a vetted one, e.g. ``torchvision.models:resnet18`` or
  ``transformers:AutoModel.from_config`` (:mod:`~layerlab.spec.resolve`);
* an argument ``{class: transformers:GPT2Config, args: {n_layer: 2}}`` is built first, recursively
  (:mod:`~layerlab.spec.objects`);
* inputs ``{value: [[1, 0]]}``, ``{file: ids.npy}``, ``{padding_mask: {lengths: [7, 5], convention:
  keep | ignore}}``, ``{tuple: [{shape: …}, {shape: …}]}`` / ``list`` / ``dict``
  (:mod:`~layerlab.spec.input_values`);
* ``build(spec, meta=True)`` / ``Overrides(meta=True)``: the model on torch's meta device
  (:mod:`~layerlab.spec.build`). The model is cast only to a dtype the spec (or ``--dtype``) names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from layerlab.spec.build import Built, build
from layerlab.spec.limits import clean_errors
from layerlab.spec.load import Marks, parse_yaml, read_spec_file
from layerlab.spec.schema import Spec
from layerlab.spec.validate import Overrides, validate

__all__ = ["Built", "Overrides", "Spec", "build", "load_spec", "spec_from_registry", "parse_spec_text"]


def load_spec(path: str, *, allow_import: bool = False, overrides: Optional[Overrides] = None) -> Spec:
    """Read, parse and check the spec file at ``path``."""
    with clean_errors():
        data, marks = read_spec_file(str(path))
        return validate(data, marks, allow_import=allow_import, base_dir=str(Path(path).resolve().parent),
                        overrides=overrides)


def parse_spec_text(text: str, *, filename: str = "<spec>", allow_import: bool = False,
                    overrides: Optional[Overrides] = None) -> Spec:
    """Like :func:`load_spec` for YAML text."""
    with clean_errors():
        data, marks = parse_yaml(text, filename)
        return validate(data, marks, allow_import=allow_import, overrides=overrides)


def spec_from_registry(name: str, *, overrides: Optional[Overrides] = None) -> Spec:
    """A spec for the registry layer ``name`` with its default arguments and inputs."""
    from layerlab import registry

    entry = registry.get(name)
    data = {"layer": entry.name, "args": dict(entry.args), "inputs": dict(entry.inputs)}
    with clean_errors():
        return validate(data, Marks.none(f"registry:{entry.name}"), overrides=overrides)
