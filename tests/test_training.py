"""circuitgraph train: text windows, streaming, each kind trains, outputs load in circuitgraph and
circuit-tracer, resume after a stop gives the same weights, metrics identities (tiny models)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from circuitgraph.cli import main as cli
from circuitgraph.dictionaries import load_dictionaries
from circuitgraph.errors import LoadError, SpecError
from circuitgraph.spec.train import TRAIN_SCHEMA_PATH, load_train_spec, train_schema_text
from circuitgraph.testing.circuit_tracer import circuit_tracer_python, circuit_tracer_unavailable
from circuitgraph.training import train
from circuitgraph.training.activation_stream import layer_activations, next_token_loss, spliced
from circuitgraph.training.data import read_documents, split_windows, token_windows
from circuitgraph.training.dictionary import apply_weights
from circuitgraph.training.quality import evaluate
from circuitgraph.training.trainer import DICTIONARY_FOLDER
from tests.helpers.tiny_models import train_spec, training_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return training_folder(tmp_path_factory.mktemp("train"))


def _spec(root, out, **train):
    return train_spec(root, out, **{"tokens": 600, "checkpoint_every": 1, **train})


class _Tok:
    def encode(self, text):
        return [int(w[1:]) for w in text.split()]


def test_windows_start_with_bos_and_documents_are_joined_by_it():
    w = token_windows(["t5 t6 t7", "t8 t9"], _Tok(), 3, bos_id=1)
    # stream 5 6 7 | 1 8 9 -> pieces of 2 after BOS: [5 6] [7 1] [8 9]
    assert w.tolist() == [[1, 5, 6], [1, 7, 1], [1, 8, 9]]
    assert token_windows(["t5 t6 t7 t8"], _Tok(), 2, bos_id=None).tolist() == [[5, 6], [7, 8]]
    with pytest.raises(LoadError, match="fewer than one window"):
        token_windows(["t5"], _Tok(), 8, bos_id=1)


def test_documents_from_text_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("one\nline\n%\ntwo\n%\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "three"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    assert read_documents([tmp_path / "a.txt"]) == ["one\nline", "two"]
    with pytest.raises(LoadError, match="string field 'text'"):
        read_documents([tmp_path / "b.jsonl"])
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "x"}) + "\n\n" + json.dumps({"body": "y"}) + "\n")
    assert read_documents([tmp_path / "c.jsonl"], "body") == ["x", "y"]
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "ok"}) + "\n{not json\n")
    with pytest.raises(LoadError, match=r"d\.jsonl:2: not a JSON object"):  # one line naming the file, not a traceback
        read_documents([tmp_path / "d.jsonl"])


def test_spec_rules_and_schema(tmp_path):
    with pytest.raises(SpecError, match="cross-layer transcoder covers every layer"):
        load_train_spec({"format_version": 1, "model": {"builtin": "demo"},
                         "train": {"text": ["x.txt"], "output": "o", "kind": "cross_layer_transcoder", "layers": [0]}})
    with pytest.raises(SpecError, match="widht"):
        load_train_spec({"format_version": 1, "model": {"builtin": "demo"},
                         "train": {"text": ["x.txt"], "output": "o", "widht": 3}})
    assert TRAIN_SCHEMA_PATH.read_text() == train_schema_text(), "run: python -m circuitgraph.spec.train"


def test_streamed_activations_are_the_hooked_values(tiny):
    root, adapter = tiny
    tokens = torch.tensor([[1, 5, 9, 11], [1, 7, 3, 4]])
    x, y = layer_activations(adapter, tokens, [1], skip_first=True)
    _, cache = adapter.model.run_with_cache(tokens)
    assert torch.equal(y[0], cache["blocks.1.hook_mlp_out"][:, 1:].reshape(-1, 32))
    assert torch.equal(x[0], cache[adapter.hook_norm_normalized("ln2", 1)][:, 1:].reshape(-1, 32))


def test_splice_of_the_mlp_itself_keeps_the_loss(tiny):
    """Splicing in the MLP's own output (recomputed from the captured input) gives the model's CE;
    zero-ablating changes it: the splice reaches the forward at the right sites."""
    root, adapter = tiny
    tokens = torch.tensor([[1, 5, 9, 11, 20, 4], [1, 7, 3, 4, 8, 40]])
    blocks = adapter.model.blocks

    def own(i, inputs):
        return blocks[i].mlp(inputs[i] * blocks[i].ln2.w)

    base = next_token_loss(adapter, tokens)
    with spliced(adapter, [0, 1], own, start=1):
        assert abs(next_token_loss(adapter, tokens) - base) < 1e-5
    with spliced(adapter, [0, 1], None, start=1):
        assert abs(next_token_loss(adapter, tokens) - base) > 1e-3


@pytest.mark.parametrize("kind,activation", [("transcoder", "relu"), ("transcoder", "jump_relu"),
                                             ("skip_transcoder", "relu"), ("cross_layer_transcoder", "relu")])
def test_each_kind_trains_and_loads_in_circuitgraph(tiny, tmp_path, kind, activation):
    root, adapter = tiny
    seen = []
    m = train(_spec(root, tmp_path, kind=kind, activation=activation, lr=3e-3, tokens=1500), adapter=adapter,
              progress=seen.append)
    first, last = (sum(p.loss for p in part) / 4 for part in (seen[:4], seen[-4:]))
    assert len(seen) == m["steps"] and last < 0.95 * first, (first, last)
    assert (tmp_path / "report.html").is_file() and json.loads((tmp_path / "metrics.json").read_text())["eval"]
    # circuitgraph reads the folder as it is, and its reconstruction is the trained one's
    tcs = load_dictionaries(tmp_path / DICTIONARY_FOLDER, adapter)
    tokens = torch.tensor([[1, 5, 9, 11, 20, 4]])
    x, y = layer_activations(adapter, tokens, [0, 1], skip_first=False)
    w = _weights(tmp_path / DICTIONARY_FOLDER, kind, activation)
    a_ref, r_ref = apply_weights(w, x)
    acts = {l: tcs[l].activation(x[l]) for l in (0, 1)}
    recon = tcs.reconstruct(acts, {l: x[l] for l in (0, 1)}) if kind != "cross_layer_transcoder" else \
        {l: tcs.reconstruct_at(l, acts, {k: x[k] for k in (0, 1)}) for l in (0, 1)}
    for l in (0, 1):
        assert torch.allclose(acts[l].float(), a_ref[l], atol=1e-5)
        assert torch.allclose(recon[l].float(), r_ref[l], atol=1e-4)
    # the files hold what was trained: the held-out metrics recomputed from them are metrics.json's
    windows = token_windows(read_documents([root / "text.txt"]), adapter.tokenizer, 12, bos_id=adapter.tokenizer.bos_id)
    held_out = split_windows(windows, -(-100 // 11), 0)[1]
    again = evaluate(adapter, w, held_out, [0, 1], batch=4, skip_first=True)
    for l in ("0", "1"):
        assert again["layers"][l]["explained_variance"] == pytest.approx(m["eval"]["layers"][l]["explained_variance"],
                                                                         abs=1e-5)
    assert again["ce_loss"]["spliced"] == pytest.approx(m["eval"]["ce_loss"]["spliced"], abs=1e-5)


def _weights(folder, kind, activation):
    """The written files read back independently (safetensors, no circuitgraph reader)."""
    from circuitgraph.training.dictionary import DictionaryWeights

    if kind == "cross_layer_transcoder":
        enc = [load_file(str(folder / f"W_enc_{l}.safetensors")) for l in (0, 1)]
        dec = [load_file(str(folder / f"W_dec_{l}.safetensors"))[f"W_dec_{l}"] for l in (0, 1)]
        thr = torch.stack([e[f"threshold_{l}"] for l, e in enumerate(enc)]) if activation == "jump_relu" else None
        return DictionaryWeights(kind, torch.stack([e[f"W_enc_{l}"] for l, e in enumerate(enc)]),
                                 torch.stack([e[f"b_enc_{l}"] for l, e in enumerate(enc)]), dec,
                                 torch.stack([e[f"b_dec_{l}"] for l, e in enumerate(enc)]), None, thr)
    t = [load_file(str(folder / f"layer_{l}.safetensors")) for l in (0, 1)]
    thr = torch.stack([d["activation_function.threshold"] for d in t]) if activation == "jump_relu" else None
    skip = [d["W_skip"] for d in t] if kind == "skip_transcoder" else None
    return DictionaryWeights(kind, torch.stack([d["W_enc"] for d in t]), torch.stack([d["b_enc"] for d in t]),
                             [d["W_dec"] for d in t], torch.stack([d["b_dec"] for d in t]), skip, thr)


@pytest.mark.parametrize("kind", ["transcoder", "cross_layer_transcoder"])
def test_resume_after_a_stop_gives_the_same_weights(tiny, tmp_path, kind):
    root, adapter = tiny
    whole = tmp_path / "whole"
    train(_spec(root, whole, kind=kind), adapter=adapter)
    parts = tmp_path / "parts"
    assert train(_spec(root, parts, kind=kind), adapter=adapter, stop_after=4) == {"stopped_at": 4}
    assert not (parts / DICTIONARY_FOLDER).exists()
    train(_spec(root, parts, kind=kind), adapter=adapter)
    for f in sorted((whole / DICTIONARY_FOLDER).glob("*.safetensors")):
        a, b = load_file(str(f)), load_file(str(parts / DICTIONARY_FOLDER / f.name))
        assert all(torch.equal(a[k], b[k]) for k in a), f.name


def test_metrics_are_the_independent_sums(tiny, tmp_path):
    root, adapter = tiny
    train(_spec(root, tmp_path), adapter=adapter)
    w = _weights(tmp_path / DICTIONARY_FOLDER, "transcoder", "relu")
    tokens = torch.tensor([[1, 5, 9, 11, 20, 4, 6], [1, 7, 3, 4, 8, 40, 2]])
    m = evaluate(adapter, w, tokens, [0, 1], batch=1, skip_first=True)
    _, cache = adapter.model.run_with_cache(tokens)
    for l in (0, 1):
        x = cache[adapter.hook_norm_normalized("ln2", l)][:, 1:].reshape(-1, 32).double()
        y = cache[f"blocks.{l}.hook_mlp_out"][:, 1:].reshape(-1, 32).double()
        a = torch.relu(x @ w.W_enc[l].double().T + w.b_enc[l].double())
        r = a @ w.W_dec[l].double() + w.b_dec[l].double()
        ev = 1 - ((y - r) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
        assert m["layers"][str(l)]["explained_variance"] == pytest.approx(float(ev), abs=1e-4)
        assert m["layers"][str(l)]["l0"] == pytest.approx(float((a > 0).sum(1).double().mean()), abs=1e-9)
    assert m["ce_loss"]["model"] == pytest.approx(next_token_loss(adapter, tokens), abs=1e-5)


@pytest.mark.skipif(circuit_tracer_unavailable() is not None, reason=str(circuit_tracer_unavailable()))
@pytest.mark.parametrize("kind", ["skip_transcoder", "cross_layer_transcoder"])
def test_outputs_load_in_circuit_tracer(tiny, tmp_path, kind):
    root, adapter = tiny
    train(_spec(root, tmp_path, kind=kind, activation="jump_relu"), adapter=adapter)
    folder = tmp_path / DICTIONARY_FOLDER
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import torch, yaml
        from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
        cfg = yaml.safe_load(open({str(folder / 'config.yaml')!r}))
        x = torch.load({str(tmp_path / 'x.pt')!r})
        if cfg["model_kind"] == "transcoder_set":
            t = load_transcoder_set({{l: {str(folder)!r} + f"/layer_{{l}}.safetensors" for l in (0, 1)}}, scan="s",
                                    feature_input_hook=cfg["feature_input_hook"],
                                    feature_output_hook=cfg["feature_output_hook"], device=torch.device("cpu"),
                                    lazy_encoder=False, lazy_decoder=False)
            out = torch.stack([t[l](x[l]) for l in (0, 1)])
        else:
            t = load_clt({str(folder)!r}, feature_input_hook=cfg["feature_input_hook"],
                         feature_output_hook=cfg["feature_output_hook"], device=torch.device("cpu"),
                         dtype=torch.float32, lazy_decoder=False, lazy_encoder=False)
            out = t(x)
        torch.save(out, {str(tmp_path / 'ct.pt')!r})
    """)
    subprocess.run([str(circuit_tracer_python()), "-c", script], check=True, capture_output=True, timeout=300)
    ct = torch.load(tmp_path / "ct.pt")
    _, ref = apply_weights(_weights(folder, kind, "jump_relu"), x)
    assert torch.allclose(ct.float(), ref, atol=1e-4)


def test_cli_trains_shows_progress_and_resumes(tiny, tmp_path):
    root, _ = tiny
    spec = {"format_version": 1, "model": {"path": str(root / "model")},
            "train": {"text": [str(root / "text.txt")], "output": str(tmp_path / "out"), "width": 8, "context": 12,
                      "tokens": 200, "batch": 4, "eval_tokens": 50, "checkpoint_every": 2}}
    (tmp_path / "t.json").write_text(json.dumps(spec))
    r = CliRunner().invoke(cli.app, ["train", str(tmp_path / "t.json"), "--every", "1"])
    assert r.exit_code == 0, r.output
    assert "step 1/5" in r.output and "tokens/s" in r.output and "zero-ablated MLPs" in r.output
    assert (tmp_path / "out" / "checkpoint.pt").is_file()
    again = CliRunner().invoke(cli.app, ["train", str(tmp_path / "t.json")])  # resumes at the end: no step runs
    assert again.exit_code == 0 and "step" not in again.output.split("wrote")[0], again.output
