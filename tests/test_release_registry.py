"""``transcoders: {release: R}`` through sae-lens's registry, offline, without ids.

Each test builds a local Hugging Face cache in the hub's exact layout (blobs, snapshot links,
refs; ``circuitgraph.testing.synthetic.hf_cache_repo``) holding a tiny random checkpoint of the
release's model (transformers' own classes: real config.json and tensor names) and the
release's files at the paths sae-lens's registry lists for it (real file names, tiny random
weights), with HF_HUB_OFFLINE=1.  The graph must be complete and every feature activation must
equal the dictionary's forward computed here from the raw files on what the model really feeds
its MLP (a forward pre-hook on ``blocks[l].mlp``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from circuitgraph.dictionaries.registry import release_entry, release_layers
from circuitgraph.errors import LoadError
from circuitgraph.testing.synthetic import hf_cache_repo

TOKENS = [1, 5, 7, 9, 4, 3, 11, 6]
D, F = 16, 12


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _cache_model(cache: Path, tmp: Path, repo: str, family: str, n_layers: int) -> None:
    """A tiny random checkpoint of ``family`` cached as ``repo`` (no tokenizer: token-id prompts)."""
    import transformers as tf

    common = dict(vocab_size=64, hidden_size=D, intermediate_size=24, num_hidden_layers=n_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if family == "qwen3":
        cfg, cls = tf.Qwen3Config(**common, head_dim=8, tie_word_embeddings=True), tf.Qwen3ForCausalLM
    elif family == "gemma2":
        cfg, cls = tf.Gemma2Config(**common, head_dim=8, query_pre_attn_scalar=8, sliding_window=4), \
            tf.Gemma2ForCausalLM
    else:
        cfg, cls = tf.GPT2Config(vocab_size=64, n_positions=64, n_embd=D, n_layer=n_layers, n_head=4), \
            tf.GPT2LMHeadModel
    torch.manual_seed(0)
    m = cls(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():  # norm weights/biases away from 1/0: a missed fold must show
            p.add_(0.2 * torch.randn_like(p))
    m.save_pretrained(tmp / "ckpt")
    hf_cache_repo(cache, repo, tmp / "ckpt")


def _mlp_inputs(model) -> dict[int, torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    handles = [b.mlp.register_forward_pre_hook(lambda m, a, l=l: seen.__setitem__(l, a[0][0].detach().clone()))
               for l, b in enumerate(model.blocks)]
    try:
        with torch.no_grad():
            model(torch.tensor([TOKENS]))
    finally:
        for h in handles:
            h.remove()
    return seen


def _reader_pre(g, n) -> float:
    """The graph's reader of feature ``n`` on the residual stream (folded encoder row and bias)."""
    r = g.context.reader(n.id)
    x = g.context.linearisation.resid_mid[n.layer][n.position]
    return float(r.direction.double() @ x.double() + r.own_constant)


def _run(model: str, release: str, **extra):
    import circuitgraph

    return circuitgraph.run({"format_version": 1, "model": {"name": model},
                             "transcoders": {"release": release, **extra}, "prompt": {"tokens": TOKENS},
                             "targets": [{"top_logits": {"max_n": 2}}]}).graph


def _layer_of_path(path: str) -> int:
    import re

    return int(re.search(r"layer_(\d+)", path).group(1))


