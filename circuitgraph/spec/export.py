"""What the run writes (``export:``); every output is optional."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from circuitgraph.spec.base import Bool, InputPath, OutputPath, PositiveInt, StrictModel, rule_error
from circuitgraph.spec.filters import NodeFilter

__all__ = ["ExportSpec", "DiagramSpec", "ExportKind", "EXPORT_KINDS", "EXPORT_SUFFIXES"]


class DiagramSpec(StrictModel):
    """How the diagrams (dot, svg, png and the HTML report's) are drawn."""

    labels: InputPath | None = Field(
        None, description="Feature descriptions to draw under feature ids: a CSV or JSON of layer, index, label, "
        "or a Neuronpedia explanations export.")
    supernodes: dict[str, NodeFilter] | Literal["auto"] | None = Field(
        None, description="Groups drawn as one box with summed edges: {name: node filter}, or 'auto' to group "
        "nodes of a layer that share their neighbours.")
    show_unreachable: Bool = Field(
        False, description="Also draw nodes with no path to a target (hidden by default).")


@dataclass(frozen=True)
class ExportKind:
    """One output file of a run (``export.<key>``): the registry record a new export adds.

    Its writer registers itself under the same key in :mod:`circuitgraph.pipeline.exports`
    (which fails on import when a key has no writer or a writer no key); the explorer's saved
    subgraphs (``GET /api/export``) are the kinds with ``explorer`` set, written by
    :mod:`circuitgraph.serve.api`'s downloads under the same key, and the page's "save pinned"
    links are built from these records (``GET /api/registries``): one link per such kind, in this
    registry's order, named ``explorer_label``."""

    key: str
    #: the file suffixes the output accepts (the spec refuses others)
    suffixes: tuple[str, ...]
    #: drawn with ``export.diagram``'s options (the run computes the diagram's influence once for all)
    diagram: bool = False
    #: renders the diagram through Graphviz's ``dot`` binary (the memory plan counts its buffers)
    renders: bool = False
    #: the run refuses to start without Graphviz's ``dot`` binary (the file is dot's output)
    requires_dot: bool = False
    #: bytes per pruned-graph edge while the writer writes this output, the pruned graph itself
    #: excluded (measured; the run's memory plan, :mod:`circuitgraph.pipeline.stage_memory`)
    kept_edge_bytes: int = 0
    #: the explorer can save a pinned subgraph as this kind: the download's name ends in this
    #: (``<graph>-subgraph<explorer>``); None: not offered
    explorer: str | None = None
    #: the explorer's link that saves a pinned subgraph as this kind (set exactly when ``explorer`` is)
    explorer_label: str | None = None

    def __post_init__(self) -> None:
        if self.kept_edge_bytes <= 0:
            raise ValueError(f"export kind {self.key!r}: give kept_edge_bytes, the writer's measured bytes per kept "
                             "edge (the run's memory plan counts it)")
        if (self.explorer is None) != (self.explorer_label is None):
            raise ValueError(f"export kind {self.key!r}: set explorer (the download's suffix) and explorer_label "
                             "(its link on the page) together, or neither")


#: every output of a one-prompt run, in the order ``ExportSpec.outputs()`` lists them
EXPORT_KINDS: dict[str, ExportKind] = {k.key: k for k in (
    # kept_edge_bytes: JSON 187 measured per kept edge on the real model (1.03 M kept edges)
    ExportKind("json", (".json",), kept_edge_bytes=208, explorer=".json", explorer_label="our JSON"),
    ExportKind("dot", (".dot", ".gv"), diagram=True, kept_edge_bytes=32),
    ExportKind("svg", (".svg",), diagram=True, renders=True, requires_dot=True, kept_edge_bytes=32, explorer=".svg",
               explorer_label="SVG"),
    ExportKind("png", (".png",), diagram=True, renders=True, requires_dot=True, kept_edge_bytes=32),
    ExportKind("neuronpedia", (".json",), kept_edge_bytes=208, explorer=".neuronpedia.json",
               explorer_label="Neuronpedia JSON"),
    ExportKind("graph", (".npz",), kept_edge_bytes=64),
    ExportKind("html", (".html", ".htm"), diagram=True, renders=True, kept_edge_bytes=208),
)}

#: the file suffixes each output accepts (from :data:`EXPORT_KINDS`)
EXPORT_SUFFIXES: dict[str, tuple[str, ...]] = {k.key: k.suffixes for k in EXPORT_KINDS.values()}

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
        html: OutputPath | None = Field(
            None, description="One self-contained HTML report: diagram, spec, identity, scores, every query "
            "and validation result, heat maps and control distributions, exactness checks.")
        dataset: OutputPath | None = Field(
            None, description="Dataset runs: the output folder (graphs/, results/, manifest.parquet, nodes.parquet, "
            "edges.parquet)."
        )
        features: OutputPath | None = Field(
            None, description="Feature dashboards: with dataset: and features:, the folder the run writes "
            "(features.parquet, examples.parquet); in a one-prompt run, a folder written by such a run whose "
            "dashboards and labels.csv the report, the diagrams and the Neuronpedia export use."
        )
        dataset_format: Literal["binary", "json"] = Field(
            "binary", description="Dataset runs: each prompt's graph as binary .npz (default) or pruned graph JSON."
        )
        max_render_nodes: PositiveInt = Field(
            40, description="The node budget of diagrams (dot, svg, png, the HTML report's) and of the explorer's "
            "first view: the most influential nodes are drawn, the title says how many were hidden and their share "
            "of the influence; the JSON exports hold the whole graph.")
        diagram: DiagramSpec = Field(default_factory=DiagramSpec, description="How diagrams are drawn.")
        qk_inset: Bool = Field(False, description="Draw the results of the qk queries in the diagrams (svg, png, "
                               "dot) as an inset: each head's top pairs as dashed edges into the head.")
        max_json_edges: PositiveInt = Field(5_000_000, description="Refuse to write JSON with more edges.")

        @model_validator(mode="after")
        def _suffixes(self) -> ExportSpec:
            problems = []
            for key, suffixes in EXPORT_SUFFIXES.items():
                path = getattr(self, key)
                if path is not None and path.suffix.lower() not in suffixes:
                    problems.append(
                        (key, f"{key} output {str(path)!r} should end in {' or '.join(suffixes)}; rename it")
                    )
            seen: dict[Path, str] = {}
            for key, path in self.outputs().items():
                where = Path(os.path.normpath(path))
                if where in seen:
                    problems.append(
                        (key, f"{key} output {str(path)!r} is also the {seen[where]} output; give each export "
                         "its own file")
                    )
                seen.setdefault(where, key)
            if problems:
                raise rule_error(*problems)
            return self

        def outputs(self) -> dict[str, Path]:
            """``{name: path}`` of the outputs that are set, in a fixed order."""
            return {name: getattr(self, name) for name in EXPORT_KINDS if getattr(self, name) is not None}
