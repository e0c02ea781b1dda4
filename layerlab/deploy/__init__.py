"""``layerlab export-check``: trace, script, compile, export and ONNX, each compared with eager.

:func:`layerlab.deploy.run.export_check` is the entry point (``layerlab.export_check``);
:mod:`layerlab.deploy.paths` holds one function per path, :mod:`layerlab.deploy.variants` the other
inputs that tell a general program from an input-specific one.
"""
