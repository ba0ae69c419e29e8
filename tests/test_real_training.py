"""The real-model tier of `circuitgraph train`: a tiny transcoder set trained on SmolLM2-135M-Instruct,
loaded by circuitgraph into a complete feature graph, and the same graph from circuit-tracer 0.5.0
(its own loaders on the folder as written, in its own virtualenv) edge for edge.

Every layer is trained (circuit-tracer's TranscoderSet needs layers 0..n-1), 16 features each, on
about 500 tokens of text written here (no file of this machine is read): seconds of training; the
dictionaries are poor, which does not matter for what is checked (exact identities and agreement).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.attribution import attribute
from circuitgraph.dictionaries import load_dictionaries
from tests.helpers.peers import circuit_tracer_or_skip

pytestmark = [pytest.mark.real, pytest.mark.filterwarnings("ignore::circuitgraph.errors.DequantisedWeightsWarning")]

PROMPT = "When Mary and John went to the store, John gave a drink to"
TEXT = "\n%\n".join([
    "The cat sat on the mat and looked at an owl in the old oak tree.",
    "A penny saved is a penny earned, said the man who had no pennies left.",
    "When the rain stopped, the children ran out to the park to play with a red ball.",
    "An apple a day keeps the doctor away, but only if you aim well.",
    "Mary gave John a book, and John gave Mary an umbrella for the long walk home.",
    "The computer would not start, so she read the manual from the first page to the last.",
    "He who laughs last has not yet heard the joke, wrote an unknown author in a letter.",
    "They went to the store to buy bread, milk, eggs and a small bag of coffee.",
] * 3)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return load_model_dir(smollm2_dir)


@pytest.fixture(scope="module")
def trained(smollm2, smollm2_dir, tmp_path_factory):
    """`circuitgraph train` on the real model: every layer, 16 ReLU features, ~500 tokens."""
    from circuitgraph.spec.train import load_train_spec
    from circuitgraph.training import train

    work = tmp_path_factory.mktemp("real_train")
    (work / "text.txt").write_text(TEXT)
    spec = load_train_spec({"format_version": 1, "model": {"path": str(smollm2_dir)},
                            "train": {"text": [str(work / "text.txt")], "output": str(work / "out"), "width": 16,
                                      "context": 32, "tokens": 496, "batch": 8, "eval_tokens": 62, "seed": 0}})
    metrics = train(spec, adapter=smollm2)
    return work / "out", metrics


def test_trained_set_loads_and_its_graph_is_complete(smollm2, trained):
    """The folder holds circuit-tracer's transcoder_set layout for all 30 layers, metrics.json
    says the spliced-in loss beats zero-ablated MLPs, circuitgraph loads it, its reconstruction of an
    MLP output equals one computed straight from the safetensors file, and the feature graph on the
    IOI prompt is complete."""
    from safetensors.torch import load_file

    from circuitgraph.training.activation_stream import layer_activations

    out, metrics = trained
    folder = out / "dictionaries"
    assert "model_kind: transcoder_set" in (folder / "config.yaml").read_text()
    assert sorted(p.name for p in folder.glob("layer_*.safetensors")) == sorted(f"layer_{l}.safetensors"
                                                                              for l in range(30))
    on_disk = json.loads((out / "metrics.json").read_text())
    ce = on_disk["eval"]["ce_loss"]
    assert ce == metrics["eval"]["ce_loss"] and ce["model"] < ce["spliced"] < ce["zero_ablated"]
    tcs = load_dictionaries(folder, smollm2)
    assert sorted(tcs.layers) == list(range(30))
    tokens = torch.tensor([[smollm2.tokenizer.bos_id, *smollm2.tokenizer.encode(PROMPT)]])
    x, _ = layer_activations(smollm2, tokens, [7], skip_first=True)
    w = load_file(str(folder / "layer_7.safetensors"))
    acts = torch.relu(x[0] @ w["W_enc"].T + w["b_enc"])
    ours = tcs[7].activation(x[0])
    assert torch.allclose(ours, acts, atol=1e-5, rtol=1e-5)
    recon = tcs.reconstruct({7: ours}, {7: x[0]})[7]
    assert torch.allclose(recon, acts @ w["W_dec"] + w["b_dec"], atol=1e-4, rtol=1e-4)
    graph = attribute(smollm2, tokens[0], tcs, max_feature_nodes=128)
    assert graph.check_completeness().max_violation < 1e-4
    assert sum(1 for n in graph.nodes if n.kind == "feature") == 128


def test_graph_agrees_with_circuit_tracer(smollm2, smollm2_dir, trained, tmp_path):
    """circuit-tracer 0.5.0 reads the trained folder with its own load_transcoder_set and the real
    model through TransformerLens; its attribution graph on the same tokens (128 feature nodes by its
    influence rule) equals circuitgraph's: the same targets and feature nodes, every edge within
    1e-5 of the largest (float32 round-off)."""
    circuit_tracer_or_skip()
    import subprocess

    from benchmarks import real_side_by_side as sbs
    from circuitgraph.testing.circuit_tracer import circuit_tracer_python

    python = circuit_tracer_python()
    folder = trained[0] / "dictionaries"
    bundle = sbs.make_tl_bundle(python, smollm2_dir, tmp_path / "bundle" / "model")
    tokens = [smollm2.tokenizer.bos_id, *smollm2.tokenizer.encode(PROMPT)]
    out = tmp_path / "ct" / "graph.npz"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"}
    subprocess.run(sbs.ct_argv(python, bundle, folder, tokens, out, 128), check=True, capture_output=True, env=env,
                   timeout=600)
    graph = attribute(smollm2, tokens, load_dictionaries(folder, smollm2), max_feature_nodes=128)
    r = sbs.compare(graph, out, tokens)
    assert r["targets_equal"] and r["input_tokens_equal"], r
    assert r["selected_features"]["selected_features_equal"], r["selected_features"]
    assert r["max_difference_relative_to_largest_edge"] < 1e-5, r
    assert r["largest_ct_entry_without_circuitgraph_edge"] == 0.0, r