def test_mwhanna_qwen3_release_without_ids(hub, tmp_path):
    """mwhanna-qwen3-0.6b-transcoders-lowl0: layer_<l>.safetensors (circuit-tracer tensors, W_enc
    stored (d_sae, d_model)) reading mlp.hook_in, writing hook_mlp_out; 28 layers as the registry lists."""
    from safetensors.torch import save_file

    R = "mwhanna-qwen3-0.6b-transcoders-lowl0"
    entry = release_entry(R)
    n_layers = len(entry.saes_map)
    assert entry.model == "qwen3-0.6b" and n_layers == 28
    _cache_model(hub, tmp_path, "Qwen/Qwen3-0.6B", "qwen3", n_layers)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.yaml").write_text("model_name: Qwen/Qwen3-0.6B\nmodel_kind: transcoder_set\n"
                                      "feature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n")
    (repo / "wandb-config.yaml").write_text(f"d_model:\n  value: {D}\nd_feature:\n  value: {F}\n"
                                            "batch_size:\n  value: 1024\n")
    gen = torch.Generator().manual_seed(1)
    files = {}
    for path in entry.saes_map.values():
        t = {"W_enc": torch.randn(F, D, generator=gen) / D**0.5, "b_enc": 0.3 * torch.randn(F, generator=gen),
             "W_dec": torch.randn(F, D, generator=gen) / F**0.5, "b_dec": 0.1 * torch.randn(D, generator=gen)}
        save_file(t, str(repo / path))
        files[_layer_of_path(path)] = t
    hf_cache_repo(hub, entry.repo_id, repo)

    g = _run("qwen3-0.6b", R)
    meta = g.metadata["transcoders"]
    assert meta["format"] == "circuit_tracer_transcoder_set" and meta["source"]["release"] == R
    assert meta["source"]["ids"] == {str(l): f"layer_{l}" for l in range(n_layers)}
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    x = _mlp_inputs(g.context.adapter.model)
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert len({n.layer for n in feats}) > n_layers // 2
    for n in feats:
        t = files[n.layer]
        h = float(x[n.layer][n.position] @ t["W_enc"][n.index] + t["b_enc"][n.index])
        assert h > 0 and abs(n.activation - h) < 1e-5 * max(1.0, abs(h)), n.id
        assert abs(_reader_pre(g, n) - h) < 1e-5 * max(1.0, abs(h)), n.id

    # a layer file missing from the cache: one line naming the repository, the file and the command
    from circuitgraph.dictionaries.registry import load_release

    snap = next((hub / ("models--" + entry.repo_id.replace("/", "--")) / "snapshots").iterdir())
    (snap / "layer_3.safetensors").unlink()
    with pytest.raises(LoadError) as info:
        load_release(R, g.context.adapter)
    msg = str(info.value)
    assert "\n" not in msg and f"{entry.repo_id}/layer_3.safetensors" in msg
    assert f"huggingface-cli download {entry.repo_id} layer_3.safetensors" in msg
    # the layers asked for are the only files fetched: without layer 3, layers 0 and 5 still load
    assert sorted(load_release(R, g.context.adapter, layers=[0, 5]).layers) == [0, 5]


