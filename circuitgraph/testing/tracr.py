"""tracr-compiled transformers as model folders with their ground-truth circuits.

:func:`compile_program` compiles a RASP program with tracr (DeepMind's compiler; the optional
``tracr`` extra, ``pip install tracr-pypi``) and writes

* ``out_dir/model/``: a TransformerLens-format folder that ``model: {path: out_dir/model}``
  loads: ``config.json`` (norm-free, ReLU MLPs, bidirectional attention unless ``causal``),
  ``model.safetensors`` holding exactly tracr's assembled weights (its residual space is
  ``d_model``, its labelled basis directions in ``residual_labels.json``), and a word-level
  tokenizer over the union of the input vocabulary (with tracr's ``compiler_bos`` as the BOS
  token) and, for a categorical program, its output values.  A categorical output is read as
  logits: the unembedding column of output value ``v`` is tracr's readout of the output
  direction ``sink:v`` (columns of tokens that are not outputs are zero).  A numerical output
  is one residual direction: ``out_dir/model/output_direction.npy`` (``d_model`` numbers), the
  target ``{direction: {site: resid_post, layer: L-1, file: .../output_direction.npy}}``;
* ``out_dir/circuit.json``: the ground-truth circuit derived from tracr's compiled blocks: which
  block (token and position embeddings, each head, each MLP, the output readout) writes which
  basis directions of the residual stream (its output space, the directions its matrix writes)
  and which block reads them (its input space, the directions its matrix reads), through its value/output
  path (``direct``: an MLP's input, a head's values) or its query/key path (``qk``), as
  ``{"nodes": [{kind, layer, index}], "edges": [{source, target, path}]}`` with the graph's
  kinds: ``embedding`` (layer -1, index -1: every token embedding and tracr's ``one``
  direction), ``positional`` (layer -1, index -1), ``attention_head`` (index = head),
  ``mlp`` (index 0) and ``target`` (layer = n_layers, index -1: the output readout, logits or
  the numerical direction).  Position-free: an edge holds for some positions of the prompt.

tracr's BOS convention: every prompt starts with ``compiler_bos`` (``prepend_bos: true`` with the
written tokenizer), position 0 holds no position embedding, and the output at position 0 is
not defined.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from circuitgraph.residual import ResidualLocation

__all__ = ["TRACR_MISSING", "tracr_unavailable", "CompiledProgram", "compile_program", "tracr_forward",
           "ground_truth_circuit", "library_program", "LIBRARY_PROGRAMS", "BOS", "PAD", "UNK"]

BOS = "compiler_bos"
PAD = "compiler_pad"
UNK = "<unk>"

TRACR_MISSING = "tracr is not installed (pip install tracr-pypi, or the circuitgraph-lm[tracr] extra)"


def tracr_unavailable() -> str | None:
    """Why tracr cannot be used here (None when it can)."""
    try:
        import tracr.compiler.compiling  # noqa: F401
    except ImportError:
        return TRACR_MISSING
    return None


@dataclass
class CompiledProgram:
    """What :func:`compile_program` wrote and the tracr objects it compiled."""

    out_dir: Path
    program: Any  #: the RASP program
    assembled: Any  #: tracr's AssembledTransformerModel
    craft_model: Any  #: tracr's craft model (its blocks with their input/output spaces)
    vocab: list[str]  #: token strings in id order
    output_tokens: list[int]  #: token ids of the categorical output values (empty if numerical)
    categorical: bool
    circuit: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.out_dir / "model"

    def encode(self, values: Iterable[Any]) -> list[int]:
        """Token ids of a prompt of program inputs, BOS first."""
        index = {s: i for i, s in enumerate(self.vocab)}
        return [index[BOS]] + [index[str(v)] for v in values]


#: programs of ``tracr.compiler.lib`` by name: (what it computes, its default vocabulary)
LIBRARY_PROGRAMS: dict[str, tuple[str, tuple]] = {
    "reverse": ("the input reversed (make_reverse(tokens))", ("a", "b", "c")),
    "frac_prevs": ("the fraction of previous tokens that are 'x' (make_frac_prevs; ACDC's tracr-proportion)",
                   ("a", "b", "x")),
    "sort": ("the input sorted (make_sort(tokens, tokens, min_key=1))", (1, 2, 3, 4)),
    "hist": ("each token's count in the input (make_hist)", ("a", "b", "c")),
    "length": ("the input's length (make_length)", ("a", "b", "c")),
}


def library_program(name: str, max_seq_len: int) -> tuple[Any, set]:
    """``(program, default vocabulary)`` of one of :data:`LIBRARY_PROGRAMS`."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    if name not in LIBRARY_PROGRAMS:
        raise ValueError(f"unknown tracr program {name!r}; expected one of {', '.join(LIBRARY_PROGRAMS)}")
    make = {
        "reverse": lambda: lib.make_reverse(rasp.tokens),
        "frac_prevs": lambda: lib.make_frac_prevs(rasp.numerical(rasp.Map(lambda x: x == "x", rasp.tokens))
                                                  .named("is_x")),
        "sort": lambda: lib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=max_seq_len, min_key=1),
        "hist": lambda: lib.make_hist(),
        "length": lambda: lib.make_length(),
    }[name]
    return make().named(name), set(LIBRARY_PROGRAMS[name][1])


