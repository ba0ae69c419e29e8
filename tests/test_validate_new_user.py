"""What a new user gets wrong, caught by ``circuitgraph validate`` in one line before any model
loads (issue 35): node indices beyond a layer's size (read from config.json and the dictionary's
config files), a patching prompt whose token length differs from the prompt's, a target token
written without its leading space (a warning, also in the graph's metadata and the run's
summary), and what only the run can check said as ``checked at run time: ...``."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import circuitgraph
from circuitgraph.builtin import BUILTIN_MODELS
from circuitgraph.cli.main import app
from circuitgraph.pipeline.preflight import preflight, preflight_report, read_model_facts
from circuitgraph.spec import load_spec
from circuitgraph.spec.references import unit_references

DEMO = {"format_version": 1, "model": {"builtin": "demo"}, "transcoders": {"builtin": "demo"},
        "prompt": "mia saw the owl in the park . later she wants", "targets": [{"logit_diff": [" an", " a"]}]}


def _validate(tmp_path: Path, spec: dict):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return CliRunner().invoke(app, ["validate", str(path)])


# ---------------------------------------------------------------------------- unit indices
def test_every_place_a_spec_names_an_index_is_found():
    spec = load_spec({
        **DEMO,
        "targets": [{"feature": {"layer": 0, "position": -1, "index": 3}},
                    {"neuron": {"layer": 1, "position": -1, "index": 4}}],
        "queries": [{"neighbours": {"node": "attention_head/0/2/5"}},
                    {"head_split": {"source": "feature/0/1/6", "target": "logit/2/11/7"}},
                    {"de_embedding": {"node": {"kind": "neuron", "layer": 0, "index": 8}, "head": {"layer": 1, "head": 9}}},
                    {"qk": {"layer": 1, "head": [10, 11]}},
                    {"top_paths": {"source": {"kind": "feature", "layer": [0, 1], "index": [12]}}},
                    {"subgraph": {"filter": {"id": ["neuron/1/3/13", "embedding/-1/0/99"]}}}],
        "validate": [{"ablate": {"nodes": {"kind": ["neuron", "attention_head"], "index": 14}}}],
        "steer": [{"interventions": [{"node": "neuron/1/4/15", "mode": "zero"},
                                     {"nodes": {"kind": "feature", "index": 16}, "mode": "zero"}]}],
    })
    found = {(r.where, r.kind, r.layers, r.index) for r in unit_references(spec)}
    assert found == {
        ("targets[0].feature.index", "feature", (0, 0), 3),
        ("targets[1].neuron.index", "neuron", (1, 1), 4),
        ("queries[0].neighbours.node", "attention_head", (0, 0), 5),
        ("queries[1].head_split.source", "feature", (0, 0), 6),
        ("queries[2].de_embedding.node.index", "neuron", (0, 0), 8),
        ("queries[2].de_embedding.head.head", "attention_head", (1, 1), 9),
        ("queries[3].qk.head", "attention_head", (1, 1), 10),
        ("queries[3].qk.head", "attention_head", (1, 1), 11),
        ("queries[4].top_paths.source.index", "feature", (0, 1), 12),
        ("queries[5].subgraph.filter.id[0]", "neuron", (1, 1), 13),
        ("validate[0].ablate.nodes.index", "neuron", None, 14),
        ("validate[0].ablate.nodes.index", "attention_head", None, 14),
        ("steer[0].interventions[0].node", "neuron", (1, 1), 15),
        ("steer[0].interventions[1].nodes.index", "feature", None, 16),
    }


def test_indices_beyond_a_layer_are_one_line_each_before_any_model_loads(tmp_path):
    """The demo model has 4 heads and 256 neurons a layer (config.json), its transcoders 512
    features (each layer's cfg.json d_sae)."""
    spec = {
        **DEMO,
        "targets": [{"logit_diff": [" an", " a"]}, {"feature": {"layer": 1, "position": -1, "index": 512}}],
        "queries": [{"neighbours": {"node": "attention_head/0/2/4"}}, {"qk": {"layer": 1, "head": [0, 7]}},
                    {"de_embedding": {"node": {"kind": "feature", "layer": 0, "index": 511}}}],
        "validate": [{"ablate": {"nodes": {"kind": "neuron", "layer": 0, "index": [10, 256]}}}],
        "steer": [{"interventions": [{"node": "neuron/1/3/5000", "mode": "zero"},
                                     {"node": "feature/0/11/142", "mode": "zero"},
                                     {"node": "neuron/9/3/1", "mode": "zero"}]}],
    }
    res = _validate(tmp_path, spec)
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1, res.output
    for words in ["targets[1].feature.index: feature 512 requested, layer 1 has 512 features (0-511; layer_1/cfg.json)",
                  "queries[0].neighbours.node: attention_head 4 requested, layer 0 has 4 heads (0-3; config.json n_heads)",
                  "queries[1].qk.head: attention_head 7 requested, layer 1 has 4 heads",
                  "validate[0].ablate.nodes.index: neuron 256 requested, layer 0 has 256 neurons (0-255; config.json "
                  "d_mlp); use an index below 256",
                  "steer[0].interventions[0].node: neuron 5000 requested, layer 1 has 256 neurons",
                  "steer[0].interventions[2].node: layer 9 requested, the model has 2 layers"]:
        assert words in res.output, (words, res.output)
    for fine in ("feature/0/11/142", "interventions[1]", "de_embedding"):
        assert fine not in res.output
    ok = {**spec, "targets": DEMO["targets"], "queries": [], "validate": [],
          "steer": [{"interventions": [{"node": "neuron/1/3/255", "mode": "zero"}]}]}
    assert preflight(load_spec(ok)) == []
    # a layer beyond the model: once, where it is named (targets' layers by the layer check)
    beyond = load_spec({**DEMO, "targets": [{"neuron": {"layer": 5, "position": 0, "index": 0}}],
                        "queries": [{"neighbours": {"node": "feature/7/0/1"}}]})
    assert [where for where, _ in preflight(beyond)] == ["targets[0].neuron.layer", "queries[0].neighbours.node"]


def test_hugging_face_configs_give_heads_and_neurons(tmp_path):
    from transformers import GPT2Config, LlamaConfig, MixtralConfig

    LlamaConfig(num_hidden_layers=2, vocab_size=40, hidden_size=16, intermediate_size=48,
                num_attention_heads=2).save_pretrained(tmp_path / "llama")
    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40).save_pretrained(tmp_path / "gpt2")
    MixtralConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=24, num_local_experts=4,
                  num_attention_heads=2, num_key_value_heads=1, vocab_size=40).save_pretrained(tmp_path / "moe")
    facts = {k: read_model_facts(tmp_path / k) for k in ("llama", "gpt2", "moe")}
    assert (facts["llama"].n_heads, facts["llama"].n_neurons) == (2, 48)
    assert (facts["gpt2"].n_heads, facts["gpt2"].n_neurons) == (2, 64)  # n_inner null: 4 x n_embd
    assert (facts["moe"].n_heads, facts["moe"].n_neurons) == (2, 96)   # the graph numbers experts' neurons together
    spec = load_spec({"format_version": 1, "model": {"path": str(tmp_path / "llama")}, "prompt": {"tokens": [1, 2, 3]},
                      "targets": [{"neuron": {"layer": 1, "position": -1, "index": 48}}]})
    assert dict(preflight(spec)) == {"targets[0].neuron.index": "neuron 48 requested, layer 1 has 48 neurons (0-47; "
                                                                "config.json intermediate_size); use an index below 48"}


