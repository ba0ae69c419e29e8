"""``python -m circuitgraph`` is the ``circuitgraph`` command."""

from circuitgraph.cli.main import main

if __name__ == "__main__":
    main()
