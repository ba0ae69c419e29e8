"""circuitgraph.adapters."""
