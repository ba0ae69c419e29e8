"""Model adapters: the only place that knows TransformerLens names and architecture facts."""

from circuitgraph.adapters.architecture import ArchitectureFacts, ModelAdapter, NormWeights
from circuitgraph.adapters.tokenizer import Tokenizer

__all__ = ["ArchitectureFacts", "ModelAdapter", "NormWeights", "Tokenizer"]