def test_gemma_scope_transcoders_release_follows_the_registry(hub, tmp_path):
    """gemma-scope-2b-pt-transcoders: layer_<l>/width_16k/average_l0_<n>/params.npz, the one width
    and L0 per layer sae-lens's registry names (a decoy folder of another L0 is in the cache too)."""
    R = "gemma-scope-2b-pt-transcoders"
    entry = release_entry(R)
    n_layers = len(entry.saes_map)
    assert entry.model == "gemma-2-2b" and n_layers == 26
    _cache_model(hub, tmp_path, "google/gemma-2-2b", "gemma2", n_layers)
    repo = tmp_path / "repo"
    gen = torch.Generator().manual_seed(2)
    files = {}
    for path in entry.saes_map.values():
        t = {"W_enc": np.asarray(torch.randn(D, F, generator=gen) / D**0.5),
             "W_dec": np.asarray(torch.randn(F, D, generator=gen) / F**0.5),
             "b_enc": np.asarray(0.3 * torch.randn(F, generator=gen)), "b_dec": np.asarray(0.1 * torch.randn(D, generator=gen)),
             "threshold": np.asarray(0.1 * torch.rand(F, generator=gen))}
        (repo / path).mkdir(parents=True)
        np.savez(repo / path / "params.npz", **t)
        files[_layer_of_path(path)] = {k: torch.from_numpy(v) for k, v in t.items()}
    decoy = repo / "layer_0" / "width_16k" / "average_l0_999"
    decoy.mkdir(parents=True)
    np.savez(decoy / "params.npz", **{k: np.full_like(v.numpy(), np.nan) for k, v in files[0].items()})
    hf_cache_repo(hub, entry.repo_id, repo)

    g = _run("gemma-2-2b", R)
    meta = g.metadata["transcoders"]
    assert meta["format"] == "gemmascope" and meta["source"]["ids"]["0"] == "layer_0/width_16k/average_l0_76"
    assert meta["layers"][0]["hook_in"] == "blocks.0.ln2.hook_normalized"  # sae-lens's hook for this conversion
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    model = g.context.adapter.model
    x = _mlp_inputs(model)
    # the pre-MLP RMSNorm's output before its weight: the MLP's input divided by the norm's weight
    xn = {l: x[l] / model.blocks[l].ln2.w.detach() for l in x}
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert len({n.layer for n in feats}) > n_layers // 2
    for n in feats:
        t = files[n.layer]
        h = float(xn[n.layer][n.position] @ t["W_enc"][:, n.index] + t["b_enc"][n.index])
        assert h > float(t["threshold"][n.index]) and abs(n.activation - h) < 1e-5 * max(1.0, abs(h)), n.id
        assert abs(_reader_pre(g, n) - h) < 1e-5 * max(1.0, abs(h)), n.id

    # mntss-gemma-2-2b-2.5m-clt-as-per-layer: sae-lens loads each layer of this CLT as a per-layer
    # transcoder with its decoders summed; circuitgraph loads the repository as the CLT it is
    R = "mntss-gemma-2-2b-2.5m-clt-as-per-layer"
    entry = release_entry(R)
    assert entry.model == "gemma-2-2b"
    from circuitgraph.testing.synthetic import random_clt, save_clt

    clt = random_clt(g.context.adapter.model, d_transcoder=8, input_site="mlp_input", activation="jump_relu")
    clt["config"]["model_name"] = "google/gemma-2-2b"
    d = save_clt(tmp_path / "clt", clt)
    hf_cache_repo(hub, entry.repo_id, d)
    g = _run("gemma-2-2b", R)
    meta = g.metadata["transcoders"]
    assert meta["format"] == "circuit_tracer_clt" and meta["source"]["release"] == R
    assert meta["feature_input_hook"] == "mlp.hook_in"
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert len({n.layer for n in feats}) > n_layers // 2
    for n in feats:
        t = clt["layers"][n.layer]
        h = float(x[n.layer][n.position] @ t["W_enc"][n.index] + t["b_enc"][n.index])
        assert abs(n.activation - h) < 1e-5 * max(1.0, abs(h)), n.id
        assert abs(_reader_pre(g, n) - h) < 1e-5 * max(1.0, abs(h)), n.id
    with pytest.raises(LoadError, match="cross-layer transcoder"):
        _run("gemma-2-2b", R, layers=[0, 1])


def _plain_release(monkeypatch, name: str, repo_id: str, paths: dict[str, str], model: str = "gpt2-small"):
    """Add a sae-lens-format release (no conversion_func) to the registry text circuitgraph reads,
    written as sae-lens's pretrained_saes.yaml writes its entries."""
    import yaml

    from circuitgraph.dictionaries import registry

    block = yaml.safe_dump({name: {"repo_id": repo_id, "model": model,
                                   "saes": [{"id": i, "path": p} for i, p in paths.items()]}}, sort_keys=False)
    real = registry._registry_yaml
    monkeypatch.setattr(registry, "_registry_yaml", lambda: real().rstrip("\n") + "\n" + block)


def _plain_gpt2(hub, tmp_path, monkeypatch, kind: str = "skip") -> tuple[str, str, dict]:
    from circuitgraph.adapters.loading import load_model_name
    from circuitgraph.testing.synthetic import random_transcoders

    _cache_model(hub, tmp_path, "gpt2", "gpt2", 2)
    model = load_model_name("gpt2").model
    tcs = random_transcoders(model, d_sae=F, kind=kind, input_site="mlp_input")
    repo = tmp_path / "plain"
    paths = {f"blocks.{l}.mlp": f"blocks.{l}.mlp" for l in tcs}
    for l, tc in tcs.items():
        tc.save_model(str(repo / f"blocks.{l}.mlp"))
    (repo / "README.md").write_text("tiny test transcoders\n")
    hf_cache_repo(hub, "test-org/gpt2-mlp-transcoders", repo)
    _plain_release(monkeypatch, "test-gpt2-mlp-transcoders", "test-org/gpt2-mlp-transcoders", paths)
    return "test-gpt2-mlp-transcoders", "test-org/gpt2-mlp-transcoders", tcs


