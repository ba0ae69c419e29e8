"""``circuitgraph serve``: a local web app over graphs, dataset runs and feature dashboards.

* :mod:`~circuitgraph.serve.catalog` -- what lies under the served path (graph files, dataset runs,
  features folders), found once and named by relative path;
* :mod:`~circuitgraph.serve.dashboards` -- reading a features folder (``features.parquet``,
  ``examples.parquet``, ``labels.csv``);
* :mod:`~circuitgraph.serve.api` -- the JSON API (pruned graphs from ``prune_graph``, nodes,
  dashboards, supernodes, QK, datasets, exports of a pinned subgraph);
* :mod:`~circuitgraph.serve.server` -- the standard library's HTTP server and the page's files
  (``static/``: hand-written JavaScript and SVG, no network).

docs/explorer.md describes the page and every endpoint.
"""

from circuitgraph.serve.api import ApiError, Explorer
from circuitgraph.serve.catalog import Catalog
from circuitgraph.serve.server import DEFAULT_HOST, DEFAULT_PORT, ExplorerServer, make_server, running_server

__all__ = ["ApiError", "Catalog", "Explorer", "ExplorerServer", "make_server", "running_server", "DEFAULT_HOST",
           "DEFAULT_PORT"]
