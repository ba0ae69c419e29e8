"""circuitgraph: declarative, exact circuit-graph analysis for transformer language models."""

from __future__ import annotations

__version__ = "0.1.0"
