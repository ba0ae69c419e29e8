"""The JSON Schema (draft 2020-12) of the ``circuitgraph.graph`` JSON format, generated from the
pydantic model that also reads the files (:class:`circuitgraph.export.graph_model.GraphFile`).

``python -m circuitgraph.export.graph_schema`` rewrites schemas/graph.schema.json; a test fails
when the committed file differs from :func:`graph_json_schema`, so the schema, the model, the
writer (:mod:`circuitgraph.export.json_graph`) and docs/export.md change together.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from circuitgraph._io import atomic_write_text
from circuitgraph.export.graph_model import FORMAT_VERSION, GraphFile

__all__ = ["graph_json_schema", "graph_schema_text", "SCHEMA_PATH", "write_graph_schema", "main"]

#: where the committed schema lives in a source checkout
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "graph.schema.json"


def graph_json_schema() -> dict[str, Any]:
    """The schema as a dict (deterministic: the same value on every call)."""
    schema = GraphFile.model_json_schema()
    schema.update({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:circuitgraph:schema:graph:{FORMAT_VERSION}",
        "title": "circuitgraph attribution graph",
        "description": "An exact attribution graph written by circuitgraph (docs/export.md). Generated from "
                       "circuitgraph.export.graph_model.GraphFile by `python -m circuitgraph.export.graph_schema`; "
                       "do not edit by hand.",
    })
    return schema


def graph_schema_text() -> str:
    """The schema file's exact text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(graph_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_graph_schema(path: str | Path = SCHEMA_PATH) -> Path:
    """Write the schema to ``path`` (atomically) and return the path."""
    atomic_write_text(path, graph_schema_text())
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    """``python -m circuitgraph.export.graph_schema [PATH]``: rewrite the committed schema."""
    args = sys.argv[1:] if argv is None else argv
    path = write_graph_schema(args[0] if args else SCHEMA_PATH)
    sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
