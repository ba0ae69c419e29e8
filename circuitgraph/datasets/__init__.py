"""Dataset runs: many prompts, exact aggregation by node identity, local processes or Ray.

A spec with ``dataset:`` instead of ``prompt:`` runs every row through the same pipeline
(graph, pruning, queries, checks), writes each prompt's outputs under
``export: {dataset: DIR}`` with a manifest, and aggregates the graphs by stable node
identity into ``nodes.parquet`` and ``edges.parquet`` (see docs/dataset.md).

    >>> import circuitgraph
    >>> result = circuitgraph.run("examples/demo_dataset.yaml")      # doctest: +SKIP
    >>> ds = circuitgraph.open_dataset(result.directory)             # doctest: +SKIP
    >>> ds.sql("select kind, count(*) from nodes group by kind")     # doctest: +SKIP
"""

from circuitgraph.datasets import echo_runs as _echo_runs  # noqa: F401  (registers sign_regimes' executor rows with the checks)
from circuitgraph.datasets.run import MANIFEST_COLUMNS, DatasetRunResult, run_dataset
from circuitgraph.datasets.store import AggregateGraph, Dataset, open_dataset

__all__ = ["run_dataset", "DatasetRunResult", "MANIFEST_COLUMNS", "open_dataset", "Dataset", "AggregateGraph"]
