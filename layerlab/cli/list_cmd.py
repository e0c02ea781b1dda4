"""``layerlab list``: what there is to run by name (registry layers) or by path (example specs in configs/).

Parse → :func:`layerlab.target.discover.catalog` → :mod:`layerlab.cli.render_list`. Never imports
torch. Every "see `layerlab list`" hint points here. Exit code: 0.
"""

from __future__ import annotations

from layerlab.cli.options import JsonOpt


def command(json: JsonOpt = False) -> int:
    """List the registry layers (with one-line descriptions) and the example specs in configs/.

    [b]Examples[/b]

      layerlab list
      layerlab list --json
    """
    from layerlab.cli.output import Output
    from layerlab.target.discover import catalog

    out = Output(json_mode=json)
    found = catalog()
    if out.json_mode:
        out.json(found)
    else:
        from layerlab.cli.render_list import render

        out.show(*render(found))
    return 0