def _compile(program: Any, vocab: set, max_seq_len: int, causal: bool, mlp_exactness: int) -> tuple[Any, Any]:
    """tracr's compile_rasp_to_model, step by step, keeping the craft model (its blocks)."""
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        rasp_to_graph,
        validating,
    )
    from tracr.craft import bases
    from tracr.rasp import rasp

    unsupported = validating.static_validate(program)
    if unsupported:
        raise ValueError("tracr cannot compile: " + "; ".join(f"{e.expr.name}: {e.reason}" for e in unsupported))
    extracted = rasp_to_graph.extract_rasp_graph(program)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, vocab, max_seq_len)
    expr_to_craft_graph.add_craft_components_to_rasp_graph(
        graph, bos_dir=bases.BasisDirection(rasp.tokens.label, BOS), mlp_exactness=mlp_exactness)
    craft_model = craft_graph_to_model.craft_graph_to_model(graph, sources)
    assembled = craft_model_to_transformer.craft_model_to_transformer(
        craft_model=craft_model, graph=graph, sink=sink, max_seq_len=max_seq_len, causal=causal,
        compiler_bos=BOS, compiler_pad=PAD)
    return assembled, craft_model


def _module_names(craft_model: Any) -> list[tuple[str, int]]:
    """Per craft block: ``("attn" | "mlp", layer)``, as tracr's assembler places it."""
    from tracr.craft import transformers

    out, layer, slot = [], 0, "attn"
    for block in craft_model.blocks:
        kind = "mlp" if isinstance(block, transformers.MLP) else "attn"
        while slot != kind:  # an empty half-layer in between: tracr leaves its weights zero
            layer, slot = (layer, "mlp") if slot == "attn" else (layer + 1, "attn")
        out.append((kind, layer))
        layer, slot = (layer, "mlp") if slot == "attn" else (layer + 1, "attn")
    return out


def _labels(space: Any, weights: Any = None, axis: int = 1) -> set[str]:
    """The basis directions of ``space``; with ``weights``, only those whose row (``axis=1``: the
    matrix's rows index ``space``) or column (``axis=0``) is not all zero: a direction a block's
    space names but its matrix never reads or writes (tracr's numerical mean names BOS in its value
    space with a zero row) is not part of the circuit."""
    labels = [str(d) for d in space.basis]
    if weights is None:
        return set(labels)
    used = np.abs(np.asarray(weights)).sum(axis=axis) != 0
    return {lab for lab, u in zip(labels, used, strict=False) if u}