# ---------------------------------------------------------------------------- patched prompts
def test_a_patching_prompt_of_another_length_is_one_line(tmp_path):
    spec = {**DEMO, "validate": [{"patching": {"corrupted": "mia saw the owl in the the park . later she wants"}},
                                 {"ablate": {"mode": "patch", "patch_prompt": "mia saw the dog", "k": 2}},
                                 {"patching": {"corrupted": "mia saw the dog in the park . later she wants"}}]}
    res = _validate(tmp_path, spec)
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert ("validate[0].patching.corrupted: the corrupted prompt has 13 tokens and the prompt 12 (the first "
            "difference is token 7: ' the' vs ' park'); activations are patched position by position") in res.output
    assert "validate[1].ablate.patch_prompt: patch_prompt has 5 tokens and the prompt 12" in res.output
    assert "validate[2]" not in res.output  # same length: fine
    clean = {**DEMO, "validate": [{"patching": {"clean": "mia saw a owl", "corrupted": "mia saw the dog"}}]}
    assert preflight(load_spec(clean)) == []


def test_dataset_rows_corrupted_prompts_are_checked_too(tmp_path):
    rows = [{"id": "ok", "prompt": "mia saw the owl . she wants", "corrupted": "mia saw the dog . she wants"},
            {"id": "long", "prompt": "mia saw the owl . she wants", "corrupted": "mia saw the the dog . she wants"}]
    spec = {k: v for k, v in DEMO.items() if k != "prompt"}
    spec.update(dataset=rows, validate=[{"patching": {"granularity": ["layer"]}}],
                export={"dataset": str(tmp_path / "out")})
    problems = dict(preflight(load_spec(spec)))
    assert list(problems) == ["dataset row 2 (long).corrupted"]
    assert problems["dataset row 2 (long).corrupted"].startswith("the corrupted prompt has 9 tokens and its prompt 8 (the first difference is token 4: ' the' vs ' owl')")
    # the repository's demo dataset lines up
    assert preflight(load_spec(Path(__file__).resolve().parents[1] / "examples" / "demo_dataset.yaml")) == []


