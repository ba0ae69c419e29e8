"""Dictionaries (per-layer and cross-layer transcoders) behind one protocol.

Both :class:`TranscoderSet` and :class:`CrossLayerTranscoder` offer:

* ``layers``: ``{encoder layer: reader}``; a reader has ``hook_in``, ``input_site``
  (``raw`` | ``normalized`` | ``mlp_input``), ``d_sae``, ``b_enc``, ``encoder_rows(idx)``,
  ``pre_activation(x)`` and ``activation(x)`` (the dictionary's own nonlinearity);
* ``output_layers(l)``: the MLP outputs a feature of layer ``l`` writes (``l`` only, or
  ``l .. n_layers-1`` for a CLT), ``decoder_rows(l, idx)`` ``(n, n_out, d_model)``;
* ``decoder_bias(k)``, ``skip_weight(k)`` of output layer ``k``, and
  ``reconstruct(acts, inputs)``: every output layer's reconstruction;
* ``kind`` (``per_layer`` | ``cross_layer``), ``format``, ``source``, ``describe()``, ``to(dtype)``,
  ``with_source(source)`` (the same dictionary made with another source record).

The engine, queries and checks accept any :class:`~circuitgraph.dictionaries.protocol.Dictionary`
(a ``typing.Protocol``); the on-disk formats are records of the registry
:data:`circuitgraph.spec.dictionaries.DICTIONARY_FORMATS`.
"""

from circuitgraph.dictionaries.clt import CrossLayerTranscoder, load_clt_dir
from circuitgraph.dictionaries.formats import FORMATS, detect_format, load_dictionaries
from circuitgraph.dictionaries.protocol import Dictionary
from circuitgraph.dictionaries.transcoders import TranscoderLayer, TranscoderSet

__all__ = ["CrossLayerTranscoder", "Dictionary", "FORMATS", "TranscoderLayer", "TranscoderSet", "detect_format",
           "load_clt_dir", "load_dictionaries"]