def test_plain_saelens_release_reading_mlp_hook_in(hub, tmp_path, monkeypatch):
    """A release in sae-lens's own format (<path>/cfg.json + <path>/sae_weights.safetensors), skip
    transcoders reading blocks.<l>.mlp.hook_in on an unfolded GPT-2 (ln2 weight and bias)."""
    R, _, tcs = _plain_gpt2(hub, tmp_path, monkeypatch)
    g = _run("gpt2", R)
    meta = g.metadata["transcoders"]
    assert meta["format"] == "saelens" and meta["source"]["release"] == R
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    x = _mlp_inputs(g.context.adapter.model)
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert {n.layer for n in feats} == {0, 1}
    with torch.no_grad():
        for n in feats:
            ref = float(tcs[n.layer].encode(x[n.layer])[n.position, n.index])
            assert abs(n.activation - ref) < 1e-5, n.id
            tc = tcs[n.layer]
            pre = float(x[n.layer][n.position] @ tc.W_enc[:, n.index] + tc.b_enc[n.index])
            assert abs(_reader_pre(g, n) - pre) < 1e-5 * max(1.0, abs(pre)), n.id


def _cli(tmp_path: Path, spec: dict):
    import yaml
    from typer.testing import CliRunner

    from circuitgraph.cli import main as cli

    spec = {"format_version": 1, "prompt": {"tokens": TOKENS}, "targets": [{"top_logits": {"max_n": 2}}],
            "export": {"json": str(tmp_path / "out" / "graph.json")}, **spec}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return CliRunner().invoke(cli.app, ["run", str(path)])


def _one_line_exit_2(res, tmp_path, *needles):
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not (tmp_path / "out").exists()


def test_missing_release_file_and_wrong_model_are_one_line_exit_2(hub, tmp_path, monkeypatch):
    R, repo_id, _ = _plain_gpt2(hub, tmp_path, monkeypatch)
    snap = next((hub / ("models--" + repo_id.replace("/", "--")) / "snapshots").iterdir())
    (snap / "blocks.1.mlp" / "sae_weights.safetensors").unlink()
    res = _cli(tmp_path, {"model": {"name": "gpt2"}, "transcoders": {"release": R}})
    _one_line_exit_2(res, tmp_path, f"{repo_id}/blocks.1.mlp/sae_weights.safetensors",
                     f"huggingface-cli download {repo_id} blocks.1.mlp/sae_weights.safetensors")
    # the release's model is not the spec's: both named, before anything is fetched
    res = _cli(tmp_path, {"model": {"name": "gpt2"}, "transcoders": {"release": "mwhanna-qwen3-0.6b-transcoders-lowl0"}})
    _one_line_exit_2(res, tmp_path, "qwen3-0.6b", "Qwen/Qwen3-0.6B", "gpt2")
    # an SAE release (sae-lens format, not a transcoder) is refused by its architecture
    _plain_release(monkeypatch, "test-gpt2-res-saes", "test-org/gpt2-res-saes", {"blocks.0.hook_resid_pre": "l0"})
    sae_dir = tmp_path / "sae" / "l0"
    sae_dir.mkdir(parents=True)
    (sae_dir / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": D, "d_sae": F, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": False, "normalize_activations": "none",
        "metadata": {"hook_name": "blocks.0.hook_resid_pre", "model_name": "gpt2"}}))
    from safetensors.torch import save_file

    save_file({"W_enc": torch.zeros(D, F), "b_enc": torch.zeros(F), "W_dec": torch.zeros(F, D),
               "b_dec": torch.zeros(D)}, str(sae_dir / "sae_weights.safetensors"))
    hf_cache_repo(hub, "test-org/gpt2-res-saes", tmp_path / "sae")
    res = _cli(tmp_path, {"model": {"name": "gpt2"}, "transcoders": {"release": "test-gpt2-res-saes"}})
    _one_line_exit_2(res, tmp_path, "test-org/gpt2-res-saes/l0", "not a transcoder")


