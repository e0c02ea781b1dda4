"""Moved to :mod:`layerlab.target.buffers` (every command's snapshot uses it, and ``target`` sits below
``probe``); kept so that old imports keep working."""

from layerlab.target.buffers import SavedBuffers, put_back

__all__ = ["SavedBuffers", "put_back"]
