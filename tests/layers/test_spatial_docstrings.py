"""The spatial layers' docstrings: examples run, and each layer documents Args and Shape."""

from __future__ import annotations

import doctest
import importlib
import inspect
import warnings

import pytest
import torch

MODULES = ["conv", "im2col", "separable", "pool", "adaptive", "linear", "patch"]


def public_classes():
    for name in MODULES:
        module = importlib.import_module(f"layerlab.layers.{name}")
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isclass(obj):
                yield pytest.param(module, obj, id=f"{name}.{attr}")


@pytest.mark.parametrize("module, cls", list(public_classes()))
def test_docstring_has_the_torch_nn_sections_and_its_examples_run(module, cls):
    doc = cls.__doc__ or ""
    assert "Args:" in doc and "Shape:" in doc and "where" in doc
    test = doctest.DocTestParser().get_doctest(doc, {**vars(module), "torch": torch}, cls.__qualname__,
                                               module.__file__, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} docstring example(s) of {cls.__qualname__} failed (see output)"
