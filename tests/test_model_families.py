"""The conformance suite: every supported family passes the same checks, the same way.

For each row of :data:`circuitgraph.adapters.hf_config.FAMILIES` a tiny random checkpoint is made
by transformers's own ``from_config`` and ``save_pretrained`` (no download,
:mod:`circuitgraph.testing.hf_checkpoints`) and:

* loaded through the spec (``model: {path: DIR}``), its logits equal transformers's own forward
  (float32 round-off), and the graph's metadata records ``model.format: huggingface``;
* every reader is complete (pre-activation = incoming edges + constant, float64);
* every edge equals the independent forward-ablation reference of
  ``tests/test_edges_independent.py`` (TransformerLens hooks only, none of the engine's vectors),
  in float64, with neurons and frozen attention in layer 0 and heads as nodes in layer 1;
* QK attribution's sums equal the model's own pre-softmax scores on every head (query/key norms
  frozen on the prompt: Qwen3, Gemma-3, OLMo-2, OLMoE, Qwen3-MoE), or, for a family whose row says
  why not (``Family.qk``), QK refuses;
* loaded by hub name from a local Hugging Face cache laid out exactly as the hub's
  (``models--ORG--REPO/snapshots/<commit>/``, ``refs/main``), offline, the same logits.

Adding a family is adding a row to FAMILIES and a tiny config to TINY_CONFIGS.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import circuitgraph
from circuitgraph.adapters.hf_config import FAMILIES
from circuitgraph.errors import LoadError, QueryError
from circuitgraph.testing.hf_checkpoints import TINY_CONFIGS, save_checkpoint, tiny_checkpoint
from circuitgraph.testing.synthetic import hf_cache_repo
from tests.helpers.edges import Reference, assert_edges_equal, removal_effects

TOKENS = [1, 5, 7, 9, 4, 3, 11, 6, 8, 10]
FAMILY_NAMES = sorted(FAMILIES)
_BUILT: dict[str, dict] = {}


def _spec(model: dict, **graph) -> dict:
    return {"format_version": 1, "model": model, "prompt": {"tokens": TOKENS},
            "targets": [{"top_logits": {"max_n": 3}}], "graph": graph}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(family)``: the family's checkpoint folder, transformers model and float64 graph
    (neurons; attention frozen in layer 0, heads in layer 1), made once per module."""

    def get(family: str) -> dict:
        if family not in _BUILT:
            ref = tiny_checkpoint(family)
            folder = save_checkpoint(ref, tmp_path_factory.mktemp(family) / "ckpt")
            g = circuitgraph.run(_spec({"path": str(folder)}, mlp="neurons", attention={0: "frozen", 1: "heads"},
                                       dtype="float64")).graph
            _BUILT[family] = {"folder": folder, "ref": ref, "graph": g}
        return _BUILT[family]

    return get


def test_one_table_every_family_has_a_tiny_checkpoint():
    assert set(TINY_CONFIGS) == set(FAMILIES)
    from transformers import AutoConfig, AutoModelForCausalLM

    from circuitgraph.adapters.hf_config import _ARCH_OF

    for key, family in FAMILIES.items():
        assert family.model_type == key and family.name and family.frozen
        cls = AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(key))]
        assert _ARCH_OF[key] == cls.__name__


