"""Corpora of models used to measure what layerlab catches (not run as tests themselves)."""
