"""circuitgraph train with TopK: the own trainer (every kind) and the eai-sparsify backend (per-layer
and skip transcoders): they train, their files load in circuitgraph and give what independent
readers compute (sparsify's own SparseCoder on the Hugging Face model), metrics.json is what the
files give, and a run stopped and resumed ends with the same weights (tiny models)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from circuitgraph.dictionaries import load_dictionaries
from circuitgraph.errors import SpecError
from circuitgraph.spec.train import load_train_spec
from circuitgraph.training import train
from circuitgraph.training.activation_stream import layer_activations
from circuitgraph.training.data import read_documents, split_windows, token_windows
from circuitgraph.training.dictionary import DictionaryWeights
from circuitgraph.training.quality import evaluate
from circuitgraph.training.sparsify_backend import CHECKPOINT_DIR, sparsify_unavailable
from circuitgraph.training.trainer import DICTIONARY_FOLDER
from circuitgraph.training.writers import CIRCUIT_TRACER_TOPK
from tests.helpers.tiny_models import train_spec, training_folder

needs_sparsify = pytest.mark.skipif(sparsify_unavailable() is not None, reason=str(sparsify_unavailable()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return training_folder(tmp_path_factory.mktemp("train_topk"))


def _spec(root, out, **train):
    return train_spec(root, out, **{"tokens": 1500, "checkpoint_every": 2, "activation": "topk", "k": 4, **train})


def _gamma(adapter, l):
    """ln2's weight read off the model's module (not through circuitgraph's norm accessors)."""
    return adapter.model.blocks[l].ln2.w.detach().double()


def _sparsify_files(folder, adapter, kind):
    """The written sparsify folders read back with safetensors and the model's ln2 weight: weights that
    read ln2.hook_normalized (encoder.weight * gamma; RMSNorm: no beta)."""
    enc, benc, dec, bdec, skip, k = [], [], [], [], [], None
    for l in (0, 1):
        t = load_file(str(folder / f"layers.{l}.mlp" / "sae.safetensors"))
        cfg = json.loads((folder / f"layers.{l}.mlp" / "cfg.json").read_text())
        assert cfg["transcode"] and cfg["activation"] == "topk" and cfg["skip_connection"] == (kind == "skip_transcoder")
        k = cfg["k"]
        enc.append((t["encoder.weight"].double() * _gamma(adapter, l)).float())
        benc.append(t["encoder.bias"])
        dec.append(t["W_dec"])
        bdec.append(t["b_dec"])
        if "W_skip" in t:
            skip.append((t["W_skip"].double() * _gamma(adapter, l)).float())
    return DictionaryWeights(kind, torch.stack(enc), torch.stack(benc), dec, torch.stack(bdec), skip or None, None, k)


def _topk_reference(w, x):
    """TopK forward by hand: per token the k largest of relu(h), then the decoder (+ skip)."""
    acts, recon = [], []
    for l in range(x.shape[0]):
        h = torch.relu(x[l].double() @ w.W_enc[l].double().T + w.b_enc[l].double())
        keep = torch.zeros_like(h)
        for n in range(h.shape[0]):
            order = sorted(range(h.shape[1]), key=lambda j: -float(h[n, j]))[: w.topk]
            keep[n, order] = 1
        acts.append(h * keep)
    for l in range(x.shape[0]):
        if w.kind == "cross_layer_transcoder":  # every earlier layer's features write here
            r = sum(acts[j] @ w.W_dec[j][:, l - j].double() for j in range(l + 1)) + w.b_dec[l].double()
        else:
            r = acts[l] @ w.W_dec[l].double() + w.b_dec[l].double()
        if w.W_skip is not None:
            r = r + x[l].double() @ w.W_skip[l].double().T
        recon.append(r)
    return torch.stack(acts), torch.stack(recon)


def _circuitgraph_forward(folder, adapter, kind, x):
    tcs = load_dictionaries(folder, adapter)
    acts = {l: tcs[l].activation(x[l]) for l in (0, 1)}
    if kind == "cross_layer_transcoder":
        recon = {l: tcs.reconstruct_at(l, acts, {k: x[k] for k in (0, 1)}) for l in (0, 1)}
    else:
        recon = tcs.reconstruct(acts, {l: x[l] for l in (0, 1)})
    return acts, recon


def test_spec_rules():
    base = {"text": ["x.txt"], "output": "o"}
    for extra, message in (({"activation": "topk", "k": 40, "width": 32}, "k 40 is more than width 32"),
                           ({"backend": "sparsify", "activation": "relu"}, "trains TopK transcoders only"),
                           ({"backend": "sparsify", "activation": "topk", "kind": "cross_layer_transcoder"},
                            "per-layer and skip transcoders only")):
        with pytest.raises(SpecError, match=message):
            load_train_spec({"format_version": 1, "model": {"builtin": "demo"}, "train": {**base, **extra}})


@pytest.mark.parametrize("kind", ["transcoder", "skip_transcoder", "cross_layer_transcoder"])
def test_topk_trains_every_kind_and_circuitgraph_reads_it(tiny, tmp_path, kind):
    root, adapter = tiny
    seen = []
    m = train(_spec(root, tmp_path, kind=kind, lr=3e-3), adapter=adapter, progress=seen.append)
    first, last = (sum(p.loss for p in part) / 4 for part in (seen[:4], seen[-4:]))
    assert last < 0.95 * first, (first, last)
    assert m["circuit_tracer"] == CIRCUIT_TRACER_TOPK and m["settings"]["k"] == 4
    assert "circuit-tracer 0.5.0 cannot read TopK" in (tmp_path / "report.html").read_text()
    folder = tmp_path / DICTIONARY_FOLDER
    if kind == "cross_layer_transcoder":
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        assert cfg["activation_function"] == "topk" and cfg["topk"] == 4
        enc = [load_file(str(folder / f"W_enc_{l}.safetensors")) for l in (0, 1)]
        w = DictionaryWeights(kind, torch.stack([e[f"W_enc_{l}"] for l, e in enumerate(enc)]),
                              torch.stack([e[f"b_enc_{l}"] for l, e in enumerate(enc)]),
                              [load_file(str(folder / f"W_dec_{l}.safetensors"))[f"W_dec_{l}"] for l in (0, 1)],
                              torch.stack([e[f"b_dec_{l}"] for l, e in enumerate(enc)]), None, None, 4)
    else:
        assert not (folder / "config.yaml").exists()  # sparsify's layout: circuit-tracer cannot misread it
        w = _sparsify_files(folder, adapter, kind)
    x, _ = layer_activations(adapter, torch.tensor([[1, 5, 9, 11, 20, 4], [1, 7, 3, 4, 8, 40]]), [0, 1],
                             skip_first=False)
    acts, recon = _circuitgraph_forward(folder, adapter, kind, x)
    a_ref, r_ref = _topk_reference(w, x)
    for l in (0, 1):
        assert int((acts[l] != 0).sum(-1).max()) <= 4
        assert torch.allclose(acts[l].double(), a_ref[l], atol=1e-5)
        assert torch.allclose(recon[l].double(), r_ref[l], atol=1e-4)
    # the held-out metrics recomputed from the files are metrics.json's
    windows = token_windows(read_documents([root / "text.txt"]), adapter.tokenizer, 12, bos_id=adapter.tokenizer.bos_id)
    again = evaluate(adapter, w, split_windows(windows, -(-100 // 11), 0)[1], [0, 1], batch=4, skip_first=True)
    for l in ("0", "1"):
        assert again["layers"][l]["explained_variance"] == pytest.approx(m["eval"]["layers"][l]["explained_variance"],
                                                                         abs=1e-5)
        assert again["layers"][l]["l0"] <= 4
    assert again["ce_loss"]["spliced"] == pytest.approx(m["eval"]["ce_loss"]["spliced"], abs=1e-5)


@needs_sparsify
def test_sparsify_backend_trains_and_circuitgraph_reads_what_sparsify_computes(tiny, tmp_path):
    """sparsify's own SparseCoder on the Hugging Face model's MLP input gives the reconstruction
    circuitgraph computes from ln2.hook_normalized of its own model with the written files."""
    from sparsify import SparseCoder
    from transformers import AutoModelForCausalLM

    root, adapter = tiny
    seen = []
    m = train(_spec(root, tmp_path, kind="skip_transcoder", backend="sparsify"), adapter=adapter,
              progress=seen.append)
    assert len(seen) == m["steps"] and seen[-1].explained_variance > seen[0].explained_variance
    assert m["settings"]["backend"] == "sparsify" and m["circuit_tracer"] == CIRCUIT_TRACER_TOPK
    folder = tmp_path / DICTIONARY_FOLDER
    for l in (0, 1):  # the files are sparsify's, as it saved them
        for name in ("cfg.json", "sae.safetensors"):
            assert (folder / f"layers.{l}.mlp" / name).read_bytes() == \
                (tmp_path / CHECKPOINT_DIR / f"layers.{l}.mlp" / name).read_bytes()
    tokens = torch.tensor([[1, 5, 9, 11, 20, 4], [1, 7, 3, 4, 8, 40]])
    hf = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    got = {}
    hooks = [hf.model.layers[l].mlp.register_forward_pre_hook(lambda mod, args, l=l: got.__setitem__(l, args[0]))
             for l in (0, 1)]
    with torch.no_grad():
        hf(tokens)
    for h in hooks:
        h.remove()
    x, _ = layer_activations(adapter, tokens, [0, 1], skip_first=False)
    acts, recon = _circuitgraph_forward(folder, adapter, "skip_transcoder", x)
    for l in (0, 1):
        sae = SparseCoder.load_from_disk(folder / f"layers.{l}.mlp")
        with torch.no_grad():
            out = sae(got[l].reshape(-1, 32))
        dense = torch.zeros(out.latent_acts.shape[0], sae.num_latents).scatter(-1, out.latent_indices, out.latent_acts)
        assert torch.allclose(acts[l].float(), dense, atol=1e-5)
        assert torch.allclose(recon[l].float(), out.sae_out, atol=1e-4)
    w = _sparsify_files(folder, adapter, "skip_transcoder")
    windows = token_windows(read_documents([root / "text.txt"]), adapter.tokenizer, 12, bos_id=adapter.tokenizer.bos_id)
    again = evaluate(adapter, w, split_windows(windows, -(-100 // 11), 0)[1], [0, 1], batch=4, skip_first=True)
    assert again["ce_loss"]["spliced"] == pytest.approx(m["eval"]["ce_loss"]["spliced"], abs=1e-5)


@needs_sparsify
def test_sparsify_backend_resumes_after_a_stop_with_the_same_weights(tiny, tmp_path):
    root, adapter = tiny
    parts = tmp_path / "parts"
    assert train(_spec(root, parts, tokens=600, backend="sparsify"), adapter=adapter, stop_after=4) == {"stopped_at": 4}
    assert not (parts / DICTIONARY_FOLDER).exists()
    train(_spec(root, parts, tokens=600, backend="sparsify"), adapter=adapter)
    whole_s = tmp_path / "whole_s"
    train(_spec(root, whole_s, tokens=600, backend="sparsify"), adapter=adapter)
    for l in (0, 1):
        a = load_file(str(whole_s / DICTIONARY_FOLDER / f"layers.{l}.mlp" / "sae.safetensors"))
        b = load_file(str(parts / DICTIONARY_FOLDER / f"layers.{l}.mlp" / "sae.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), l


def test_topk_resume_after_a_stop_gives_the_same_weights(tiny, tmp_path):
    root, adapter = tiny
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(_spec(root, whole, tokens=600, kind="cross_layer_transcoder"), adapter=adapter)
    assert train(_spec(root, parts, tokens=600, kind="cross_layer_transcoder"), adapter=adapter,
                 stop_after=4) == {"stopped_at": 4}
    train(_spec(root, parts, tokens=600, kind="cross_layer_transcoder"), adapter=adapter)
    for f in sorted((whole / DICTIONARY_FOLDER).glob("*.safetensors")):
        a, b = load_file(str(f)), load_file(str(parts / DICTIONARY_FOLDER / f.name))
        assert all(torch.equal(a[k], b[k]) for k in a), f.name


@needs_sparsify
def test_sparsify_backend_needs_a_hugging_face_folder(tiny, tmp_path):
    root, adapter = tiny
    spec = load_train_spec({"format_version": 1, "model": {"builtin": "demo"}, "train": {
        "text": [str(root / "text.txt")], "output": str(tmp_path), "width": 16, "context": 12, "tokens": 100,
        "batch": 4, "eval_tokens": 50, "activation": "topk", "k": 4, "backend": "sparsify"}})
    with pytest.raises(SpecError, match="needs a Hugging Face model folder"):
        train(spec, adapter=adapter)


@needs_sparsify
def test_cli_trains_with_sparsify_shows_progress_and_says_circuit_tracer_cannot_read_it(tiny, tmp_path):
    from typer.testing import CliRunner

    from circuitgraph.cli import main as cli

    root, _ = tiny
    spec = {"format_version": 1, "model": {"path": str(root / "model")},
            "train": {"text": [str(root / "text.txt")], "output": str(tmp_path / "out"), "width": 8, "context": 12,
                      "tokens": 200, "batch": 4, "eval_tokens": 50, "checkpoint_every": 2, "activation": "topk",
                      "k": 2, "backend": "sparsify"}}
    (tmp_path / "t.json").write_text(json.dumps(spec))
    r = CliRunner().invoke(cli.app, ["train", str(tmp_path / "t.json"), "--every", "1"])
    assert r.exit_code == 0, r.output
    assert "step 1/5" in r.output and "tokens/s" in r.output and "Saving checkpoint" not in r.output
    assert "circuit-tracer: circuit-tracer 0.5.0 cannot read TopK" in r.output
    again = CliRunner().invoke(cli.app, ["train", str(tmp_path / "t.json")])  # resumes at the end: no step runs
    assert again.exit_code == 0 and "step" not in again.output.split("wrote")[0], again.output