def _logits_match(model, ref) -> float:
    with torch.no_grad():
        ours = model(torch.tensor([TOKENS]))[0].float()
        theirs = ref(torch.tensor([TOKENS])).logits[0]
    diff = float((ours - theirs).abs().max())
    assert diff < 1e-4 * max(1.0, float(theirs.abs().max())), diff
    return diff


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_folder_loads_through_the_spec_and_matches_transformers(family, built):
    """The fixture's graph was built by the spec from ``model: {path: DIR}`` (in float64; the
    float32 load is the hub-name test's): the logits are transformers's to float32 round-off."""
    b = built(family)
    g = b["graph"]
    assert g.metadata["model"]["format"] == "huggingface"
    assert g.metadata["spec"]["model"]["path"] and g.metadata["spec"]["model"].get("name") is None
    model = g.context.adapter.model
    assert model.cfg.n_layers == 2 and g.context.adapter.family == family
    _logits_match(model, b["ref"])
    assert g.context.adapter.tokenizer is not None  # the tokenizer files at the folder's root


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_complete_on_every_reader_float64(family, built):
    g = built(family)["graph"]
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-11
    kinds = {n.kind for n in g.nodes if n.pre_activation is not None}
    assert {"neuron", "logit"} <= kinds


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_edge_equals_the_independent_reference(family, built):
    g = built(family)["graph"]
    adapter = g.context.adapter
    if adapter.facts.num_experts:
        pytest.skip("expert neurons: tests/test_moe.py checks every MoE edge against its own independent "
                    "reference (writers from transformers's experts)")
    heads = {n.layer for n in g.nodes if n.kind == "attention_head"}
    assert heads == {1}
    ref = Reference(adapter.transformer_lens_model(), TOKENS, {}, heads)
    writers = [n.id for n in g.nodes if n.kind in ("embedding", "attention_head", "neuron")]
    removals = [(hook, w.position, vec) for w in writers for hook, vec in [ref.writer_vector(w)]]
    captured = ref.run(removals)
    readers = [n for n in g.nodes if n.pre_activation is not None]
    expected = removal_effects(g, readers, lambda r: ref.reader_values(r, captured))
    assert_edges_equal(g, readers, writers, expected)
    # edges cross the frozen attention of layer 0: a writer reaches a later position
    assert any(expected[i, j] != 0 and writers[j].position < readers[i].id.position
               for i in range(len(readers)) for j in range(len(writers)))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_validation_interventions_agree_with_the_edges(family, built):
    """circuitgraph's own intervention path (validation.frozen: the real model with frozen sigmas,
    patterns and node outputs, one writer removed) reproduces the measured values and the edges."""
    from circuitgraph.validation.frozen import frozen_ablation_effects, frozen_reader_values

    g = built(family)["graph"]
    base = frozen_reader_values(g.context)
    assert all(base[n.id] == pytest.approx(n.pre_activation, abs=1e-9) for n in g.nodes if n.id in base)
    by_kind: dict[str, list] = {}
    for n in g.nodes:
        if n.kind in ("embedding", "attention_head", "neuron"):
            by_kind.setdefault(n.kind, []).append(n.id)
    sample = [w for ws in by_kind.values() for w in ws[-3:]]
    effects = frozen_ablation_effects(g.context, sample)
    dense = g.dense_adjacency(dtype=np.float64)
    worst = max(abs(v - dense[g.index_of(r), g.index_of(w)]) for w, row in effects.items() for r, v in row.items())
    assert worst < 1e-9 * np.abs(dense).max()


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_qk_sums_equal_the_model_scores(family, built):
    from circuitgraph.queries import qk
    from circuitgraph.validation.qk_check import qk_check
    from tests.helpers.qk import check_every_head

    g = built(family)["graph"]
    reason = FAMILIES[family].qk
    if reason is None:
        check_every_head(g, g.context.adapter, TOKENS, 1e-10, key_positions=("top", -2))  # in every window
        # the intervention check: each top pair's node removed in the frozen model moves the real score
        check = qk_check(g, 1, list(range(g.context.adapter.facts.n_heads)), -1, "top", top_k=3)
        assert check.ok and check.rows, check.max_relative_deviation
    else:  # a row that says why QK attribution is not exact on it: QK refuses
        with pytest.raises(QueryError):
            qk(g, 0, 0, -1, "top")


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_hub_name_from_a_local_cache(family, built, tmp_path, monkeypatch):
    b = built(family)
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = f"tiny-org/tiny-{family.replace('_', '-')}"
    snap = hf_cache_repo(cache, repo, b["folder"])
    assert (cache / f"models--tiny-org--tiny-{family.replace('_', '-')}" / "refs" / "main").read_text() == snap.name
    g = circuitgraph.run(_spec({"name": repo}, mlp="neurons")).graph  # float32
    assert g.metadata["model"]["format"] == "huggingface" and g.context.adapter.dtype == torch.float32
    assert g.metadata["model"]["source"]["name"] == repo
    _logits_match(g.context.adapter.model, b["ref"])
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5


