"""What the run writes (``export:``); every output is optional."""

from __future__ import annotations

import warnings
from pathlib import Path

from pydantic import Field, model_validator

from circuitgraph.spec.base import Bool, OutputPath, PositiveInt, StrictModel, rule_error

__all__ = ["ExportSpec", "EXPORT_SUFFIXES"]

#: the file suffixes each output accepts (an output not listed here takes any suffix)
EXPORT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "json": (".json",),
    "dot": (".dot", ".gv"),
    "svg": (".svg",),
    "png": (".png",),
    "neuronpedia": (".json",),
}

with warnings.catch_warnings():
    # ``json`` shadows the deprecated ``BaseModel.json`` method; the spec key wins
    warnings.filterwarnings("ignore", message='Field name "json"', category=UserWarning)

    class ExportSpec(StrictModel):
        """Output files.  ``outputs()`` lists the ones that are set."""

        json: OutputPath | None = Field(None, description="The graph as JSON (circuitgraph's own schema).")
        dot: OutputPath | None = Field(None, description="Graphviz DOT text.")
        svg: OutputPath | None = Field(None, description="The diagram as SVG (needs the Graphviz dot binary).")
        png: OutputPath | None = Field(None, description="The diagram as PNG (needs the Graphviz dot binary).")
        neuronpedia: OutputPath | None = Field(None, description="The graph in Neuronpedia's JSON format.")
        graph: OutputPath | None = Field(None, description="The graph in circuitgraph's compact binary format.")
        max_render_nodes: PositiveInt = Field(100, description="Draw at most this many nodes in diagrams.")
        qk_inset: Bool = Field(False, description="Draw the results of the qk queries in the diagrams (svg, png, "
                               "dot) as an inset: each head's top pairs as dashed edges into the head.")
        max_json_edges: PositiveInt = Field(5_000_000, description="Refuse to write JSON with more edges.")

        @model_validator(mode="after")
        def _suffixes(self) -> "ExportSpec":
            problems = []
            for key, suffixes in EXPORT_SUFFIXES.items():
                path = getattr(self, key)
                if path is not None and path.suffix.lower() not in suffixes:
                    problems.append(
                        (key, f"{key} output {str(path)!r} should end in {' or '.join(suffixes)}; rename it")
                    )
            if problems:
                raise rule_error(*problems)
            return self

        def outputs(self) -> dict[str, Path]:
            """``{name: path}`` of the outputs that are set, in a fixed order."""
            names = ("json", "dot", "svg", "png", "neuronpedia", "graph")
            return {name: getattr(self, name) for name in names if getattr(self, name) is not None}
