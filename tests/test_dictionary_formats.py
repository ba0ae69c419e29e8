"""Per-layer transcoders in the published layouts: circuit-tracer transcoder_set, GemmaScope,
GemmaScope-2 and EleutherAI sparsify TopK (skip) transcoders, each from a local folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import attribute
from circuitgraph.dictionaries import detect_format, load_dictionaries
from circuitgraph.errors import LoadError, NumericalError, ShapeMismatchError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.testing.synthetic import random_layer_dictionary, save_bundle, save_layer_dictionary, tiny_model
from tests.helpers.peers import circuit_tracer_or_skip

GPT2 = dict(norm="LN", mlp="gelu", positional="learned", n_layers=2)
LLAMA = dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2, n_layers=2)
TOKENS = [1, 5, 7, 9, 4, 3, 11]

CASES = [  # (format, activation, skip)
    ("circuit_tracer_transcoder_set", "relu", False),
    ("circuit_tracer_transcoder_set", "jump_relu", True),
    ("gemmascope", "jump_relu", False),
    ("gemmascope2", "jump_relu", True),
    ("eleuther_topk", "topk", True),
]


def _reference(model, raw: list[dict], activation: str, *, mlp_input: bool = True
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Activations and reconstructions straight from the raw tensors, on the MLP input computed
    from TransformerLens's own cache (gamma2 * ln2.hook_normalized + beta2), or on
    ln2.hook_normalized itself (``mlp_input=False``: what GemmaScope transcoders read)."""
    L = model.cfg.n_layers
    names = [f"blocks.{l}.ln2.hook_normalized" for l in range(L)]
    _, cache = model.run_with_cache(torch.tensor([TOKENS]), names_filter=lambda n: n in names)
    acts, recons = [], []
    for l, t in enumerate(raw):
        ln2 = model.blocks[l].ln2
        x = cache[names[l]][0]
        if mlp_input:
            x = x * ln2.w + (ln2.b if hasattr(ln2, "b") else 0.0)
        h = x @ t["W_enc"] + t["b_enc"]
        if activation == "jump_relu":
            a = h * (h > t["threshold"])
        elif activation == "topk":
            r = torch.relu(h)
            a = r * torch.zeros_like(r).scatter_(-1, r.topk(t["k"], dim=-1).indices, 1.0)
        else:
            a = torch.relu(h)
        rec = a @ t["W_dec"] + t["b_dec"] + (x @ t["W_skip"].T if "W_skip" in t else 0.0)
        acts.append(a)
        recons.append(rec)
    return acts, recons


@pytest.mark.parametrize("arch", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("fmt,activation,skip", CASES, ids=[f"{f}-{a}{'-skip' if s else ''}" for f, a, s in CASES])
def test_format_loads_and_is_exact(tmp_path, arch, fmt, activation, skip):
    model = tiny_model(**arch)
    raw = random_layer_dictionary(model, activation=activation, skip=skip)
    d = save_layer_dictionary(tmp_path / fmt, raw, fmt)
    assert detect_format(d) == fmt
    adapter = ModelAdapter(model)
    tcs = load_dictionaries(d, adapter)
    assert tcs.format == fmt
    g = attribute(adapter, TOKENS, tcs)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    acts, recons = _reference(model, raw, activation, mlp_input=fmt != "gemmascope")
    lin = g.context.linearisation
    ctx = g.context
    n_feat = 0
    for l in range(model.cfg.n_layers):
        for t in range(1, len(TOKENS)):
            for j in acts[l][t].nonzero().flatten().tolist():
                node = g.node(NodeId("feature", l, t, j))
                assert abs(node.activation - float(acts[l][t, j])) < 1e-5
                n_feat += 1
            (write,) = ctx.writes(NodeId("error", l, t, 0))
            torch.testing.assert_close(write.vector, lin.mlp_out[l][t] - recons[l][t], atol=2e-5, rtol=0)
    assert n_feat == sum(n.kind == "feature" for n in g.nodes) > 0


def test_transcoder_set_lists_its_files_and_records_the_format(tmp_path):
    import yaml

    from circuitgraph.pipeline.runner import run
    from circuitgraph.spec import load_spec

    model = tiny_model(**GPT2)
    bundle = save_bundle(tmp_path / "b", model)
    d = save_layer_dictionary(tmp_path / "ts", random_layer_dictionary(model), "circuit_tracer_transcoder_set")
    (d / "files").mkdir()
    for i in range(2):
        (d / f"layer_{i}.safetensors").rename(d / "files" / f"L{i}.safetensors")
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["transcoders"] = ["files/L0.safetensors", "files/L1.safetensors"]
    cfg["scan"] = "example-org/example-transcoders"
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "format_version": 1, "model": {"path": str(bundle / "model")},
        "transcoders": {"path": str(d), "format": "circuit_tracer_transcoder_set"},
        "prompt": {"tokens": TOKENS}, "targets": [{"top_logits": {"max_n": 2}}],
        "export": {"json": str(tmp_path / "out" / "g.json"), "neuronpedia": str(tmp_path / "out" / "np.json")}}))
    result = run(load_spec(spec))
    assert result.graph.metadata["transcoders"]["format"] == "circuit_tracer_transcoder_set"
    assert json.loads((tmp_path / "out" / "np.json").read_text())["metadata"]["scan"] == \
        "example-org/example-transcoders"


BAD = [("circuit_tracer_transcoder_set", "missing layer file"), *[(f, w) for f in
       ("circuit_tracer_transcoder_set", "gemmascope2", "eleuther_topk") for w in ("wrong shape", "NaN weights")]]


