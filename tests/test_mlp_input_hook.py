"""Dictionaries reading the MLP's input (``blocks.<l>.mlp.hook_in``): sae-lens per-layer
transcoders and circuit-tracer CLTs.  circuitgraph folds ln2's weight and bias into the encoder
(one implementation, circuitgraph.dictionaries.mlp_input); checked here against what the model
really feeds its MLP (a forward pre-hook on ``blocks[l].mlp``, no TransformerLens hook names),
the dictionaries' own forward (sae-lens ``encode`` / the raw safetensors), completeness and
interventions on the frozen model.  circuit-tracer agreement for mlp.hook_in CLTs is in
tests/test_clt.py (benchmarks/circuit_tracer/clt_agreement.py CASES)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import attribute
from circuitgraph.dictionaries import load_dictionaries
from circuitgraph.testing.synthetic import random_clt, random_transcoders, save_bundle, save_clt, tiny_model

GPT2 = dict(norm="LN", mlp="gelu", positional="learned", n_layers=3)
LLAMA = dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2, n_layers=3)
TOKENS = [1, 5, 7, 9, 4, 3, 11]


def _mlp_inputs(model) -> dict[int, torch.Tensor]:
    """What each block's MLP module is really called with on TOKENS, ``{layer: (pos, d_model)}``."""
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
    """The graph's reader of feature ``n`` applied to the residual stream: ``direction . resid_mid +
    own_constant`` (the folded encoder row through ln2, plus the folded bias)."""
    from circuitgraph.attribution import ResidualLocation

    r = g.context.reader(n.id)
    assert r.location == ResidualLocation.resid_mid(n.layer)
    x = g.context.linearisation.resid_mid[n.layer][n.position]
    return float(r.direction.double() @ x.double() + r.own_constant)


def _check_interventions(g, n_layers: int) -> None:
    """Removing a feature from the frozen real model changes every reader by exactly its edge."""
    from circuitgraph.validation.frozen import frozen_reader_values

    ctx = g.context
    base = frozen_reader_values(ctx)
    scale = float(np.abs(g.edge_weight).max())
    feats = [n.id for n in g.nodes if n.kind == "feature" and n.layer < n_layers - 1][:3]
    assert feats
    edges = {(g.nodes[t].id, g.nodes[s].id): w for t, s, w in zip(g.edge_target, g.edge_source, g.edge_weight, strict=False)}
    for f in feats:
        after = frozen_reader_values(ctx, [f])
        for r, v in base.items():
            assert abs((v - after[r]) - edges.get((r, f), 0.0)) < 1e-5 * scale, (f, r)


@pytest.mark.parametrize("arch,kind", [(GPT2, "skip"), (LLAMA, "jumprelu_skip"), (GPT2, "relu")],
                         ids=["gpt2-skip", "llama-jumprelu-skip", "gpt2-relu"])
def test_saelens_transcoders_reading_mlp_hook_in(tmp_path, arch, kind):
    model = tiny_model(**arch)
    tcs = random_transcoders(model, kind=kind, input_site="mlp_input")
    assert tcs[0].cfg.metadata.hook_name == "blocks.0.mlp.hook_in"
    bundle = save_bundle(tmp_path / "b", model, tcs)
    adapter = ModelAdapter(model)
    loaded = load_dictionaries(bundle / "transcoders", adapter)
    assert loaded[1].hook_in == "blocks.1.ln2.hook_normalized"  # folded
    g = attribute(adapter, TOKENS, loaded)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    x = _mlp_inputs(model)
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert {n.layer for n in feats} == {0, 1, 2}
    with torch.no_grad():
        acts = {l: tcs[l].encode(x[l]) for l in tcs}  # sae-lens's own forward on the true MLP input
        for n in feats:
            assert abs(n.activation - float(acts[n.layer][n.position, n.index])) < 1e-5, n.id
            tc = tcs[n.layer]
            pre = float(x[n.layer][n.position] @ tc.W_enc[:, n.index] + tc.b_enc[n.index])
            assert abs(_reader_pre(g, n) - pre) < 1e-5 * max(1.0, abs(pre)), n.id
        # the error node of layer l = true MLP output - the transcoder's own decode (skip path included)
        mlp_out = {}
        hs = [b.mlp.register_forward_hook(lambda m, a, o, l=l: mlp_out.__setitem__(l, o[0].detach()))
              for l, b in enumerate(model.blocks)]
        model(torch.tensor([TOKENS]))
        for h in hs:
            h.remove()
        from circuitgraph.graph.nodes import NodeId

        for l in tcs:
            a = acts[l].clone()
            a[0] = 0  # position 0 (BOS) is a constant in the graph
            recon = a @ tcs[l].W_dec + tcs[l].b_dec
            if getattr(tcs[l], "W_skip", None) is not None:
                recon = recon + x[l] @ tcs[l].W_skip.T
            for t in range(1, len(TOKENS)):
                (w,) = g.context.writes(NodeId("error", l, t, 0))
                torch.testing.assert_close(w.vector.float(), mlp_out[l][t] - recon[t], atol=2e-5, rtol=0)
    _check_interventions(g, 3)


