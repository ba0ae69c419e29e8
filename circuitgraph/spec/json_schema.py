"""The spec's JSON Schema, generated from the models.

``python -m circuitgraph.spec.schema [PATH]`` (see :mod:`circuitgraph.spec.schema`)
writes it to ``schemas/spec.schema.json`` (or PATH).  The output is deterministic (sorted keys, two-space indent, trailing
newline) so that a test can fail when the committed file drifts from the models.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from circuitgraph.spec.root import Spec

__all__ = ["spec_json_schema", "spec_schema_text", "write_spec_schema", "DEFAULT_SCHEMA_PATH"]

#: where the committed schema lives in a source checkout
DEFAULT_SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "spec.schema.json"
SCHEMA_ID = "https://circuitgraph.dev/schemas/spec.schema.json"


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a spec file, in validation mode."""
    schema = Spec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "circuitgraph spec"
    return schema


def spec_schema_text() -> str:
    """:func:`spec_json_schema` as deterministic JSON text with a trailing newline."""
    return json.dumps(spec_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_spec_schema(path: str | os.PathLike[str] = DEFAULT_SCHEMA_PATH) -> Path:
    """Write :func:`spec_schema_text` to ``path`` and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec_schema_text(), encoding="utf-8")
    return path
