"""What there is to run, and what the user probably meant: ``layerlab list`` and the hints that point to it.

:func:`catalog` lists the registry's layers (name, one-line summary, reference, tags) and the
example specs in ``configs/`` (path and ``name:``). ``configs/`` is looked for in the current folder
and next to the package (a source checkout); each is listed once. :func:`missing_hint` turns
"no spec file conv2d.yaml" into "there is configs/conv2d.yaml, and conv2d is a registry layer".

Reading a config for its ``name:`` goes through the spec loader's limits (:func:`read_spec_file`)
and never builds anything; an unreadable file is listed with its error instead of a name.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

__all__ = ["LayerItem", "ConfigItem", "Catalog", "catalog", "config_dirs", "missing_hint", "unknown_name_hint"]

LIST_HINT = "`layerlab list` shows the registry layers and the example specs"


@dataclass
class LayerItem:
    """A registry layer as listed: run it by ``name``."""

    name: str
    summary: str
    reference: Optional[str]
    tags: List[str] = field(default_factory=list)


@dataclass
class ConfigItem:
    """An example spec: run it by ``path``; ``title`` is its ``name:`` (``error`` if it cannot be read)."""

    path: str
    title: Optional[str]
    error: Optional[str] = None


@dataclass
class Catalog:
    """Everything ``layerlab list`` shows."""

    layers: List[LayerItem]
    configs: List[ConfigItem]


def config_dirs() -> List[Path]:
    """``configs/`` folders to look in: the current folder's, then the source checkout's (once each)."""
    here = Path.cwd() / "configs"
    repo = Path(__file__).resolve().parents[2] / "configs"
    out: List[Path] = []
    for d in (here, repo):
        if d.is_dir() and all(d.resolve() != o.resolve() for o in out):
            out.append(d)
    return out


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when it is below it, absolute otherwise."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else str(path.resolve())
    except ValueError:  # another drive (Windows)
        return str(path.resolve())


def _title(path: Path) -> ConfigItem:
    from layerlab.errors import LayerlabError
    from layerlab.spec.limits import clean_text
    from layerlab.spec.load import read_spec_file

    try:
        data, _ = read_spec_file(str(path))
    except LayerlabError as exc:
        return ConfigItem(_shown(path), None, error=exc.message)
    title = data.get("name") if isinstance(data, dict) else None
    return ConfigItem(_shown(path), clean_text(str(title)) if title is not None else None)


def catalog() -> Catalog:
    """The registry layers (sorted by name) and the example specs (``configs/*.yaml``, sorted)."""
    from layerlab import registry

    layers = [LayerItem(e.name, e.summary, e.reference, list(e.tags))
              for e in (registry.REGISTRY[n] for n in registry.names())]
    configs = [_title(p) for d in config_dirs() for p in sorted([*d.glob("*.yaml"), *d.glob("*.yml")])]
    return Catalog(layers, configs)


def missing_hint(text: str) -> str:
    """What to try when the spec file ``text`` is not there: an example spec of that name, the
    registry layer of that name, then ``layerlab list``."""
    from layerlab import registry

    name = Path(text).name
    tries = [_shown(d / name) for d in config_dirs() if (d / name).is_file()]
    entry = registry.find(Path(text).stem)
    if entry is not None:
        tries.append(f"the registry layer {entry.name} (give the name, no .yaml)")
    if not tries:
        looked = ", ".join(["the current folder", *(_shown(d) for d in config_dirs())])
        return f"no spec file called {name!r} in {looked}: check the path; {LIST_HINT}"
    return f"did you mean {' or '.join(tries)}? {LIST_HINT}"


def unknown_name_hint(text: str) -> str:
    """Did-you-mean among registry names (and example specs by stem) for a name that is neither."""
    from layerlab import registry

    close = difflib.get_close_matches(text.strip().lower().replace("-", "_"), registry.names(), n=3, cutoff=0.5)
    specs = [_shown(d / f"{text}.yaml") for d in config_dirs() if (d / f"{text}.yaml").is_file()]
    tries = [*map(repr, close), *specs]
    if tries:
        return f"did you mean {' or '.join(tries)}? {LIST_HINT}"
    return LIST_HINT
