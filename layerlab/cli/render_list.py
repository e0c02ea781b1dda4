"""``layerlab list`` as Rich tables: the registry layers, then the example specs."""

from __future__ import annotations

from typing import Any, List

from layerlab.text_safety import displays


@displays
def render(catalog: Any) -> List[Any]:
    """Two tables (registry layers; example specs) and a line on how to run either."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    layers = Table(title="registry layers (run by name: layerlab inspect conv2d)", box=box.SIMPLE_HEAD,
                   title_justify="left")
    widest = max((len(i.name) for i in catalog.layers), default=4)
    layers.add_column("name", style="bold", no_wrap=True, min_width=widest)  # a name is typed: never cut
    layers.add_column("what it is  (= its torch reference)", ratio=1)
    for item in catalog.layers:
        about = Text(item.summary or "")
        about.append(f"  = {_short(item.reference)}" if item.reference else "  (no torch reference)", style="dim")
        layers.add_row(item.name, about)
    parts: List[Any] = [layers]
    if catalog.configs:
        configs = Table(title="example specs (run by path: layerlab inspect configs/conv2d.yaml)",
                        box=box.SIMPLE_HEAD, title_justify="left")
        configs.add_column("spec", style="bold", overflow="fold")  # a path is typed: folded, never cut
        configs.add_column("name:", ratio=1)
        for c in catalog.configs:
            configs.add_row(Text(c.path), Text(c.title or "") if c.error is None else Text(f"unreadable: {c.error}",
                                                                                         style="red"))
        parts.append(configs)
    else:
        parts.append(Text("no configs/ folder here or next to layerlab's source: only registry layers to list"))
    return parts


def _short(reference: Any) -> str:
    """``torch.nn:Conv2d`` → ``nn.Conv2d``; ``pkg.mod:Class`` → ``Class``."""
    if reference.startswith("torch.nn:"):
        return "nn." + reference.split(":", 1)[1]
    return reference.replace(":", ".").rsplit(".", 1)[-1]
