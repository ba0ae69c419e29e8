"""The run's output files: one writer per ``export:`` key, each registered under it.

The keys, their suffixes and what draws a diagram are the spec's registry
(:data:`circuitgraph.spec.export.EXPORT_KINDS`); each writer below registers itself under its
key (``@_writes(key)``) and gets the run's :class:`ExportJob` and the staged path to write.
This module fails on import when a key has no writer or a writer no key.  The writers run in
the order they are registered (:data:`EXPORT_WRITERS`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from circuitgraph._io import atomic_write_text
from circuitgraph.export import graph_to_dot, graph_to_json, graph_to_neuronpedia, render_graph, save_graph_binary
from circuitgraph.export.html import write_report
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.spec.export import EXPORT_KINDS

if TYPE_CHECKING:
    from circuitgraph.features.summary import FeatureDashboards
    from circuitgraph.pipeline.runner import RunResult

__all__ = ["ExportJob", "EXPORT_WRITERS"]


@dataclass
class ExportJob:
    """What every writer may need: the run, the graph it exports (pruned when the spec prunes),
    the results as the files hold them (paths made portable) and the diagram's options."""

    result: RunResult
    graph: AttributionGraph
    queries: list[dict[str, Any]]
    validation: list[dict[str, Any]]
    #: the steering list as the files hold it, None when the run steered nothing
    steering: list[dict[str, Any]] | None
    #: the qk queries' result documents (``QKResult.to_dict()``, read by ``_results.stored_results``):
    #: the Neuronpedia export's attention pairs
    qk: Sequence[Mapping[str, Any]]
    #: the qk results drawn in the diagrams (``export.qk_inset``), else empty
    inset: Sequence[Mapping[str, Any]]
    #: ``graph_to_dot`` options from ``export.diagram`` (empty when no output is a diagram)
    diagram: dict[str, Any]
    #: the features folder's dashboards (``export.features``), or None
    dashboards: FeatureDashboards | None


Writer = Callable[[ExportJob, str], None]
#: export key -> its writer, in the order the run writes them
EXPORT_WRITERS: dict[str, Writer] = {}


def _writes(key: str) -> Callable[[Writer], Writer]:
    def register(fn: Writer) -> Writer:
        if key in EXPORT_WRITERS:
            raise ValueError(f"export {key!r} has two writers")
        EXPORT_WRITERS[key] = fn
        return fn
    return register


@_writes("json")
def write_json(job: ExportJob, path: str) -> None:
    graph_to_json(job.graph, path, queries=job.queries, validation=job.validation,
                  max_edges=job.result.spec.export.max_json_edges, steering=job.steering)


@_writes("graph")
def write_binary(job: ExportJob, path: str) -> None:
    save_graph_binary(job.graph, path, queries=job.queries, validation=job.validation, steering=job.steering)


@_writes("neuronpedia")
def write_neuronpedia(job: ExportJob, path: str) -> None:
    p = job.result.spec.pruning
    if p is None:  # the writer's own default thresholds
        graph_to_neuronpedia(job.graph, path, full_graph=job.result.full_graph, qk=job.qk, dashboards=job.dashboards)
    else:
        graph_to_neuronpedia(job.graph, path, full_graph=job.result.full_graph, qk=job.qk, dashboards=job.dashboards,
                             node_threshold=p.node_threshold, edge_threshold=p.edge_threshold)


@_writes("dot")
def write_dot(job: ExportJob, path: str) -> None:
    atomic_write_text(path, graph_to_dot(job.graph, max_nodes=job.result.spec.export.max_render_nodes, qk=job.inset,
                                         **job.diagram))


@_writes("svg")
def write_svg(job: ExportJob, path: str) -> None:
    render_graph(job.graph, path, max_nodes=job.result.spec.export.max_render_nodes, qk=job.inset, **job.diagram)


@_writes("png")
def write_png(job: ExportJob, path: str) -> None:
    render_graph(job.graph, path, max_nodes=job.result.spec.export.max_render_nodes, qk=job.inset, **job.diagram)


@_writes("html")
def write_html(job: ExportJob, path: str) -> None:
    write_report(job.result, path, max_nodes=job.result.spec.export.max_render_nodes,
                 diagram={**job.diagram, "qk": job.inset}, features=job.dashboards)


if set(EXPORT_WRITERS) != set(EXPORT_KINDS):  # pragma: no cover - a key without a writer, or the reverse
    raise ImportError(f"export writers {sorted(EXPORT_WRITERS)} do not match the spec's EXPORT_KINDS "
                      f"{sorted(EXPORT_KINDS)}")
