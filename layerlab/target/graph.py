"""A bounded walk over an autograd graph, for the rules that read what a value was computed from."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

__all__ = ["graph_nodes"]


def graph_nodes(roots: Iterable[Any], limit: int) -> Iterator[Any]:
    """Each autograd node reachable from ``roots`` (``grad_fn``s; ``None`` ignored) towards the leaves,
    once, depth first; at most ``limit`` of them, so a huge model's graph is not searched whole."""
    seen = set()
    stack = [r for r in roots if r is not None]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(n for n, _ in node.next_functions)
