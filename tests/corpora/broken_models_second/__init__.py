"""A second, independent broken-model corpus (15 cases) for the fresh-audit protocol.

Written without reading layerlab's source or the first corpus's cases, so it measures how the
crash diagnosis does on models nobody tuned it for. See cases.py and grade.py.
"""
