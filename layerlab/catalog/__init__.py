"""Registry entries as static data (no torch import): one module per layer group."""
