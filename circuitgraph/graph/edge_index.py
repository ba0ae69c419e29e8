"""The one sparse structure of a graph's edges: a grouping of edge indices by a node column.

Edges are stored as parallel arrays (``edge_target``, ``edge_source``, ``edge_weight``; rows =
targets, columns = sources).  :func:`grouped` gives, for either column, the edge order that
groups edges by that node and the ``indptr`` that delimits each node's group (CSR when grouped
by target, CSC when grouped by source).  The graph caches both; the DAG sweep uses the same
function on edge subsets.
"""

from __future__ import annotations

import numpy as np

__all__ = ["grouped"]


def grouped(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, indptr)``: ``order`` sorts the edges stably by ``keys`` (node indices in
    ``[0, n)``), and the edges of node ``i`` are ``order[indptr[i]:indptr[i + 1]]``.

    >>> order, indptr = grouped(np.array([2, 0, 2]), 3)
    >>> order.tolist(), indptr.tolist()
    ([1, 0, 2], [0, 1, 1, 3])
    """
    keys = np.asarray(keys)
    order = np.argsort(keys, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=indptr[1:])
    return order, indptr