#: checkpoints of the families with other settings than TINY_CONFIGS: each must load and match
VARIANTS = [
    ("gpt_neox", dict(use_parallel_residual=False)),  # a sequential NeoX
    ("olmo2", dict(num_key_value_heads=2)),  # grouped-query OLMo-2 (the 32B)
    ("phi3", dict(sliding_window=4)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    ("gemma3_text", dict(layer_types=None, num_hidden_layers=7, sliding_window=3)),  # the default 5:1 pattern
    ("gemma3_text", dict(rope_parameters={  # linear rope scaling of the global layers (Gemma-3 4B+)
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})),
    ("smollm3", dict(no_rope_layers=None, num_hidden_layers=4)),  # NoPE every 4th layer
    ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True)),
]


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=[f"{f}-{'-'.join(o)}" for f, o in VARIANTS])
def test_family_variants_load_and_match_transformers(family, overrides, tmp_path):
    from circuitgraph.adapters.loading import load_hf_dir

    ref = tiny_checkpoint(family, **overrides)
    adapter = load_hf_dir(save_checkpoint(ref, tmp_path / "ckpt"))
    _logits_match(adapter.model, ref)


def test_a_checkpoint_the_row_does_not_convert_is_refused(tmp_path):
    """Llama with attention and MLP biases: TransformerLens's Llama conversion drops them, so the
    load-time check against transformers's forward refuses the model in one line."""
    folder = save_checkpoint(tiny_checkpoint("llama", attention_bias=True, mlp_bias=True), tmp_path / "ckpt")
    with pytest.raises(LoadError, match="does not match transformers's forward") as err:
        circuitgraph.run(_spec({"path": str(folder)}))
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------ the folder itself
def test_sharded_folder_with_its_index(tmp_path):
    ref = tiny_checkpoint("llama")
    folder = save_checkpoint(ref, tmp_path / "ckpt", max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    g = circuitgraph.run(_spec({"path": str(folder)}, mlp="neurons")).graph
    _logits_match(g.context.adapter.model, ref)
    (folder / sorted(folder.glob("model-*.safetensors"))[0].name).unlink()
    with pytest.raises(LoadError, match="lists shard"):
        circuitgraph.run(_spec({"path": str(folder)}))


def test_unsupported_model_type_is_one_line(tmp_path):
    from circuitgraph.adapters.files import check_input_files
    from circuitgraph.spec import load_spec

    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    with pytest.raises(LoadError) as err:
        circuitgraph.run(_spec({"path": str(folder)}))
    msg = str(err.value)
    assert "\n" not in msg and "'bert'" in msg and "GPT-NeoX / Pythia (gpt_neox)" in msg and "OLMo-2" in msg
    with pytest.raises(LoadError, match="'bert' is not a supported family"):  # validate reads only config.json
        check_input_files(load_spec(_spec({"path": str(folder)})))


def test_validate_reads_a_huggingface_folder(tmp_path):
    from circuitgraph.adapters.files import check_input_files
    from circuitgraph.spec import load_spec

    folder = save_checkpoint(tiny_checkpoint("gpt_neox"), tmp_path / "ckpt")
    check_input_files(load_spec(_spec({"path": str(folder)})))  # no error: supported, files readable
    (folder / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(LoadError, match="not a valid safetensors file"):
        check_input_files(load_spec(_spec({"path": str(folder)})))


def test_no_code_from_the_folder_runs(tmp_path):
    """A folder whose config.json points transformers at Python it ships (auto_map) loads with
    transformers's own class of the family; the shipped module is never imported."""
    folder = save_checkpoint(tiny_checkpoint("llama"), tmp_path / "ckpt")
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                    "from transformers import LlamaConfig as EvilConfig\n"
                                    "from transformers import LlamaForCausalLM as EvilModel\n")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(cfg))
    circuitgraph.run(_spec({"path": str(folder)}, mlp="neurons"))
    assert not marker.exists()


def test_parallel_block_mlp_reads_the_block_input(built):
    """In a parallel block the MLP neurons read x_pre: no edge from the block's own attention."""
    g = built("gpt_neox")["graph"]
    assert g.context.adapter.facts.parallel_attn_mlp
    heads1 = {g.index_of(n.id) for n in g.nodes if n.kind == "attention_head" and n.layer == 1}
    neurons1 = {g.index_of(n.id) for n in g.nodes if n.kind == "neuron" and n.layer == 1}
    src, tgt = np.asarray(g.edge_source), np.asarray(g.edge_target)
    assert heads1 and neurons1
    assert not np.any(np.isin(src, list(heads1)) & np.isin(tgt, list(neurons1)))


