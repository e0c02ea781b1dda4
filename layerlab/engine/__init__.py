"""The diagnosis engine: axis provenance over the op trace, fix search from one edit grammar, and
the oracles that decide whether a fixed copy computes a plausible model (not only that it runs).

One concept a module; see each module's docstring.
"""