def ground_truth_circuit(assembled: Any, craft_model: Any, sink: str) -> dict[str, Any]:
    """The true component circuit from tracr's blocks (see the module docstring); ``sink`` is the
    program's label (its output directions are ``sink`` or ``sink:value``)."""
    from tracr.craft import transformers

    L = assembled.model_config.num_layers
    residual = assembled.residual_labels
    token_dirs = {lab for lab in residual if lab.startswith("tokens:")} | ({"one"} & set(residual))
    position_dirs = {lab for lab in residual if lab.startswith("indices:")}
    # writers: (node, location order, directions written); readers: (node, order, path, directions)
    emb = {"kind": "embedding", "layer": -1, "index": -1}
    pos = {"kind": "positional", "layer": -1, "index": -1}
    writers: list[tuple[dict, int, set[str]]] = [(emb, 0, token_dirs), (pos, 0, position_dirs)]
    readers: list[tuple[dict, int, str, set[str]]] = []
    for block, (_kind, layer) in zip(craft_model.blocks, _module_names(craft_model), strict=False):
        if isinstance(block, transformers.MLP):
            node = {"kind": "mlp", "layer": layer, "index": 0}
            order = int(ResidualLocation.written_by("mlp", layer))
            readers.append((node, order - 1, "direct", _labels(block.fst.input_space, block.fst.matrix, 1)))
            writers.append((node, order, _labels(block.snd.output_space, block.snd.matrix, 0)))
            continue
        for h, head in enumerate(block.as_multi().heads()):
            node = {"kind": "attention_head", "layer": layer, "index": h}
            order = int(ResidualLocation.written_by("attention_head", layer))
            ov, qk = head.w_ov.matrix, head.w_qk.matrix  # (input, output), (query, key)
            readers.append((node, order - 1, "direct", _labels(head.w_ov.input_space, ov, 1)))
            readers.append((node, order - 1, "qk", _labels(head.w_qk.left_space, qk, 1)
                            | _labels(head.w_qk.right_space, qk, 0)))
            writers.append((node, order, _labels(head.w_ov.output_space, ov, 0)))
    out_dirs = {lab for lab in residual if lab.split(":")[0] == sink}
    target = {"kind": "target", "layer": L, "index": -1}
    readers.append((target, int(ResidualLocation.resid_post(L - 1)), "direct", out_dirs))
    edges, seen = [], set()
    for r_node, r_order, path, r_dirs in readers:
        for w_node, w_order, w_dirs in writers:
            if w_order <= r_order and w_dirs & r_dirs:
                key = (tuple(w_node.values()), tuple(r_node.values()), path)
                if key not in seen:
                    seen.add(key)
                    edges.append({"source": w_node, "target": r_node, "path": path,
                                  "directions": sorted(w_dirs & r_dirs)})
    nodes = [w for w, _, _ in writers] + [target]
    return {"nodes": nodes, "edges": edges, "n_layers": L}


