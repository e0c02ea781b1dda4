"""Probes for ``layerlab.inspect``: per-call forward records (hooks), statistics, backward norms,
formula checks and failure explanations; :func:`layerlab.probe.run.inspect` puts them together.

Modules: ``hooks`` (recorder), ``stats`` (cheap statistics), ``backward`` (loss and gradients),
``formula`` (explain-shape checks), ``blame`` (why a layer raised), ``assemble`` (the report),
``report`` (result dataclasses), ``run`` (the ``inspect`` function).
"""