@pytest.mark.parametrize("arch,act,skip", [(GPT2, "relu", True), (LLAMA, "jump_relu", False)],
                         ids=["gpt2-relu-skip", "llama-jumprelu"])
def test_clt_reading_mlp_hook_in(tmp_path, arch, act, skip):
    from safetensors.torch import load_file

    model = tiny_model(**arch)
    d = save_clt(tmp_path / "clt", random_clt(model, activation=act, input_site="mlp_input", skip=skip))
    adapter = ModelAdapter(model)
    clt = load_dictionaries(d, adapter)
    assert clt.describe()["feature_input_hook"] == "mlp.hook_in"
    g = attribute(adapter, TOKENS, clt)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    x = _mlp_inputs(model)
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert {n.layer for n in feats} == {0, 1, 2}
    for n in feats:  # the CLT's forward from its raw files on the true MLP input
        e = load_file(str(d / f"W_enc_{n.layer}.safetensors"))
        h = float(x[n.layer][n.position] @ e[f"W_enc_{n.layer}"][n.index] + e[f"b_enc_{n.layer}"][n.index])
        assert abs(n.activation - h) < 1e-5, n.id
        assert abs(_reader_pre(g, n) - h) < 1e-5 * max(1.0, abs(h)), n.id
    _check_interventions(g, 3)


def _cli_run(tmp_path, model_dir, tc_dir):
    from typer.testing import CliRunner

    from circuitgraph.cli import main as cli

    spec = tmp_path / "spec.yaml"
    spec.write_text("format_version: 1\n"
                    f"model: {{path: {model_dir}}}\n"
                    f"transcoders: {{path: {tc_dir}}}\n"
                    f"prompt: {{tokens: {TOKENS}}}\n"
                    "targets: [{top_logits: {max_n: 3}}]\n"
                    f"export: {{json: {tmp_path / 'out' / 'graph.json'}}}\n")
    return CliRunner().invoke(cli.app, ["run", str(spec)])


def _assert_one_line(res, tmp_path, *needles):
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not (tmp_path / "out").exists()


def test_bad_mlp_hook_in_dictionaries_are_one_line_exit_2(tmp_path):
    """sae-lens folder whose mlp.hook_in names another layer; an mlp.hook_in CLT with NaN in the
    encoder the load-time bias fold reads; an unsupported input hook: one line naming the file."""
    import json

    from safetensors.torch import load_file, save_file

    model = tiny_model(**GPT2)
    bundle = save_bundle(tmp_path / "b", model, random_transcoders(model, input_site="mlp_input"))
    cfg = bundle / "transcoders" / "layer_1" / "cfg.json"
    data = json.loads(cfg.read_text())
    data["metadata"]["hook_name"] = "blocks.2.mlp.hook_in"
    cfg.write_text(json.dumps(data))
    _assert_one_line(_cli_run(tmp_path, bundle / "model", bundle / "transcoders"), tmp_path,
                     str(bundle / "transcoders" / "layer_1"), "layer 1", "layer 2")

    d = save_clt(tmp_path / "clt", random_clt(model, input_site="mlp_input"))
    t = load_file(str(d / "W_enc_1.safetensors"))
    t["W_enc_1"][3, 2] = float("nan")
    save_file(t, str(d / "W_enc_1.safetensors"))
    _assert_one_line(_cli_run(tmp_path, bundle / "model", d), tmp_path, "W_enc_1.safetensors", "NaN")

    cfg = d / "config.yaml"
    cfg.write_text(cfg.read_text().replace("mlp.hook_in", "mlp.hook_pre"))
    _assert_one_line(_cli_run(tmp_path, bundle / "model", d), tmp_path, str(cfg), "mlp.hook_pre", "mlp.hook_in")
