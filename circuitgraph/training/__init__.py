"""Training dictionaries (transcoders, skip transcoders, cross-layer transcoders) for a model.

``circuitgraph train SPEC`` -> :func:`circuitgraph.training.trainer.train` : text windows
(:mod:`.data`) -> activations streamed from the model (:mod:`.stream`) -> the trainer
(:mod:`.dictionary`, :mod:`.loop`, checkpoints in :mod:`.checkpoint`) -> files in
circuit-tracer's layouts (:mod:`.writers`) -> held-out metrics and the HTML report
(:mod:`.metrics`, :mod:`.report`).
"""

from circuitgraph.training.trainer import train

__all__ = ["train"]
