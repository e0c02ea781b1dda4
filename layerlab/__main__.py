"""``python -m layerlab`` — the same entry point as the ``layerlab`` console script."""

from layerlab.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