@pytest.mark.parametrize("fmt,what", BAD, ids=[f"{f}-{w}" for f, w in BAD])
def test_bad_layer_dictionary_is_one_line_naming_the_file(tmp_path, fmt, what):
    from safetensors.torch import load_file, save_file

    model = tiny_model(**GPT2)
    act = {"circuit_tracer_transcoder_set": "relu", "gemmascope2": "jump_relu", "eleuther_topk": "topk"}[fmt]
    d = save_layer_dictionary(tmp_path / fmt, random_layer_dictionary(model, activation=act), fmt)
    f = {"circuit_tracer_transcoder_set": d / "layer_1.safetensors", "gemmascope2": d / "layer_1" / "params.safetensors",
         "eleuther_topk": d / "layers.1.mlp" / "sae.safetensors"}[fmt]
    if what == "missing layer file":  # layer_1 present, layer_0 gone
        f = d / "layer_0.safetensors"
        f.unlink()
    else:
        t = load_file(str(f))
        key = next(k for k in t if t[k].ndim == 2 and "skip" not in k)
        t[key] = t[key][:, :-1].contiguous() if what == "wrong shape" else t[key]
        if what == "NaN weights":
            t[key][0, 0] = float("nan")
        save_file(t, str(f))
    with pytest.raises((LoadError, ShapeMismatchError, NumericalError)) as info:
        load_dictionaries(d, ModelAdapter(model))
    assert f.name in str(info.value) and "\n" not in str(info.value)


def test_unknown_folder_names_the_layouts(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "weights.bin").write_text("")
    with pytest.raises(LoadError, match="no dictionary format recognised"):
        detect_format(tmp_path / "x")


def _ct_set_from_gemmascope2(model, tmp: Path) -> Path:
    """GemmaScope-2 tensors (w_enc, w_dec, threshold, affine_skip_connection) as circuit-tracer lists
    them in a transcoder_set: layer_<i>.safetensors next to a config.yaml reading mlp.hook_in."""
    import yaml

    d = save_layer_dictionary(tmp / "gs2", random_layer_dictionary(model, activation="jump_relu", skip=True),
                              "gemmascope2")
    out = tmp / "gs2-set"
    out.mkdir()
    for i in range(model.cfg.n_layers):
        (d / f"layer_{i}" / "params.safetensors").rename(out / f"layer_{i}.safetensors")
    (out / "config.yaml").write_text(yaml.safe_dump({"model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in",
                                                     "feature_output_hook": "mlp.hook_out"}))
    return out


def test_per_layer_formats_equal_circuit_tracers(tmp_path):
    """circuit-tracer's own load_transcoder_set (mlp.hook_in, ReLU / JumpReLU / skip, GemmaScope-2 tensors, and a
    Gemma-2-style model whose transcoders write mlp.hook_out, before the post-MLP norm, with a skip path):
    every edge within 1e-5 of the largest, same features."""
    from benchmarks.circuit_tracer import clt_agreement

    circuit_tracer_or_skip()
    jobs = []
    gemma2 = dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True, n_layers=3)  # writes mlp.hook_out
    for name, arch, act, skip in [("gpt2 relu", GPT2, "relu", False), ("llama jump_relu skip", LLAMA, "jump_relu", True),
                                  ("llama gemmascope2", LLAMA, None, True),
                                  ("gemma2 jump_relu skip before the post-norm", gemma2, "jump_relu", True)]:
        work = tmp_path / name.replace(" ", "-")
        model = tiny_model(**arch)
        bundle = save_bundle(work, model)
        if act is None:
            d = _ct_set_from_gemmascope2(model, work)
        else:
            d = save_layer_dictionary(work / "ts", random_layer_dictionary(model, activation=act, skip=skip),
                                      "circuit_tracer_transcoder_set")
        jobs.append({"name": name, "model": str(bundle / "model"), "clt": str(d), "tokens": json.dumps(TOKENS),
                     "out": str(work / "ct.npz")})
    clt_agreement.run_circuit_tracer(jobs, tmp_path, clt_agreement.ct_python())
    for job in jobs:
        r = clt_agreement.compare(job)
        assert r["max_difference_relative_to_largest_edge"] < 1e-5, r
        assert r["n_features_ct"] == r["n_features_circuitgraph"] > 0, r
        assert r["our_nodes_not_in_ct"] == [], r
        assert r["completeness"]["max_relative_violation"] < 1e-5, r


def test_dictionary_config_yaml_is_read_through_the_hardened_reader(tmp_path):
    """A circuit-tracer ``config.yaml`` is read like every user file (``_io.read_yaml_file``): a
    regular file of bounded size, UTF-8, one LoadError naming the file."""
    from circuitgraph.adapters.dictionary_fit import read_declared
    from circuitgraph.dictionaries.clt import read_config_yaml

    cfg = tmp_path / "config.yaml"
    cfg.write_bytes(b"model_kind: [\n")
    with pytest.raises(LoadError, match=r"config\.yaml: not valid YAML"):
        read_config_yaml(cfg)
    cfg.write_bytes(b"model_kind: \xff\xfe\n")
    with pytest.raises(LoadError, match=r"dictionary config .*config\.yaml is not UTF-8 text"):
        read_config_yaml(cfg)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(LoadError, match=r"folder\.yaml is not a regular file"):
        read_config_yaml(folder)
    cfg.write_text("model_kind: transcoder_set\n")
    assert read_config_yaml(cfg) == {"model_kind": "transcoder_set"}
    assert read_declared(tmp_path) is not None  # the fit check reads the same file the same way