# ---------------------------------------------------------------------------- targets without their space
def _space_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<bos>": 1, "When": 2, " Mary": 3, "Mary": 4, " John": 5, "John": 6, " gave": 7, " to": 8,
             " and": 9, " Alice": 10, " ": 11}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex(r" ?[^\s]+| +$"), behavior="isolated")
    t.decoder = decoders.Fuse()
    return t


def _model_with_space_tokenizer(tmp_path: Path) -> Path:
    """The demo model with a tokenizer that has both "Mary" and " Mary" (and "John", " John")."""
    folder = shutil.copytree(Path(BUILTIN_MODELS["demo"]()) / "model", tmp_path / "model")
    _space_tokenizer().save(str(folder / "tokenizer" / "tokenizer.json"))
    return folder


def test_space_variant_names_both_tokens():
    from circuitgraph.adapters.tokenizer import Tokenizer

    tok = Tokenizer(_space_tokenizer(), bos_id=1, kind="files")
    assert tok.space_variant("Mary") == (4, 3) and tok.space_variant("John") == (6, 5)
    assert tok.space_variant(" Mary") is None      # written with its space
    assert tok.space_variant("Alice") is None      # only " Alice" is a token: "Alice" is not one token at all
    assert tok.space_variant("When") is None       # no " When" token
    message = tok.space_warning("Mary", where="targets[0].logit_diff[0]")
    assert message.startswith("targets[0].logit_diff[0] 'Mary' is token 4 'Mary', without a leading space, and "
                              "' Mary' is token 3 ' Mary'")


def test_a_target_without_its_space_warns_in_validate_the_summary_and_the_graph(tmp_path):
    model = _model_with_space_tokenizer(tmp_path)
    spec = {"format_version": 1, "model": {"path": str(model)}, "prompt": "When Mary and John gave to",
            "targets": [{"logit_diff": ["Mary", " John"]}], "graph": {"mlp": "mlp", "attention": "heads"}}
    res = _validate(tmp_path, spec)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("spec OK: ")
    warns = [x for x in lines if x.startswith("warning: ")]
    assert warns == ["warning: targets[0].logit_diff[0] 'Mary' is token 4 'Mary', without a leading space, and "
                     "' Mary' is token 3 ' Mary': after a word the next token carries the space, so write ' Mary' "
                     "unless the prompt ends where 'Mary' follows"]
    result = circuitgraph.run(spec)
    recorded = [w for w in result.graph.metadata["warnings"] if "'Mary' is token 4" in w]
    assert len(recorded) == 1 and recorded[0] == warns[0][len("warning: "):]
    assert f"warning: {recorded[0]}" in result.summary_lines()
    # written with the space, or after a prompt that ends in a space: no warning
    for fixed in ({**spec, "targets": [{"logit_diff": [" Mary", " John"]}]},
                  {**spec, "prompt": "When Mary and John gave to "}):
        assert not preflight_report(load_spec(fixed)).warnings
        assert not [w for w in circuitgraph.run(fixed).graph.metadata["warnings"] if "leading space" in w]


