"""The Typer command-line interface: one module per command, thin over the library."""
