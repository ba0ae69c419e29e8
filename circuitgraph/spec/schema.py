"""Entry point: ``python -m circuitgraph.spec.schema [PATH]`` regenerates the committed
spec schema (default ``schemas/spec.schema.json``).

The functions live in :mod:`circuitgraph.spec.json_schema`; this module is not imported
by the package, so running it with ``-m`` does not import it twice.
"""

from __future__ import annotations

import sys

from circuitgraph.spec.json_schema import write_spec_schema

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = write_spec_schema(argv[0]) if argv else write_spec_schema()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