def compile_program(program: Any, vocab: Iterable[Any], max_seq_len: int, out_dir: str | Path, causal: bool = False,
                    *, mlp_exactness: int = 100) -> CompiledProgram:
    """Compile ``program`` (a RASP SOp) for ``vocab`` and prompts of up to ``max_seq_len`` inputs
    (plus BOS), and write ``out_dir/model/`` and ``out_dir/circuit.json`` (module docstring)."""
    reason = tracr_unavailable()
    if reason:
        raise ImportError(reason)
    from tracr.rasp import rasp

    out_dir = Path(out_dir)
    vocab = set(vocab)
    assembled, craft_model = _compile(program, vocab, max_seq_len, causal, mlp_exactness)
    categorical = rasp.is_categorical(program)
    in_map = assembled.input_encoder.encoding_map  # value -> id, BOS and PAD included
    tokens = [None] * len(in_map)
    for value, i in in_map.items():
        tokens[i] = str(value)
    out_values = list(assembled.output_encoder.encoding_map) if categorical else []
    for v in out_values:
        if str(v) not in tokens:
            tokens.append(str(v))
    tokens.append(UNK)
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"two vocabulary values share a string: {tokens}")
    index = {s: i for i, s in enumerate(tokens)}
    output_tokens = [index[str(v)] for v in out_values]
    state, config = _weights(assembled, program.label, len(tokens), output_tokens, causal, max_seq_len)
    circuit = ground_truth_circuit(assembled, craft_model, program.label)
    circuit["program"] = program.label
    circuit["categorical"] = categorical
    model_dir = out_dir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    save_file(state, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (model_dir / "residual_labels.json").write_text(json.dumps(list(assembled.residual_labels), indent=1))
    if not categorical:
        labels = assembled.residual_labels
        direction = np.array([1.0 if lab == program.label else 0.0 for lab in labels], dtype=np.float32)
        np.save(model_dir / "output_direction.npy", direction)
    _write_tokenizer(model_dir / "tokenizer", tokens, max_seq_len + 1)
    (out_dir / "circuit.json").write_text(json.dumps(circuit, indent=1))
    return CompiledProgram(out_dir, program, assembled, craft_model, tokens, output_tokens, categorical, circuit)


def _weights(assembled: Any, sink: str, d_vocab: int, output_tokens: list[int], causal: bool,
             max_seq_len: int) -> tuple[dict, dict]:
    """tracr's parameters as a TransformerLens state dict and its config."""
    p = {k: {n: np.asarray(v, dtype=np.float64) for n, v in d.items()} for k, d in assembled.params.items()}
    cfg = assembled.model_config
    L, H, dh = cfg.num_layers, cfg.num_heads, cfg.key_size
    W_tok = p["token_embed"]["embeddings"]
    D = W_tok.shape[1]
    d_mlp = p["transformer/layer_0/mlp/linear_1"]["w"].shape[1]
    t = lambda a: torch.tensor(np.ascontiguousarray(a), dtype=torch.float32)  # noqa: E731
    W_E = np.zeros((d_vocab, D))
    W_E[: W_tok.shape[0]] = W_tok
    state = {"embed.W_E": t(W_E), "pos_embed.W_pos": t(p["pos_embed"]["embeddings"])}
    for l in range(L):
        a = f"transformer/layer_{l}/attn"
        for name, key in (("query", "Q"), ("key", "K"), ("value", "V")):
            w, b = p[f"{a}/{name}"]["w"], p[f"{a}/{name}"]["b"]
            state[f"blocks.{l}.attn.W_{key}"] = t(w.reshape(D, H, dh).transpose(1, 0, 2))
            state[f"blocks.{l}.attn.b_{key}"] = t(b.reshape(H, dh))
        state[f"blocks.{l}.attn.W_O"] = t(p[f"{a}/linear"]["w"].reshape(H, dh, D))
        state[f"blocks.{l}.attn.b_O"] = t(p[f"{a}/linear"]["b"])
        m = f"transformer/layer_{l}/mlp"
        state[f"blocks.{l}.mlp.W_in"] = t(p[f"{m}/linear_1"]["w"])
        state[f"blocks.{l}.mlp.b_in"] = t(p[f"{m}/linear_1"]["b"])
        state[f"blocks.{l}.mlp.W_out"] = t(p[f"{m}/linear_2"]["w"])
        state[f"blocks.{l}.mlp.b_out"] = t(p[f"{m}/linear_2"]["b"])
    W_U = np.zeros((D, d_vocab))
    if output_tokens:
        labels = assembled.residual_labels
        out_values = list(assembled.output_encoder.encoding_map)
        for v, tok in zip(out_values, output_tokens, strict=False):
            W_U[labels.index(f"{sink}:{v}"), tok] = 1.0  # tracr's readout: the projection onto sink:v
    state["unembed.W_U"] = t(W_U)
    state["unembed.b_U"] = t(np.zeros(d_vocab))
    config = {
        "n_layers": L, "d_model": D, "n_heads": H, "d_head": dh, "d_mlp": d_mlp, "d_vocab": d_vocab,
        "n_ctx": max_seq_len + 1, "act_fn": "relu", "normalization_type": None,
        "attention_dir": "causal" if causal else "bidirectional", "positional_embedding_type": "standard",
        "attn_only": False, "model_name": f"tracr-{sink}",
        "original_architecture": "tracr", "default_prepend_bos": True,
    }
    return state, config


def _write_tokenizer(out: Path, tokens: list[str], model_max_length: int) -> None:
    """A word-level tokenizer (whitespace-separated values), BOS = ``compiler_bos``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({s: i for i, s in enumerate(tokens)}, unk_token=UNK))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in (BOS, PAD, UNK)])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    special = {"bos_token": BOS, "pad_token": PAD, "unk_token": UNK}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {**special, "add_bos_token": True, "model_max_length": model_max_length,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))


def tracr_forward(compiled: CompiledProgram, values: Iterable[Any]) -> dict[str, np.ndarray]:
    """tracr's own assembled model on ``values`` (BOS added): ``residuals`` (every layer output,
    ``(2 L, pos, d_model)``), ``output`` (the final residual) and ``readout`` (the output space
    projection: logits of the output values, or the numerical output)."""
    import jax.numpy as jnp

    a = compiled.assembled
    ids = a.input_encoder.encode([BOS] + list(values))
    out = a.forward(a.params, jnp.array([ids]))
    res = np.stack([np.asarray(r[0]) for r in out.transformer_output.residuals])
    final = np.asarray(out.transformer_output.output[0])
    return {"residuals": res, "output": final, "decoded": a.apply([BOS] + list(values)).decoded}
