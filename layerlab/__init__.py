"""layerlab: make PyTorch layers stop being black boxes.

The public API is imported lazily so ``import layerlab`` (and ``layerlab --help``) never
imports torch; each name loads its module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from layerlab._version import __version__

#: public name -> "module:attribute"
_LAZY = {
    "explain_shape": "layerlab.shapes:explain",
    "output_shape": "layerlab.shapes:output_shape",
    "LayerlabError": "layerlab.errors:LayerlabError",
    "inspect": "layerlab.probe.run:inspect",
    "load_spec": "layerlab.spec:load_spec",
    "verify": "layerlab.checks.run:verify",
    "gradcheck": "layerlab.checks.run:verify",
    "export_check": "layerlab.deploy.run:export_check",
    "profile": "layerlab.profiling.run:profile",
    "ddp_check": "layerlab.distributed.run:ddp_check",
    "precision_check": "layerlab.mixed.check:precision_check",
    "train_check": "layerlab.train.run:train_check",
    "render": "layerlab.report_render:render",
    "render_html": "layerlab.report_render:render_html",
    "diff": "layerlab.report_diff:diff",
    "manifest": "layerlab.run_manifest:manifest",
    "time_limit": "layerlab.target.entry:time_limit",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'layerlab' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
