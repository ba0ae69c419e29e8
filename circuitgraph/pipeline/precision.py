"""Whether a graph's completeness violation is what its dtypes allow, and what to say when not.

Completeness (``pre = sum of incoming edges + constant`` for every reader) holds to rounding:
edges accumulated in float32 agree to about ``1e-6`` relative (:data:`EXACT_TOLERANCE` allows
``1e-4``), in float64 to about ``1e-12``.  A model whose weights are bfloat16 or float16 runs
its forward pass in that dtype, so the measured activations the edges must add up to carry its
rounding (``eps``: 7.8e-3 for bfloat16, 9.8e-4 for float16): a violation of a few ``eps`` is
then expected, and every edge and score is exact only to about that.  :func:`precision_warning`
says so in one line (the run prints it, and records it in the graph's metadata).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["EXACT_TOLERANCE", "DTYPE_EPS", "precision_warning"]

#: the largest relative completeness violation of an exact graph, by accumulation dtype
EXACT_TOLERANCE = {"float32": 1e-4, "float64": 1e-9}
#: machine epsilon of each weight dtype
DTYPE_EPS = {"float64": 2.2e-16, "float32": 1.2e-7, "bfloat16": 7.8e-3, "float16": 9.8e-4}


def precision_warning(completeness: Mapping[str, Any], *, weights_dtype: str, graph_dtype: str) -> str | None:
    """One line when the graph's largest relative completeness violation is above what
    ``graph_dtype`` accumulation allows (``None`` otherwise): what it means, and what to run instead."""
    worst = completeness.get("max_relative_violation")
    tol = EXACT_TOLERANCE.get(graph_dtype, 1e-4)
    if worst is None or not worst > tol:
        return None
    where = f" (at {completeness['worst_node']})" if completeness.get("worst_node") else ""
    head = (f"completeness: the largest relative violation {worst:.2e}{where} is above what {graph_dtype} edges "
            f"allow ({tol:g})")
    eps = DTYPE_EPS.get(weights_dtype)
    if weights_dtype in ("bfloat16", "float16") and eps is not None:
        return (f"{head}: the model runs in {weights_dtype}, whose rounding (eps {eps:.1e}) the measured activations "
                f"carry, so edges, paths and scores are exact only to about {max(worst, eps):.0e} relative; for an "
                "exact graph accumulate in float32 (model: {dtype: float32}) or float64 (graph: {dtype: float64})")
    return (f"{head}: the edges do not add up to the model's values; rerun with graph: {{dtype: float64}}, and if "
            "it stays, report it as a bug")