def test_release_names_and_layer_choice():
    # the entries circuitgraph parses are sae-lens's own (its directory reader on the same file)
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    theirs = get_pretrained_saes_directory()
    for name in [n for n in theirs if "transcoder" in n or "clt" in n]:
        ours, ref = release_entry(name), theirs[name]
        assert (ours.repo_id, ours.model, ours.conversion_func, ours.saes_map) == \
            (ref.repo_id, ref.model, ref.conversion_func, ref.saes_map), name
    with pytest.raises(LoadError, match="did you mean gemma-scope-2b-pt-transcoders"):
        release_entry("gemma-scope-2b-pt-transcoder")
    # one dictionary per layer: the registry's own, in layer order
    gs = release_layers(release_entry("gemma-scope-2b-pt-transcoders"))
    assert list(gs) == list(range(26)) and gs[0] == "layer_0/width_16k/average_l0_76"
    assert release_layers(release_entry("mwhanna-qwen3-0.6b-transcoders-lowl0"), layers=[2, 0]) == \
        {0: "layer_0", 2: "layer_2"}
    # several dictionaries for a layer: ids choose, and the error says so
    entry = release_entry("gemma-scope-2-4b-pt-transcoders")
    with pytest.raises(LoadError, match=r"dictionaries for layer \d+ .*transcoders\.ids"):
        release_layers(entry)
    some = next(iter(entry.saes_map))
    assert release_layers(entry, ids={17: some}) == {17: some}
    with pytest.raises(LoadError, match="not ids of"):
        release_layers(entry, ids={17: "no-such-id"})


def test_release_model_check_for_a_model_loaded_from_a_folder(tmp_path):
    """A model given by path is compared through its config's model_name."""
    from circuitgraph.adapters.loading import load_model_dir
    from circuitgraph.dictionaries.registry import check_release_model
    from circuitgraph.testing.synthetic import save_bundle, tiny_model

    model = tiny_model(n_layers=2)
    bundle = save_bundle(tmp_path / "b", model)
    entry = release_entry("gemma-scope-2b-pt-transcoders")
    with pytest.raises(LoadError) as info:
        check_release_model(entry, load_model_dir(bundle / "model"))
    msg = str(info.value)
    assert "gemma-2-2b" in msg and str(bundle / "model") in msg and model.cfg.model_name in msg
    cfg = json.loads((bundle / "model" / "config.json").read_text())
    (bundle / "model" / "config.json").write_text(json.dumps({**cfg, "model_name": "google/gemma-2-2b"}))
    check_release_model(entry, load_model_dir(bundle / "model"))  # same model: accepted


#: a tiny Gemma-2-style TransformerLens model (RMS pre- and post-norms, gated MLP, soft caps)
_GEMMA_LIKE = dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True, attn_soft_cap=30.0,
                   logit_soft_cap=20.0, d_vocab=23)


def _gemma3_stand_in(tmp_path: Path, n_layers: int) -> tuple[Path, object]:
    """The release's model is Gemma-3, which circuitgraph cannot build tiny by name (TransformerLens
    pins gemma-3-270m's real sizes): a tiny Gemma-2-style model saved as a local folder whose
    config names google/gemma-3-270m stands in for it (the release model check reads that name)."""
    from circuitgraph.testing.synthetic import save_bundle, tiny_model

    model = tiny_model(n_layers=n_layers, **_GEMMA_LIKE)
    d = save_bundle(tmp_path / "gemma3", model) / "model"
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_name": "google/gemma-3-270m"}))
    return d, model


