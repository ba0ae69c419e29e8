"""Dictionaries (transcoders) behind one small interface."""

from circuitgraph.dictionaries.transcoders import TranscoderLayer, TranscoderSet

__all__ = ["TranscoderLayer", "TranscoderSet"]
