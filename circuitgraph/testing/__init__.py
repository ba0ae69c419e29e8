"""Helpers for tests, examples and benchmarks: random models and dictionaries built natively.

:mod:`~circuitgraph.testing.synthetic` builds tiny TransformerLens models and random sae-lens
transcoders and saves them in the local bundle layout. Nothing here is used by the pipeline.
"""
