"""``layerlab profile``: per-module-call time, memory and FLOPs of a forward + backward step.

:func:`layerlab.profiling.run.profile` is the entry point (``layerlab.profile``; this package is
not called ``profile`` so that it never shadows that function on the ``layerlab`` package).
"""
