"""The facts the two case studies rest on (docs/case_studies.md), on SmolLM2-135M-Instruct.

* the a/an neuron: patching L25 N1527 alone from "... apple tree and picked" into "... lemon
  tree and picked" recovers most of the " an" - " a" difference, as much as its whole MLP
  layer, and congruence with the unembedding (" an" - " a") names it first in its layer;
* the double-negative echo: removing the echo of the echo-dominated neurons (selected on some
  rows) raises the next-token loss on other rows several times more than random neurons
  matched on the echo they remove there.

The text is written here (no file of this machine is read).  Each test takes well under a minute.
"""

from __future__ import annotations

import pytest
import torch

from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.attribution.targets import resolve_token
from circuitgraph.validation import Metric, Unit, patch_recovery, sign_regimes
from circuitgraph.validation._common import resolve_prompt

pytestmark = pytest.mark.real

CLEAN = "I climbed up the pear tree and picked a pear. I climbed up the apple tree and picked"
CORRUPTED = "I climbed up the pear tree and picked a pear. I climbed up the lemon tree and picked"

TEXT = [
    "The river had frozen early that year, and the children of the village spent every afternoon sliding across "
    "the ice while their parents watched from the bank, worried and proud at the same time.",
    "To install the package, open a terminal, change into the project folder and run the setup script; if it "
    "complains about missing headers, install the development files for your compiler first.",
    "She wrote letters to her brother every week, describing the markets, the noise of the trains and the "
    "strange food she had learned to like since moving to the city.",
    "In 1887 the observatory bought a new telescope, and for the first time the astronomers could see the faint "
    "companions of the bright stars they had catalogued for decades.",
    "A good bread needs only flour, water, salt and time. Most of the flavour comes from the long, slow "
    "fermentation, not from anything the baker adds at the end.",
    "The committee met on Tuesday to discuss the budget, but the meeting ended without a decision because two "
    "members insisted on reading every line of the report aloud.",
    "When the storm reached the coast, the fishermen pulled their boats far up the beach and tied them to the "
    "old posts that had survived every winter for a hundred years.",
    "Our results show that the method works well on small data sets, although it becomes slow when the number "
    "of variables grows beyond a few thousand.",
    "He opened the door slowly, expecting to find the room empty, and was surprised to see an old man sitting "
    "by the window, reading a newspaper from the previous century.",
    "The museum is open every day except Monday. Tickets can be bought at the entrance or online, and children "
    "under twelve enter for free when accompanied by an adult.",
    "Mountains shape the weather of the whole valley: clouds coming from the sea rise against the slopes, cool "
    "down and drop their rain before they ever reach the town.",
    "If you want to learn a language quickly, read simple stories aloud, write a few sentences every evening "
    "and do not be afraid of making mistakes in front of other people.",
    "The old library kept its rarest books in a locked room on the top floor, and only two librarians knew "
    "where the key was hidden during the long summer holidays.",
    "Engineers tested the bridge by driving heavy trucks across it one after another, measuring how far the "
    "steel bent and how quickly it returned to its original shape.",
    "Every spring the birds returned to the same trees near the lake, building their nests from grass, feathers "
    "and the bits of string that the gardener left lying around.",
    "The recipe calls for three eggs, a cup of sugar and a little lemon zest; beat them together until the "
    "mixture is pale and thick before folding in the flour.",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return load_model_dir(smollm2_dir, dtype="float32")


def test_the_a_an_neuron_carries_its_layer(smollm2):
    a = smollm2
    tok = a.tokenizer
    an, art = (resolve_token(t, tok, a.facts.d_vocab, "test") for t in (" an", " a"))
    clean, corrupted = resolve_prompt(CLEAN, tok), resolve_prompt(CORRUPTED, tok)
    neuron, mlp = patch_recovery(a, clean, corrupted, [[Unit("neuron", 25, None, 1527)], [Unit("mlp", 25, None)]],
                                 Metric.logit_diff(an, art))
    assert neuron > 0.5 and mlp > 0.5  # measured: 0.62 and 0.65
    assert neuron / mlp > 0.8  # one neuron: most of its layer's recovery
    # output congruence with the unembedding names it: the largest dot product with " an" - " a" in MLP 25
    w_out = a.mlp_weights(25)["W_out"]  # (d_mlp, d_model)
    u = a.model.W_U[:, an] - a.model.W_U[:, art]
    assert int((w_out.float() @ u.float()).argmax()) == 1527


def test_removing_the_echo_costs_more_than_matched_random_neurons(smollm2):
    res = sign_regimes(adapter=smollm2, prompts=TEXT[::2], eval_prompts=TEXT[1::2], top_k=10, n_controls=3,
                       groups=False, seed=0)
    assert not res.same_rows and res.status == "ok", res.reason
    matched = res.group("all").control("matched_magnitude")
    assert len(res.echo_dominated) > 100
    assert res.loss_change > 0
    assert res.loss_change > 2 * max(matched.mean, 0.0)  # several times its matched control
    assert max(matched.effects) < res.loss_change


def test_the_echo_statistics_on_an_executor_equal_the_in_process_ones(smollm2, smollm2_dir):
    """The real model's per-neuron statistics folded by a worker process (shards of one row,
    merged in row order) equal this process's, field for field (one torch thread each)."""
    from circuitgraph.datasets.echo_runs import ExecutorRows
    from circuitgraph.datasets.executors import LocalExecutor
    from circuitgraph.spec import load_spec
    from circuitgraph.validation.echo_stats import stream_stats

    tok = smollm2.tokenizer
    rows = [resolve_prompt(t, tok)[:40] for t in TEXT[:2]]
    layers = [0, 1, 25]
    spec = load_spec({"format_version": 1, "model": {"path": str(smollm2_dir), "dtype": "float32"},
                      "prompt": {"tokens": rows[0]}})
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = stream_stats(smollm2, rows, layers, 10)
        there = ExecutorRows(spec, LocalExecutor(workers=1), smollm2.facts.d_mlp, shard_rows=1).stats(rows, layers, 10, 1)
    finally:
        torch.set_num_threads(n)
    for l in layers:
        for name in ("top_values", "top_echo", "regime_counts", "ever_open", "echo_mass", "echo_count"):
            assert torch.equal(getattr(here[l], name), getattr(there[l], name)), (l, name)
