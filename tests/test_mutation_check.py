"""scripts/mutation_check.py still applies to the current code: each of its mistakes replaces text
that occurs exactly once (running the mutations themselves takes minutes: run the script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutation_check", REPO / "scripts" / "mutation_check.py")
mutation_check = importlib.util.module_from_spec(spec)
sys.modules.setdefault("mutation_check", mutation_check)  # dataclasses look their module up
spec.loader.exec_module(mutation_check)


@pytest.mark.parametrize("mutation", mutation_check.MUTATIONS, ids=lambda m: m.name)
def test_mutation_applies_exactly_once(mutation):
    text = (REPO / mutation.path).read_text()
    assert text.count(mutation.find) == 1, f"{mutation.name}: update scripts/mutation_check.py"
    assert mutation.replace != mutation.find


def test_mutations_cover_the_listed_mistakes():
    names = {m.name for m in mutation_check.MUTATIONS}
    assert {"reversed-decoder-rows", "ln1-sigma-for-ln2", "wrong-head", "off-by-one-position",
            "transposed-attention-map"} <= names


def test_every_stage_that_computes_a_number_has_a_mistake():
    """The engine, the fold and the ranking of max_feature_nodes, pruning, the queries and the
    Neuronpedia export each carry at least one mutation, whose test files exist."""
    paths = {m.path for m in mutation_check.MUTATIONS}
    assert {"circuitgraph/attribution/engine.py", "circuitgraph/attribution/nodes_builder.py",
            "circuitgraph/attribution/frozen_model.py", "circuitgraph/attribution/dense_rows.py",
            "circuitgraph/attribution/feature_selection.py", "circuitgraph/queries/prune.py",
            "circuitgraph/queries/paths.py", "circuitgraph/queries/influence.py", "circuitgraph/queries/qk.py",
            "circuitgraph/export/neuronpedia.py"} <= paths
    assert "selection-reversed-ranking" in {m.name for m in mutation_check.MUTATIONS}
    for m in mutation_check.MUTATIONS:
        assert m.tests and all((REPO / t.split("::")[0]).is_file() for t in m.tests), m.name


def test_loaders_conversions_datasets_interventions_and_files_have_mistakes():
    """The model and dictionary loaders, the Hugging Face conversion, the native forward, dataset
    reduction, interventions, steering, dashboards' top-k and both graph file formats each carry a
    mutation (issue 34)."""
    paths = {m.path for m in mutation_check.MUTATIONS}
    assert {"circuitgraph/adapters/loading.py", "circuitgraph/dictionaries/saelens_native.py",
            "circuitgraph/adapters/hf_config.py", "circuitgraph/adapters/native_transformer.py",
            "circuitgraph/datasets/reduce.py", "circuitgraph/validation/interventions.py",
            "circuitgraph/validation/steering.py", "circuitgraph/features/topk.py", "circuitgraph/export/binary.py",
            "circuitgraph/export/json_graph.py"} <= paths


def test_the_copy_is_the_whole_tree():
    """What the tests read besides the package (schemas, docs, examples, benchmarks) is copied."""
    files = set(mutation_check.tree_files())
    for rel in ("pyproject.toml", "README.md", "schemas", "docs", "examples", "benchmarks", "tests", "scripts"):
        assert rel in files or any(f.startswith(rel + "/") for f in files), rel