def _gemma_scope_2_folder(folder: Path, layer: int, gen, *, out_point: str, affine: bool) -> dict:
    """One published GemmaScope-2 transcoder folder: config.json (hook points) + params.safetensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architecture": "jump_relu", "type": "transcoder", "affine_connection": affine,
        "model_name": "gemma-v3-270m-pt", "hf_hook_point_in": f"model.layers.{layer}.pre_feedforward_layernorm.output",
        "hf_hook_point_out": f"model.layers.{layer}.{out_point}"}))
    t = {"w_enc": torch.randn(D, F, generator=gen) / D**0.5, "b_enc": 0.3 * torch.randn(F, generator=gen),
         "threshold": 0.1 * torch.rand(F, generator=gen), "w_dec": torch.randn(F, D, generator=gen) / F**0.5,
         "b_dec": 0.1 * torch.randn(D, generator=gen)}
    if affine:
        t["affine_skip_connection"] = 0.1 * torch.randn(D, D, generator=gen) / D**0.5
    save_file(t, str(folder / "params.safetensors"))
    return t


def _run_path(model_dir: Path, release: str, **extra):
    import circuitgraph

    return circuitgraph.run({"format_version": 1, "model": {"path": str(model_dir)},
                             "transcoders": {"release": release, **extra}, "prompt": {"tokens": TOKENS},
                             "targets": [{"top_logits": {"max_n": 2}}]}).graph


def _check_gemma_scope_2(g, files: dict[int, dict]) -> None:
    """Completeness, and every feature's activation (and the graph's reader) equal to the raw
    files' JumpReLU forward on what the model feeds each MLP."""
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    x = _mlp_inputs(g.context.adapter.model)
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert {n.layer for n in feats} == set(files)
    for n in feats:
        t = files[n.layer]
        h = float(x[n.layer][n.position] @ t["w_enc"][:, n.index] + t["b_enc"][n.index])
        assert h > float(t["threshold"][n.index]) and abs(n.activation - h) < 1e-5 * max(1.0, abs(h)), n.id
        assert abs(_reader_pre(g, n) - h) < 1e-5 * max(1.0, abs(h)), n.id


def test_gemma_scope_2_transcoders_release(hub, tmp_path):
    """gemma-scope-2-270m-pt-transcoders (sae-lens conversion gemma_3): the two affine folders
    sae-lens's registry lists, transcoder/layer_<l>_width_<w>_l0_<s>_affine/{config.json,
    params.safetensors}, fetched offline; a decoy folder of another width is never read."""
    R = "gemma-scope-2-270m-pt-transcoders"
    entry = release_entry(R)
    assert entry.conversion_func == "gemma_3" and entry.model == "google/gemma-3-270m"
    chosen = release_layers(entry)
    model_dir, _ = _gemma3_stand_in(tmp_path, max(chosen) + 1)
    repo = tmp_path / "gs2"
    gen = torch.Generator().manual_seed(3)
    files = {l: _gemma_scope_2_folder(repo / entry.saes_map[i], l, gen, out_point="post_feedforward_layernorm.output",
                                      affine=entry.saes_map[i].endswith("_affine"))
             for l, i in chosen.items()}
    assert all("affine_skip_connection" in t for t in files.values())
    decoy = repo / "transcoder" / f"layer_{min(chosen)}_width_65k_l0_big"
    bad = _gemma_scope_2_folder(decoy, min(chosen), gen, out_point="post_feedforward_layernorm.output", affine=False)
    from safetensors.torch import save_file

    save_file({k: torch.full_like(v, float("nan")) for k, v in bad.items()}, str(decoy / "params.safetensors"))
    hf_cache_repo(hub, entry.repo_id, repo)

    g = _run_path(model_dir, R)
    meta = g.metadata["transcoders"]
    assert meta["format"] == "gemmascope2" and meta["source"]["conversion"] == "gemma_3"
    assert meta["source"]["ids"] == {str(l): i for l, i in chosen.items()}
    assert [(layer["hook_in"], layer["hook_out"], layer["output_site"]) for layer in meta["layers"]] == \
        [(f"blocks.{l}.ln2.hook_normalized", f"blocks.{l}.hook_mlp_out", "mlp_out") for l in chosen]
    _check_gemma_scope_2(g, files)

    # a listed file missing from the cache: one line naming the repository, the file and the command
    from circuitgraph.dictionaries.registry import load_release

    snap = next((hub / ("models--" + entry.repo_id.replace("/", "--")) / "snapshots").iterdir())
    p = entry.saes_map[chosen[max(chosen)]]
    (snap / p / "params.safetensors").unlink()
    with pytest.raises(LoadError) as info:
        load_release(R, g.context.adapter)
    msg = str(info.value)
    assert "\n" not in msg and f"huggingface-cli download {entry.repo_id} {p}/params.safetensors" in msg