def test_validate_and_dry_run_from_the_command_line(tmp_path):
    """``circuitgraph validate`` and ``run --dry-run`` read a Hugging Face folder's config.json and
    safetensors headers (the supported-family check), and refuse an unsupported one in one line."""
    import yaml
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    runner = CliRunner()
    folder = save_checkpoint(tiny_checkpoint("phi3"), tmp_path / "ckpt")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec({"path": str(folder)}, mlp="neurons")))
    for args in (["validate", str(spec)], ["run", str(spec), "--dry-run"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, model_type="mamba")))
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "'mamba' is not a supported family" in lines[0], res.output


def test_hub_names_not_in_the_cache_or_unsupported_are_one_line(tmp_path, monkeypatch, built):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoadError, match="no config.json in the local Hugging Face cache") as err:
        circuitgraph.run(_spec({"name": "tiny-org/absent"}))
    assert "huggingface-cli download tiny-org/absent" in str(err.value)
    folder = tmp_path / "mamba"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    hf_cache_repo(cache, "tiny-org/mamba", folder)
    with pytest.raises(LoadError, match="'mamba' is not a supported family"):
        circuitgraph.run(_spec({"name": "tiny-org/mamba"}))
    # config.json cached but not the weights: what to download, in one line
    only_config = tmp_path / "partial"
    only_config.mkdir()
    (only_config / "config.json").write_text((built("llama")["folder"] / "config.json").read_text())
    hf_cache_repo(cache, "tiny-org/partial", only_config)
    with pytest.raises(LoadError) as err:
        circuitgraph.run(_spec({"name": "tiny-org/partial"}))
    assert "\n" not in str(err.value) and "tiny-org/partial" in str(err.value)


@pytest.mark.parametrize("family", ["gpt_neox", "gptj"])
@pytest.mark.parametrize("kind", ["relu", "skip"])
def test_transcoders_on_parallel_blocks_equal_the_independent_reference(family, kind, built, tmp_path):
    """sae-lens transcoders reading ln2 of the block input (its own norm in NeoX, the shared one in
    GPT-J); a skip transcoder's linear path from x_pre: every edge (features, errors, heads) equals
    the libraries' removal, and the graph is complete."""
    from circuitgraph.adapters.loading import load_hf_dir
    from circuitgraph.attribution import attribute
    from circuitgraph.dictionaries import TranscoderSet
    from circuitgraph.testing.synthetic import random_transcoders

    folder = built(family)["folder"]
    raw = random_transcoders(load_hf_dir(folder).model, kind=kind, input_site="normalized", seed=3, active_frac=0.3)
    adapter = load_hf_dir(folder, dtype="float64")
    for layer, tc in raw.items():
        tc.save_model(str(tmp_path / "tc" / f"layer_{layer}"))
    tcs = TranscoderSet.from_dir(tmp_path / "tc", adapter, dtype=torch.float64)
    g = attribute(adapter, TOKENS, tcs, dtype=torch.float64, attention={0: "frozen", 1: "heads"})
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-11
    raw = {layer: tc.to(torch.float64) for layer, tc in raw.items()}
    ref = Reference(adapter.transformer_lens_model(), TOKENS, raw, {1})
    writers = [n.id for n in g.nodes if n.kind in ("embedding", "feature", "error", "attention_head")]
    captured = ref.run([(hook, w.position, vec) for w in writers for hook, vec in [ref.writer_vector(w)]])
    readers = [n for n in g.nodes if n.pre_activation is not None]
    assert {"feature", "logit"} <= {n.kind for n in readers}
    expected = np.stack([(lambda v: (v[0] - v[1:]).numpy())(ref.reader_values(r, captured).double())
                         for r in readers])
    got = g.dense_adjacency(dtype=np.float64)[np.ix_([g.index_of(r.id) for r in readers],
                                                     [g.index_of(w) for w in writers])]
    assert np.abs(got - expected).max() < 1e-9 * np.abs(expected).max()


def test_fold_ln_keeps_the_model_and_is_refused_without_input_norms(built):
    from circuitgraph.adapters.loading import load_hf_dir

    b = built("llama")
    adapter = load_hf_dir(b["folder"], fold_ln=True)
    assert adapter.facts.ln_folded
    _logits_match(adapter.model, b["ref"])
    with pytest.raises(LoadError, match="OLMo-2 has no input norms"):
        load_hf_dir(built("olmo2")["folder"], fold_ln=True)