# ---------------------------------------------------------------------------- what only the run knows
def test_what_validate_cannot_know_is_said(tmp_path):
    res = _validate(tmp_path, {**DEMO, "steer": [{"interventions": [{"node": "feature/0/11/142", "mode": "zero"}]}]})
    assert res.exit_code == 0, res.output
    assert "checked at run time: which graph nodes the node filters and node ids match" in res.output
    assert _validate(tmp_path, DEMO).output.count("checked at run time") == 0
    hub = load_spec({"format_version": 1, "model": {"name": "gpt2"}, "prompt": "hello there",
                     "targets": [{"logit": " world"}]})
    notes = preflight_report(hub).unchecked
    assert any(n.startswith("the model's layers, heads, neurons and vocabulary (a hub name") for n in notes)
    assert any(n.startswith("the prompt's length, positions and token strings") for n in notes)


# ---------------------------------------------------------------------------- the real model
VALIDATE_ONLY = """
import sys, time
from typer.testing import CliRunner
from circuitgraph.cli.main import app
t = time.perf_counter()
res = CliRunner().invoke(app, ["validate", sys.argv[1]])
print(repr(res.output))
print(res.exit_code, round(time.perf_counter() - t, 3))
print(sorted(m for m in ("torch", "transformers", "transformer_lens", "safetensors.torch") if m in sys.modules))
"""


def _validate_real(tmp_path: Path, spec: dict) -> tuple[str, int, float, list[str]]:
    """``validate`` in a fresh interpreter: its output, exit status, seconds, and which of torch,
    transformers, TransformerLens and safetensors' torch loader it imported (none: no model built,
    no weights read)."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-c", VALIDATE_ONLY, str(path)], capture_output=True, text=True,
                          timeout=120, check=True, cwd=Path(__file__).resolve().parents[1])
    out, status, imported = done.stdout.splitlines()[-3:]
    code, seconds = status.split()
    return ast.literal_eval(out), int(code), float(seconds), ast.literal_eval(imported)


@pytest.mark.real
def test_the_new_users_mistakes_on_smollm2_are_one_line_without_weights(tmp_path, smollm2_dir):
    ioi = {"format_version": 1, "model": {"path": str(smollm2_dir)},
           "prompt": "When Mary and John went to the store, John gave a drink to",
           "targets": [{"logit_diff": [" Mary", " John"]}], "graph": {"mlp": "mlp", "attention": "heads"}}
    cases = {
        "patching": ({**ioi, "validate": [{"patching": {
            "corrupted": "When Mary and John went to the supermarket, Bartholomew gave a drink to"}}]},
            "validate[0].patching.corrupted: the corrupted prompt has 17 tokens and the prompt 15"),
        "steering": ({**ioi, "graph": {"mlp": "neurons", "attention": "heads"},
                      "steer": [{"interventions": [{"node": "neuron/3/5/5000", "mode": "zero"}]}]},
                     "steer[0].interventions[0].node: neuron 5000 requested, layer 3 has 1536 neurons (0-1535; "
                     "config.json intermediate_size)"),
        "space": ({**ioi, "targets": [{"logit_diff": ["Mary", "John"]}]},
                  "warning: targets[0].logit_diff[0] 'Mary' is token 25653 'Mary', without a leading space, and "
                  "' Mary' is token 5099 ' Mary'"),
    }
    for name, (spec, words) in cases.items():
        out, code, seconds, imported = _validate_real(tmp_path, spec)
        assert words in out, (name, out)
        assert code == (0 if name == "space" else 2), (name, out)
        assert imported == [] and seconds < 20, (name, imported, seconds)
        if name != "space":
            assert out.count("\n") == 1, out
    assert json.loads((smollm2_dir / "config.json").read_text())["intermediate_size"] == 1536
    t = time.perf_counter()
    assert read_model_facts(smollm2_dir).n_neurons == 1536 and time.perf_counter() - t < 1
