"""Tests of layerlab.inspect measured on corpora of models (tests/corpora)."""