def test_gemma_scope_2_all_release_with_ids_and_mlp_output_hook(hub, tmp_path):
    """gemma-scope-2-270m-pt-transcoders-all lists several widths / L0s per layer: without ids
    the one-line "choose ids" error; with ids, folders whose config.json reads
    model.layers.<l>.mlp.output write the MLP output before the post-MLP norm (mlp.hook_out)."""
    R = "gemma-scope-2-270m-pt-transcoders-all"
    entry = release_entry(R)
    assert entry.conversion_func == "gemma_3"
    with pytest.raises(LoadError, match=r"dictionaries for layer 0 .*transcoders\.ids"):
        release_layers(entry)
    ids = {0: "layer_0_width_16k_l0_small", 2: "layer_2_width_16k_l0_big"}
    assert all(i in entry.saes_map for i in ids.values())
    model_dir, model = _gemma3_stand_in(tmp_path, 3)
    repo = tmp_path / "gs2all"
    gen = torch.Generator().manual_seed(4)
    files = {l: _gemma_scope_2_folder(repo / entry.saes_map[i], l, gen, out_point="mlp.output", affine=False)
             for l, i in ids.items()}
    hf_cache_repo(hub, entry.repo_id, repo)
    g = _run_path(model_dir, R, ids=ids)
    meta = g.metadata["transcoders"]
    assert [(layer["hook_out"], layer["output_site"]) for layer in meta["layers"]] == \
        [("blocks.0.mlp.hook_out", "before_post_norm"), ("blocks.2.mlp.hook_out", "before_post_norm")]
    _check_gemma_scope_2(g, files)
    # the error of layer 2 is hook_mlp_out minus the post-norm image of the files' reconstruction
    from circuitgraph.graph.nodes import NodeId

    names = {"blocks.2.hook_mlp_out", "blocks.2.ln2_post.hook_scale"}
    _, cache = model.run_with_cache(torch.tensor([TOKENS]), names_filter=lambda n: n in names)
    x = _mlp_inputs(model)[2]
    t = files[2]
    h = x @ t["w_enc"] + t["b_enc"]
    recon = (h * (h > t["threshold"])) @ t["w_dec"] + t["b_dec"]
    sigma = cache["blocks.2.ln2_post.hook_scale"][0]
    for p in range(1, len(TOKENS)):
        (err,) = g.context.writes(NodeId("error", 2, p, 0))
        expect = cache["blocks.2.hook_mlp_out"][0, p] - recon[p] / sigma[p] * model.blocks[2].ln2_post.w
        torch.testing.assert_close(err.vector, expect, atol=2e-5, rtol=0)


def test_gemma_scope_2_cross_layer_paths_are_refused_with_the_hf_form(monkeypatch):
    """A gemma_3 entry naming a GemmaScope-2 CLT layer file (sae-lens would sum its decoders) is
    refused before anything is fetched, naming the exact transcoders: {hf: ...} form instead."""
    import yaml

    from circuitgraph.adapters import ModelAdapter
    from circuitgraph.dictionaries import registry
    from circuitgraph.testing.synthetic import tiny_model

    adapter = ModelAdapter(tiny_model(n_layers=2, **_GEMMA_LIKE))
    block = yaml.safe_dump({"test-gs2-clt": {
        "repo_id": "test-org/gs2", "model": adapter.model.cfg.model_name, "conversion_func": "gemma_3",
        "saes": [{"id": f"clt/width_16k_l0_big/params_layer_{l}", "path": f"clt/width_16k_l0_big/params_layer_{l}"}
                 for l in range(2)]}}, sort_keys=False)
    real = registry._registry_yaml
    monkeypatch.setattr(registry, "_registry_yaml", lambda: real().rstrip("\n") + "\n" + block)
    with pytest.raises(LoadError, match=r"not a GemmaScope-2 per-layer transcoder folder.*hf: test-org/gs2/clt/width_16k_l0_big} \(the whole CLT\)"):
        registry.load_release("test-gs2-clt", adapter)
