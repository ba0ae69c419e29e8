"""circuitgraph.attribution."""
