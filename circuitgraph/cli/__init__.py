"""The ``circuitgraph`` command line: :mod:`circuitgraph.cli.main` holds the typer
``app`` and the console-script entry point ``main``.

Nothing is imported here, so ``python -m circuitgraph.cli.main`` runs the module once.
"""

__all__: list[str] = []
