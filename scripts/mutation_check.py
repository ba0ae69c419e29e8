#!/usr/bin/env python
"""Show that the test suite catches wrong numbers: apply one deliberate mistake at a time to a
COPY of the code and check that a fast subset of the tests fails on each.

    python scripts/mutation_check.py                 # every mutation, the default subset
    python scripts/mutation_check.py --list          # the mutations
    python scripts/mutation_check.py --only reversed-decoder-rows wrong-head
    python scripts/mutation_check.py --tests tests/test_edges_independent.py

For each mutation the whole working tree (every file git tracks or would track: the package,
tests, examples, schemas, docs, benchmarks, pyproject.toml) is copied to a temporary directory,
one exact piece of source text is replaced (it must occur exactly once, so a mutation cannot
silently stop applying when the code changes; tests/test_mutation_check.py checks that too),
and pytest runs the mutation's subset of the tests there with ``-x`` (each mutation names the
test files that must catch it; ``--tests`` overrides them for every mutation).  The unmutated
copy is run first on the union of the subsets and must pass.  circuit-tracer's virtualenv
(``.venv-ct``, ignored by git) is not copied: the copies are pointed at it through
``CIRCUITGRAPH_CT_PYTHON`` when it exists.  Every stage that computes a number has mistakes
here: the engine and its writers/readers, the frozen model, the ``max_feature_nodes`` ranking
and fold, pruning, the queries (paths, influence, total effects, QK) and the Neuronpedia export.  Prints one line per mutation (caught / NOT CAUGHT, the first failing test; a pytest run
that ends in anything but test failures is an ERROR, not a catch) and exits 1 if any mutation
is not caught.  The working tree is never modified.

The last full run (2 cores, ``OMP_NUM_THREADS=1``, about 9 minutes): 21 of 21 mutations caught.

    reversed-decoder-rows, ln1-sigma-for-ln2, neuron-ln1-sigma, wrong-head, off-by-one-position,
    transposed-attention-map, transposed-skip, no-centring, engine-edge-to-wrong-reader
        by tests/test_edges_independent.py::test_every_edge_equals_the_libraries_removal
    engine-reader-constant-dropped    by tests/test_attribution.py::test_completeness_every_node
    fold-keeps-one-writer             by tests/test_attribution.py::test_max_feature_nodes_keeps_completeness
    selection-reversed-ranking        by tests/test_attribution.py::test_max_feature_nodes_selects_the_most_influential_features
    neuron-candidates-without-gate    by tests/test_neuron_selection.py (not in the last full run)
    neuron-selection-skips-round-refresh  by tests/test_neuron_selection.py (not in the last full run)
    cumulative-influence-ascending    by tests/test_queries_prune.py::test_cumulative_scores_are_the_shares_of_the_nodes_ranked_at_or_above
    prune-threshold-ascending         by tests/test_queries_prune.py::test_find_threshold_by_hand
    paths-no-divisor                  by tests/test_queries_paths.py::test_exact_kbest_equals_brute_force
    influence-row-divisor-off, total-effect-gain-inverted
        by tests/test_queries_influence.py::test_chain_by_hand
    qk-rotation-transposed, qk-key-read-at-query-position
        by tests/test_qk.py::test_sums_equal_the_model_score_every_head_float32
    neuronpedia-links-reversed, neuronpedia-influence-of-the-pruned-graph
        by tests/test_neuronpedia.py::test_scores_and_nodes_equal_circuit_tracers_file
    diff-ranked-by-unsigned-influence, diff-sign-flip-inverted (run alone, 2026-12-03)
        by tests/test_diff.py::test_clean_vs_corrupted_equals_an_independent_tally

Added since (run alone with ``--only``, each caught): patch-sweep-wrong-neuron by
tests/test_patching_sweep.py::test_neuron_sweep_equals_a_hand_loop_of_single_patches;
echo-closed-gate-counts-as-echo by tests/test_echo.py::test_layer_stats_by_hand;
echo-controls-matched-on-selection-rows by
tests/test_echo.py::test_selection_and_evaluation_rows_match_an_independent_computation;
sparsify-resume-at-averaged-point, topk-unfold-multiplies-gamma, sparsify-read-without-gamma and
topk-keeps-the-smallest by tests/test_training_topk.py (each applied by hand, 2026-12-03);
echo-shard-mass-dropped by
tests/test_echo_executors.py::test_statistics_merge_exactly_however_the_rows_are_split;
patching-estimate-one-pass by tests/test_check_estimate.py::test_the_estimate_matches_the_measured_check;
removal-estimate-one-run, check-stage-not-in-the-plan by tests/test_check_estimate.py,
check-refusal-before-the-graphs-advice by
tests/test_check_estimate.py::test_a_prompt_check_that_does_not_fit_is_refused_with_its_advice and
reader-lookup-maps-every-candidate, writer-lookup-maps-every-candidate and writer-lookup-wrong-row by
tests/test_candidate_lookups.py (run with ``--only``);
ablate-controls-matched-on-the-graph-prompt by
tests/test_ablate_eval_rows.py::test_the_change_is_the_mean_over_the_evaluation_rows;
gradient-linearised-gate-live, gradient-read-at-the-previous-position and
predicted-gradient-sign-flipped by tests/test_gradient_effects.py (run with ``--only``, 2026-12-03).

Issue 34's mutations (2026-12-03, each applied alone to a copy of the tree, its tests passing
unmutated first; about 2.5 CPU minutes in all): every one caught.

    model-loader-accepts-missing-weights  by tests/test_broken_bundles.py::test_broken_bundle[weights missing tensor]
    saelens-native-encoder-without-b-enc  by tests/test_sae_lens_native.py::test_native_equals_sae_lens[normalized-jumprelu]
    hf-llama-rotary-adjacent-pairs
        by tests/test_model_families.py::test_folder_loads_through_the_spec_and_matches_transformers[llama]
    native-norm-without-eps
        by tests/test_native_transformer.py::test_logits_and_every_hook_equal_in_float64[gpt2-ln-gelu_new]
    dataset-edges-reversed
        by tests/test_datasets.py::test_aggregate_equals_independent_aggregation_of_the_graphs
    intervention-next-index               by tests/test_validation.py::test_interventions_equal_raw_hooks
    steer-all-skips-the-first-new-token
        by tests/test_steering.py::test_feature_interventions_equal_an_independent_computation[transcoders-set-all-live-attention]
    topk-ties-to-the-last-row             by tests/test_features.py::test_merge_is_independent_of_the_split
    binary-graph-reads-edges-reversed     by tests/test_export.py::test_binary_round_trip_is_lossless[float32-False]
    json-graph-reads-constant-as-pre-activation  by tests/test_export.py::test_json_round_trip_is_lossless[float32]
    tiers-ignore-helpers                  by tests/test_tiers.py::test_a_test_calling_a_skip_helper_is_in_its_tier
    explorer-export-offers-a-fixed-list
        by tests/test_serve_registries.py::test_a_kind_registered_with_explorer_is_listed_and_saved
    explorer-page-links-a-fixed-list
        by tests/test_serve_browser_downloads.py::test_pin_two_nodes_and_save_them_in_every_offered_kind
        (both run with ``--only`` on 2026-12-04: about 13 CPU seconds together)
    dictionary-hook-table-normalized-as-raw (the review's one hook table, 2026-12-04, run with ``--only``: 18 CPU s)
        by tests/test_dictionary_formats.py::test_format_loads_and_is_exact[gemmascope-jump_relu-gpt2]

The spec's item factory and the typed node attributes (2026-12-04, run with ``--only``, each caught):

    spec-item-default-when-required
        by tests/test_spec_items.py::test_each_item_is_its_parameter_model_under_its_key[query-top_paths]
    graph-file-drops-foreign-node-attrs
        by tests/test_node_attrs.py::test_graph_files_keep_the_attributes_of_other_tools
    remainder-count-a-numpy-int  by tests/test_node_attrs.py::test_every_attribute_a_graph_carries_is_registered
    linearised-total-and-constant-swapped
        by tests/test_component_inputs.py::test_query_and_key_identity_on_families_with_qk_norms_and_soft_caps[gemma2]

The source records (2026-12-04, run with ``--only``: about 10 CPU seconds together, each caught):

    model-source-key-without-a-record
        by tests/test_source_records.py::test_every_model_source_key_has_one_record_with_a_loader_and_back
    allowed-model-mismatch-not-recorded
        by tests/test_source_records.py::test_an_allowed_model_mismatch_is_in_the_source_the_dictionary_is_made_with

One metadata model (2026-12-04, run with ``--only``: caught in 7 s; also by
tests/test_graph_model.py::test_no_module_writes_a_metadata_key_by_hand):

    metadata-key-written-by-hand  by tests/test_graph_model.py::test_a_run_writes_only_declared_metadata_keys

The pyright pass over validation/, dictionaries/ and adapters/ (2026-12-04, run with ``--only``: 22 CPU s
for both, each caught):

    native-rotary-size-ignores-rotary-dim
        by tests/test_native_transformer.py::test_logits_and_every_hook_equal_in_float64[rms-gated-rotary-partial-adjacent]
    ablate-eval-rows-sum-drops-a-row
        by tests/test_ablate_eval_rows.py::test_the_change_is_the_mean_over_the_evaluation_rows
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the fast subset: the engine's identities and the independent edge check
DEFAULT_TESTS = ("tests/test_edges_independent.py", "tests/test_attribution.py")


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # relative to the repository
    find: str
    replace: str
    #: the test files (pytest arguments) that must catch it
    tests: tuple[str, ...] = DEFAULT_TESTS


MUTATIONS = [
    Mutation(
        "unset-source-field-passes-as-none",
        "spec_field hands back None for a field the section's source needs instead of a SpecError naming it",
        "circuitgraph/errors.py",
        "    if value is None:\n        raise SpecError",
        "    if False:\n        raise SpecError",
        ("tests/test_bad_input.py::test_a_source_field_left_unset_is_a_spec_error_naming_it",),
    ),
    Mutation(
        "optional-dictionary-passes-as-none",
        "require_dictionary hands back None instead of saying that a feature or error unit needs the run's "
        "dictionaries (the narrowing every Optional Dictionary goes through)",
        "circuitgraph/dictionaries/protocol.py",
        "    if dictionaries is None:\n",
        "    if False:\n",
        ("tests/test_dictionary_registry.py::test_require_dictionary_names_what_needs_the_dictionaries",),
    ),
    Mutation(
        "probe-call-reads-a-missing-graph",
        "CheckCall.built_graph hands back the dry run's missing graph (None) instead of saying the check needs one",
        "circuitgraph/validation/dispatch.py",
        "        if self.graph is None:\n",
        "        if False:\n",
        ("tests/test_check_estimate.py::test_a_probe_call_has_no_graph_and_says_so",),
    ),
    Mutation(
        "sparsify-resume-at-averaged-point",
        "a resumed sparsify run keeps the schedule-free optimiser's parameters at the averaged point x "
        "(sparsify's own load_state), not back at y as after a save in an uninterrupted run",
        "circuitgraph/training/sparsify_backend.py",
        "                opt.train_mode = False\n",
        "                opt.train_mode = True\n",
        ("tests/test_training_topk.py::test_sparsify_backend_resumes_after_a_stop_with_the_same_weights",),
    ),
    Mutation(
        "topk-unfold-multiplies-gamma",
        "a TopK transcoder written in sparsify's layout with its encoder multiplied by ln2's weight instead of divided",
        "circuitgraph/training/writers.py",
        "        M = M / gamma.double()[None, :]\n",
        "        M = M * gamma.double()[None, :]\n",
        ("tests/test_training_topk.py::test_topk_trains_every_kind_and_circuitgraph_reads_it",),
    ),
    Mutation(
        "sparsify-read-without-gamma",
        "sparsify's encoder read back for the metrics without folding ln2's weight (it reads the MLP input)",
        "circuitgraph/training/sparsify_backend.py",
        "        enc.append((E if gamma is None else E * gamma[None, :]).float())\n",
        "        enc.append(E.float())\n",
        ("tests/test_training_topk.py::test_sparsify_backend_trains_and_circuitgraph_reads_what_sparsify_computes",),
    ),
    Mutation(
        "topk-keeps-the-smallest",
        "TopK keeps the k smallest activations instead of the k largest",
        "circuitgraph/training/dictionary.py",
        "    idx = a.topk(min(k, a.shape[-1]), dim=-1).indices\n",
        "    idx = a.topk(min(k, a.shape[-1]), dim=-1, largest=False).indices\n",
        ("tests/test_training_topk.py::test_topk_trains_every_kind_and_circuitgraph_reads_it",),
    ),
    Mutation(
        "tl-bundle-rotary-default",
        "circuit-tracer's TransformerLens copy of a real Llama-family model keeps TransformerLens's rotary base "
        "10000 instead of the folder's rope_theta (SmolLM2: 100000)",
        "benchmarks/circuit_tracer/tl_bundle_from_hf.py",
        '        d["rotary_base"] = float(theta)\n',
        '        pass\n',
        ("tests/test_real_training.py::test_graph_agrees_with_circuit_tracer",),
    ),
    Mutation(
        "train-skip-transposed",
        "a trained skip transcoder's W_skip written transposed (not what was trained)",
        "circuitgraph/training/writers.py",
        '                t["W_skip"] = c(w.W_skip[i])\n',
        '                t["W_skip"] = c(w.W_skip[i].T)\n',
        ("tests/test_training.py::test_each_kind_trains_and_loads_in_circuitgraph",),
    ),
    Mutation(
        "reversed-decoder-rows",
        "the transcoder's decoder rows in reverse order (each feature writes another feature's row; "
        "the error node absorbs the difference, so completeness still holds)",
        "circuitgraph/attribution/nodes_builder.py",
        'st["dec"][layer] = (active, b.cast(b.transcoders.decoder_rows(layer, active.cpu())))',
        'st["dec"][layer] = (active, b.cast(b.transcoders.decoder_rows(layer, active.cpu())).flip(0))',
    ),
    Mutation(
        "ln1-sigma-for-ln2",
        "a feature's reader direction divided by ln1's sigma instead of ln2's (wrong norm scale)",
        "circuitgraph/attribution/nodes_builder.py",
        "    tc, norm, device, dtype = b.transcoders[layer], fm.ln2[layer], b.device, b.dtype\n",
        "    tc, norm, device, dtype = b.transcoders[layer], fm.ln1[layer], b.device, b.dtype\n",
    ),
    Mutation(
        "neuron-ln1-sigma",
        "a neuron's reader direction divided by ln1's sigma instead of ln2's (wrong norm scale)",
        "circuitgraph/attribution/nodes_builder.py",
        "    g = g / fm.ln2[layer].sigma[t]\n",
        "    g = g / fm.ln1[layer].sigma[t]\n",
    ),
    Mutation(
        "wrong-head",
        "each head's output vector given to the next head's node (labels shifted; the sum is unchanged)",
        "circuitgraph/attribution/nodes_builder.py",
        'heads = torch.einsum("thk,hkd->thd", z, w["W_O"])  # (T, H, d_model)',
        'heads = torch.einsum("thk,hkd->thd", z, w["W_O"]).roll(1, dims=1)  # (T, H, d_model)',
    ),
    Mutation(
        "off-by-one-position",
        "feature writers registered one position early",
        "circuitgraph/attribution/nodes_builder.py",
        "            b.writers.add_scaled(loc, t, rows, scales, basis, at)\n",
        "            b.writers.add_scaled(loc, t - 1, rows, scales, basis, at)\n",
    ),
    Mutation(
        "transposed-attention-map",
        "frozen attention propagated with A instead of A^T (the OV map applied from the wrong side)",
        "circuitgraph/attribution/frozen_model.py",
        "At = self.pattern(layer, T).transpose(1, 2)",
        "At = self.pattern(layer, T)",
    ),
    Mutation(
        "transposed-skip",
        "the skip transcoder's W_skip used untransposed (the error node's skip path)",
        "circuitgraph/attribution/nodes_builder.py",
        "b.cast(lin.tc_input[layer]) @ b.cast(W_skip).T, slice(0, T))",
        "b.cast(lin.tc_input[layer]) @ b.cast(W_skip), slice(0, T))",
    ),
    Mutation(
        "no-centring",
        "LayerNorm's centring left out of the feature reader direction",
        "circuitgraph/attribution/nodes_builder.py",
        "g = NormWeights(None, None, norm.center).reader_direction(W)",
        "g = NormWeights(None, None, False).reader_direction(W)",
    ),
    Mutation(
        "engine-edge-to-wrong-reader",
        "the engine's squeezed edges given to the readers of the batch in reverse order (each edge "
        "lands in another reader's row)",
        "circuitgraph/attribution/engine.py",
        "torch.index_select(batch.node_rows, 0, keep.sub_(writer.mul_(size)), out=target[:kept])",
        "torch.index_select(batch.node_rows.flip(0), 0, keep.sub_(writer.mul_(size)), out=target[:kept])",
    ),
    Mutation(
        "engine-reader-constant-dropped",
        "the engine starts every reader's constant at 0 instead of its own constant (bias, norm offset)",
        "circuitgraph/attribution/engine.py",
        "constants=torch.tensor([table.own_constants[i] for i in readers], dtype=torch.float64, device=device),",
        "constants=torch.tensor([0.0 for i in readers], dtype=torch.float64, device=device),",
    ),
    Mutation(
        "engine-writers-at-wrong-position",
        "each position's writers met with the gradients at the first position of their chunk",
        "circuitgraph/attribution/engine.py",
        "torch.mm(vectors[a - chunk_slot:b - chunk_slot], G[:, positions[g]].T, out=out[a - slot_lo:b - slot_lo])",
        "torch.mm(vectors[a - chunk_slot:b - chunk_slot], G[:, positions[lo]].T, out=out[a - slot_lo:b - slot_lo])",
    ),
    Mutation(
        "engine-stacked-columns-shifted",
        "small batches met together: every batch given the first batch's columns of the stacked GEMM",
        "circuitgraph/attribution/engine.py",
        "            values.copy_(out[:n, col:col + batch.size])",
        "            values.copy_(out[:n, :batch.size])",
        ("tests/test_engine_plan.py", "tests/test_attribution.py"),
    ),
    Mutation(
        "fold-keeps-one-writer",
        "max_feature_nodes' fold keeps one of the unselected features folded into a remainder instead "
        "of their sum",
        "circuitgraph/attribution/dense_rows.py",
        "summed = np.add.reduceat(values[order].astype(np.float64), starts, axis=0).astype(values.dtype)",
        "summed = values[order][starts]",
        ("tests/test_attribution.py",),
    ),
    Mutation(
        "selection-reversed-ranking",
        "max_feature_nodes keeps the least influential features (argsort(infl) for argsort(-infl))",
        "circuitgraph/attribution/feature_selection.py",
        'rank = np.argsort(-infl[node_rows[kind]], kind="stable")',
        'rank = np.argsort(infl[node_rows[kind]], kind="stable")',
        ("tests/test_attribution.py", "tests/test_neuron_selection.py"),
    ),
    Mutation(
        "neuron-candidates-without-gate",
        "max_neuron_nodes' candidate neurons read without their frozen gate (the lazy direction of a "
        "gated neuron is its linear branch's)",
        "circuitgraph/attribution/nodes_builder.py",
        "            g = g * act(pre).to(device=device, dtype=dtype).unsqueeze(-1)",
        "            g = g * 1.0",
        ("tests/test_neuron_selection.py",),
    ),
    Mutation(
        "neuron-selection-skips-round-refresh",
        "max_neuron_nodes ranks every round by the first round's influence (the ranking never sees the "
        "rows it expanded)",
        "circuitgraph/attribution/feature_selection.py",
        "        infl = parts_influence(rows, start)\n",
        "        infl = parts_influence(rows, start) if sum(n_visited.values()) == 0 else infl\n",
        ("tests/test_neuron_selection.py",),
    ),
    Mutation(
        "cumulative-influence-ascending",
        "circuit-tracer's cumulative influence (pruning's cumulative_scores, the Neuronpedia export's "
        "influence) accumulated from the least influential node up",
        "circuitgraph/graph/edges.py",
        '    order = np.argsort(-values, kind="stable")\n',
        '    order = np.argsort(values, kind="stable")\n',
        ("tests/test_queries_prune.py", "tests/test_neuronpedia.py"),
    ),
    Mutation(
        "prune-threshold-ascending",
        "pruning's threshold found on the scores sorted ascending (the cut at the wrong end)",
        "circuitgraph/queries/prune.py",
        "s = np.sort(scores)[::-1]",
        "s = np.sort(scores)",
        ("tests/test_queries_prune.py",),
    ),
    Mutation(
        "paths-no-divisor",
        "a path's exact contribution not divided by the intermediate nodes' pre-activations",
        "circuitgraph/queries/paths.py",
        "value = value * w / d if d != 0 else 0.0",
        "value = value * w if d != 0 else 0.0",
        ("tests/test_queries_paths.py",),
    ),
    Mutation(
        "paths-flow-bottleneck-max",
        "rank 'flow' scoring a path by its strongest edge instead of its weakest",
        "circuitgraph/queries/paths.py",
        "else np.minimum(base_score, score_mid[jj])",
        "else np.maximum(base_score, score_mid[jj])",
        ("tests/test_queries_paths_ranks.py",),
    ),
    Mutation(
        "diagram-hidden-share-of-drawn",
        "the diagram's title giving the drawn nodes' share of the influence as the hidden nodes'",
        "circuitgraph/export/dot.py",
        "        if r not in drawn:\n            left += abs(float(value))",
        "        if r in drawn:\n            left += abs(float(value))",
        ("tests/test_readable_diagrams.py",),
    ),
    Mutation(
        "influence-row-divisor-off",
        "node influence computed without normalising each row by its sum of |w|",
        "circuitgraph/queries/influence.py",
        'out = sweep(gd.dag, abs_start=w, row_divisor=gd.row_divisor)["abs"]',
        'out = sweep(gd.dag, abs_start=w)["abs"]',
        ("tests/test_queries_influence.py",),
    ),
    Mutation(
        "total-effect-gain-inverted",
        "total effects propagated with the pass-through divisors instead of their inverses",
        "circuitgraph/queries/influence.py",
        "gain = safe_inverse(pass_through_divisors(graph))",
        "gain = pass_through_divisors(graph)",
        ("tests/test_queries_influence.py",),
    ),
    Mutation(
        "qk-rotation-transposed",
        "QK attribution's query/key reader directions rotated by R instead of R^T",
        "circuitgraph/attribution/qk_readers.py",
        "W, b = W @ self.R[t].T, self.R[t] @ b",
        "W, b = W @ self.R[t], self.R[t] @ b",
        ("tests/test_qk.py",),
    ),
    Mutation(
        "qk-key-read-at-query-position",
        "QK attribution's key readers built at the query position (its sigma, its rotation) instead of the key's",
        "circuitgraph/queries/qk.py",
        'for side, t in (("q", q_pos), ("k", kp)):',
        'for side, t in (("q", q_pos), ("k", q_pos)):',
        ("tests/test_qk.py",),
    ),
    Mutation(
        "patch-sweep-wrong-neuron",
        "the patching check's neuron sweep patches the next neuron under each neuron's label",
        "circuitgraph/validation/activation_patching.py",
        'jobs.append(("neuron", (Unit("neuron", layer, None, i),), layer, None, i, f"neuron/{layer}/*/{i}"))',
        'jobs.append(("neuron", (Unit("neuron", layer, None, (i + 1) % f.d_mlp),), layer, None, i, '
        'f"neuron/{layer}/*/{i}"))',
        ("tests/test_patching_sweep.py",),
    ),
    Mutation(
        "echo-closed-gate-counts-as-echo",
        "the echo selection counts every closed-gate top activation as an echo, whatever the value's sign",
        "circuitgraph/validation/echo_stats.py",
        "torch.cat([self.top_echo, echo.cpu()]))",
        "torch.cat([self.top_echo, (gate <= 0).cpu()]))",
        ("tests/test_echo.py",),
    ),
    Mutation(
        "echo-shard-mass-dropped",
        "merging a shard of rows (an executor worker's statistics) drops its rows' echo mass",
        "circuitgraph/validation/echo_stats.py",
        "for row in (later.row_echo_mass if later.row_echo_mass is not None else [later.echo_mass]):",
        "for row in [later.echo_mass]:",
        ("tests/test_echo_executors.py",),
    ),
    Mutation(
        "patching-estimate-one-pass",
        "the dry run probes one pass of a patching sweep, missing the previous pass's logits held during the next",
        "circuitgraph/pipeline/check_estimate.py",
        "probed = min(runs, 2 * PATCH_BATCH)",
        "probed = min(runs, PATCH_BATCH)",
        ("tests/test_check_estimate.py",),
    ),
    Mutation(
        "removal-estimate-one-run",
        "the dry run probes predicted_vs_actual/ablate with one removal, not the runs that share a forward pass",
        "circuitgraph/pipeline/check_estimate.py",
        "    probed = min(n_rows, 2 * batch)",
        "    probed = min(n_rows, 2)",
        ("tests/test_check_estimate.py",),
    ),
    Mutation(
        "check-stage-not-in-the-plan",
        "the memory plan leaves out the probed checks' forward passes next to the graph",
        "circuitgraph/attribution/plan.py",
        "                   edges * st.check_edge_bytes + st.check_bytes)",
        "                   0)",
        ("tests/test_check_estimate.py",),
    ),
    Mutation(
        "check-refusal-before-the-graphs-advice",
        "the dry run refuses a check that fits next to a smaller graph instead of advising that graph",
        "circuitgraph/pipeline/estimate.py",
        "              and p.advice and p.advice != [_LAST_RESORT]):",
        "              and False):",
        ("tests/test_check_estimate.py",),
    ),
    Mutation(
        "reader-lookup-maps-every-candidate",
        "a reader lookup on a max_neuron_nodes graph builds the id map of every candidate reader",
        "circuitgraph/attribution/context.py",
        "        if self._reader_index is not None or not _has_candidates(self._tables.nodes):",
        "        if True:",
        ("tests/test_candidate_lookups.py",),
    ),
    Mutation(
        "writer-lookup-maps-every-candidate",
        "a writer lookup on a max_neuron_nodes graph builds the index of every candidate writer",
        "circuitgraph/attribution/nodes_builder.py",
        "        if self._writer_index is not None or not (isinstance(self.nodes, NodeTable) and self.nodes.has_candidates):",
        "        if True:",
        ("tests/test_candidate_lookups.py",),
    ),
    Mutation(
        "writer-lookup-wrong-row",
        "a writer lookup among candidates returns the slots of the next node row",
        "circuitgraph/attribution/nodes_builder.py",
        "            g_i, j_i = (block.rows == row).nonzero(as_tuple=True)",
        "            g_i, j_i = (block.rows == row + 1).nonzero(as_tuple=True)",
        ("tests/test_candidate_lookups.py",),
    ),
    Mutation(
        "ablate-controls-matched-on-the-graph-prompt",
        "ablate with evaluation rows matches its controls on the graph prompt's magnitudes, not the evaluation rows'",
        "circuitgraph/validation/ablation.py",
        "    if evaluation:  # matched on what the units remove on the evaluation rows, summed over them",
        "    if False:  # matched on what the units remove on the evaluation rows, summed over them",
        ("tests/test_ablate_eval_rows.py",),
    ),
    Mutation(
        "echo-controls-matched-on-selection-rows",
        "sign_regimes matches its controls on the selection rows' echo mass, not the evaluation rows'",
        "circuitgraph/validation/gated_signs.py",
        'mags = {("neuron", l): (eval_stats[l].echo_mass.unsqueeze(0), None, None) for l in layers}',
        'mags = {("neuron", l): (stats[l].echo_mass.unsqueeze(0), None, None) for l in layers}',
        ("tests/test_echo.py",),
    ),
    Mutation(
        "neuronpedia-links-reversed",
        "the Neuronpedia export writes every link from its target to its source",
        "circuitgraph/export/neuronpedia.py",
        '{"source": records[s]["node_id"], "target": records[t]["node_id"], "weight": _finite(w, "edge weight")}',
        '{"source": records[t]["node_id"], "target": records[s]["node_id"], "weight": _finite(w, "edge weight")}',
        ("tests/test_neuronpedia.py",),
    ),
    Mutation(
        "neuronpedia-influence-of-the-pruned-graph",
        "the Neuronpedia export's node influence taken from the pruned graph instead of the full one",
        "circuitgraph/export/neuronpedia.py",
        "influence = cumulative_influence(full_graph if full_graph is not None else graph)",
        "influence = cumulative_influence(graph)",
        ("tests/test_neuronpedia.py",),
    ),
    Mutation(
        "diff-ranked-by-unsigned-influence",
        "the diff's top changes ranked by |influence b - influence a| (unsigned) instead of the signed effect",
        "circuitgraph/queries/diff.py",
        'return _ranked(self.nodes, "effect_difference", ["node"], sort).head(k)',
        'return _ranked(self.nodes, "influence_difference", ["node"], sort).head(k)',
        ("tests/test_diff.py",),
    ),
    Mutation(
        "diff-sign-flip-inverted",
        "the diff flags values of the same sign as sign flips",
        "circuitgraph/queries/diff.py",
        "return (np.sign(a) * np.sign(b)) < 0",
        "return (np.sign(a) * np.sign(b)) > 0",
        ("tests/test_diff.py",),
    ),
    Mutation(
        "dashboards-gqa-heads-tiled",
        "a grouped-query head's values taken from the wrong key-value head (repeat for repeat_interleave) "
        "in the heads' output norm",
        "circuitgraph/features/units.py",
        "v = v.repeat_interleave(n_heads // v.shape[1], dim=1)",
        "v = v.repeat(1, n_heads // v.shape[1], 1)",
        ("tests/test_unit_dashboards.py::test_head_top_k_equals_an_independent_top_k",),
    ),
    Mutation(
        "dashboards-ties-to-the-later-row",
        "the top-k order breaks an exact tie towards the later row",
        "circuitgraph/features/topk.py",
        "order = np.lexsort((self.key, self.pos, self.row, -self.act.astype(np.float64), self.g))",
        "order = np.lexsort((self.key, self.pos, -self.row, -self.act.astype(np.float64), self.g))",
        ("tests/test_unit_dashboards.py::test_neuron_top_k_equals_an_independent_top_k",),
    ),
    Mutation(
        "gguf-dequantised-to-bfloat16",
        "a GGUF checkpoint dequantised to bfloat16 instead of float32 (the weights rounded again: the model is "
        "not the file's)",
        "circuitgraph/adapters/gguf.py",
        "model = AutoModelForCausalLM.from_pretrained(folder, **where, dtype=torch.float32)",
        "model = AutoModelForCausalLM.from_pretrained(folder, **where, dtype=torch.bfloat16)",
        ("tests/test_gguf.py",),
    ),
    Mutation(
        "component-head-destination-sigma",
        "a head's value-input reader divided by ln1's sigma at the head's destination instead of at the source "
        "position it reads (graph.component_inputs)",
        "circuitgraph/attribution/component_inputs.py",
        "dirs.append(A[h, t, s] * read[t, h] / sigma[s])",
        "dirs.append(A[h, t, s] * read[t, h] / sigma[t])",
        ("tests/test_component_inputs.py",),
    ),
    Mutation(
        "head-inputs-softmax-uncentred",
        "the linearised query/key edges use dT/da_s = A_s e_s instead of A_s (e_s - T) (the softmax's "
        "normalisation forgotten; graph.head_inputs)",
        "circuitgraph/attribution/component_inputs.py",
        "g = a_h * (e[:, h, :] - total) * slope",
        "g = a_h * e[:, h, :] * slope",
        ("tests/test_component_inputs.py::test_query_and_key_edges_are_the_first_order_removal_effect",),
    ),
    Mutation(
        "head-inputs-softcap-slope-dropped",
        "the linearised query/key edges ignore the attention soft-cap's slope 1 - tanh^2 (graph.head_inputs)",
        "circuitgraph/attribution/component_inputs.py",
        "slope = torch.ones_like(score) if not cap else 1.0 - torch.tanh(score / cap) ** 2",
        "slope = torch.ones_like(score)",
        ("tests/test_component_inputs.py::test_query_and_key_edges_are_the_first_order_removal_effect",),
    ),
    Mutation(
        "component-total-effect-mlp-slopes-dropped",
        "the total-effect gradient crosses every MLP without its neurons' frozen slopes (a self-consistent "
        "mistake: the total-effect identity still holds; path patching by hooks catches it)",
        "circuitgraph/attribution/component_inputs.py",
        "        u = (self.output_gradient(G) @ self.W_out.T) * self.r[: G.shape[0]]  # (T, d_mlp)\n",
        "        u = self.output_gradient(G) @ self.W_out.T  # (T, d_mlp)\n",
        ("tests/test_component_inputs.py::test_edges_into_components_are_path_patching",),
    ),
    Mutation(
        "memory-plan-ignores-later-stages",
        "the memory plan counts the sweep alone: queries on the full graph (top_paths: 5x the sweep's "
        "bytes an edge) and the exports are left out of the estimate and the advice",
        "circuitgraph/attribution/plan.py",
        '    stages = getattr(options, "stages", None)\n',
        "    stages = None\n",
        ("tests/test_memory_budget.py",),
    ),
    Mutation(
        "neuron-advice-without-margin-or-candidates",
        "the max_neuron_nodes advice ignores what the candidates cost and plans against twice the "
        "memory the run may use (the advice, followed, no longer fits)",
        "circuitgraph/attribution/plan.py",
        "    room = int(plan.limit * (1 - ADVICE_MARGIN)) - fixed\n",
        "    room = int(plan.limit * 2) - fixed\n",
        ("tests/test_memory_budget.py::test_max_neuron_nodes_advice_fits_when_followed",),
    ),
    Mutation(
        "explorer-status-counts-hidden-remainders",
        "the explorer's status line counts the view's nodes, hidden remainder nodes included, as shown",
        "circuitgraph/serve/static/explorer.js",
        "  setStatus(`${drawn.nodes.length} of",
        "  setStatus(`${view.nodes.length} of",
        ("tests/test_serve_browser.py::test_the_status_line_counts_what_is_drawn",),
    ),
    Mutation(
        "explorer-export-offers-a-fixed-list",
        "the explorer's download refuses an export kind registered after the first three (the offered "
        "formats as a fixed list, not the registry's kinds with explorer set)",
        "circuitgraph/serve/api.py",
        "        offered = [k.key for k in explorer_kinds()]\n",
        "        offered = [k.key for k in explorer_kinds()][:3]\n",
        ("tests/test_serve_registries.py::test_a_kind_registered_with_explorer_is_listed_and_saved",),
    ),
    Mutation(
        "explorer-page-links-a-fixed-list",
        "the page builds its save-pinned links but addresses only the first three kinds (a kind registered "
        "later gets a link that never gets its href)",
        "circuitgraph/serve/static/explorer.js",
        "  for (const download of state.downloads) {\n",
        "  for (const download of state.downloads.slice(0, 3)) {\n",
        ("tests/test_serve_browser_downloads.py",),
    ),
    Mutation(
        "neuron-candidates-planned-at-the-bos",
        "the dry run plans max_neuron_nodes candidates at the BOS position too (the collector makes none there)",
        "circuitgraph/attribution/plan.py",
        '    min_pos = 0 if getattr(options, "bos_nodes", False) else 1\n',
        "    min_pos = 0\n",
        ("tests/test_neuron_selection_families.py",),
    ),
    Mutation(
        "memory-watch-never-interrupts",
        "the memory watch records a run over its limit but never interrupts it",
        "circuitgraph/pipeline/memory_watch.py",
        "                _thread.interrupt_main()",
        "                pass",
        ("tests/test_memory_budget.py",),
    ),
    # ---- loaders, conversions, the native forward, datasets, interventions, steering, dashboards, graph files
    Mutation(
        "model-loader-accepts-missing-weights",
        "a model folder whose model.safetensors lacks a weight loads anyway (the parameter keeps its "
        "never-initialised storage) instead of being refused",
        "circuitgraph/adapters/loading.py",
        "    missing = [k for k in result.missing_keys if k not in buffers]\n",
        "    missing = [k for k in result.missing_keys if k not in buffers and k not in params]\n",
        ("tests/test_broken_bundles.py::test_broken_bundle",),
    ),
    Mutation(
        "dictionary-hook-table-normalized-as-raw",
        "the one table of dictionary input hooks reads ln2.hook_normalized as the raw residual stream "
        "(every format's features then read the un-normalised input: wrong activations and edges)",
        "circuitgraph/dictionaries/clt.py",
        '    "ln2.hook_normalized": "normalized",\n',
        '    "ln2.hook_normalized": "raw",\n',
        ("tests/test_dictionary_formats.py",),
    ),
    Mutation(
        "saelens-native-encoder-without-b-enc",
        "the native sae-lens reader's encoder drops b_enc (the dictionary loads, its activations are wrong)",
        "circuitgraph/dictionaries/saelens_native.py",
        "        hidden_pre = x.to(self.dtype) @ self.W_enc + self.b_enc\n",
        "        hidden_pre = x.to(self.dtype) @ self.W_enc\n",
        ("tests/test_sae_lens_native.py::test_native_equals_sae_lens",),
    ),
    Mutation(
        "hf-llama-rotary-adjacent-pairs",
        "the Hugging Face Llama conversion rotates adjacent dimension pairs (GPT-J style) instead of the "
        "two halves of each head",
        "circuitgraph/adapters/hf_config.py",
        '"positional_embedding_type": "rotary", "rotary_adjacent_pairs": False,\n        "rotary_dim": d_head,',
        '"positional_embedding_type": "rotary", "rotary_adjacent_pairs": True,\n        "rotary_dim": d_head,',
        ("tests/test_model_families.py::test_folder_loads_through_the_spec_and_matches_transformers[llama]",),
    ),
    Mutation(
        "native-norm-without-eps",
        "the native forward's norm scale sqrt(mean(x^2)) without eps (TransformerLens adds it)",
        "circuitgraph/adapters/native_transformer.py",
        "scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())",
        "scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True)).sqrt())",
        ("tests/test_native_transformer.py::test_logits_and_every_hook_equal_in_float64",),
    ),
    Mutation(
        "dataset-edges-reversed",
        "a dataset run's reduction keys each edge (target, source) instead of (source, target)",
        "circuitgraph/datasets/reduce.py",
        "edge_keys_raw = np.concatenate([keys[src[nz]], keys[tgt[nz]]], axis=1)",
        "edge_keys_raw = np.concatenate([keys[tgt[nz]], keys[src[nz]]], axis=1)",
        ("tests/test_datasets.py::test_aggregate_equals_independent_aggregation_of_the_graphs",),
    ),
    Mutation(
        "intervention-next-index",
        "an intervention on unit index i edits index i + 1 (a neuron, head or feature off by one)",
        "circuitgraph/validation/interventions.py",
        "    ns = torch.arange(width) if unit.index is None else torch.tensor([unit.index])\n",
        "    ns = torch.arange(width) if unit.index is None else torch.tensor([unit.index + 1])\n",
        ("tests/test_validation.py::test_interventions_equal_raw_hooks",),
    ),
    Mutation(
        "steer-all-skips-the-first-new-token",
        "steering with positions: all leaves the first generated token unsteered",
        "circuitgraph/validation/steering.py",
        "        ps = [own, *range(n_prompt, n_max)]\n",
        "        ps = [own, *range(n_prompt + 1, n_max)]\n",
        ("tests/test_steering.py::test_feature_interventions_equal_an_independent_computation"
         "[transcoders-set-all-live-attention]",),
    ),
    Mutation(
        "topk-ties-to-the-last-row",
        "dashboards' top-k breaks equal activations by the latest row instead of the earliest",
        "circuitgraph/features/topk.py",
        "order = np.lexsort((self.key, self.pos, self.row, -self.act.astype(np.float64), self.g))",
        "order = np.lexsort((self.key, self.pos, -self.row, -self.act.astype(np.float64), self.g))",
        ("tests/test_features.py::test_merge_is_independent_of_the_split",),
    ),
    Mutation(
        "binary-graph-reads-edges-reversed",
        "a binary (.npz) graph file read back with each edge's source and target swapped",
        "circuitgraph/export/binary.py",
        'src, tgt, w = archive["edge_source"], archive["edge_target"], archive["edge_weight"]',
        'src, tgt, w = archive["edge_target"], archive["edge_source"], archive["edge_weight"]',
        ("tests/test_export.py::test_binary_round_trip_is_lossless",),
    ),
    Mutation(
        "json-graph-reads-constant-as-pre-activation",
        "a JSON graph file read back with each reader's constant and pre-activation swapped",
        "circuitgraph/export/json_graph.py",
        "r.activation, r.pre_activation, r.constant,",
        "r.activation, r.constant, r.pre_activation,",
        ("tests/test_export.py::test_json_round_trip_is_lossless",),
    ),
    Mutation(
        "tiers-ignore-helpers",
        "the test tiers look at the test's own code only: a test that skips through a helper of tests/ "
        "(circuit-tracer, Chromium) lands in the fast tier",
        "tests/helpers/markers.py",
        "                    todo.append(target)\n",
        "                    pass\n",
        ("tests/test_tiers.py",),
    ),
    Mutation(
        "gradient-linearised-gate-live",
        "the frozen linear model's gradient lets the SwiGLU gates respond (the graph freezes them)",
        "circuitgraph/validation/gradient_effects.py",
        "hooks.append((a.hook_mlp_pre(layer), lambda value, hook: value.detach()))",
        "hooks.append((a.hook_mlp_pre(layer), lambda value, hook: value))",
        ("tests/test_gradient_effects.py",),
    ),
    Mutation(
        "gradient-read-at-the-previous-position",
        "a unit's gradient x activation pairs its activation with the gradient one position earlier",
        "circuitgraph/validation/gradient_effects.py",
        "v, g = value.detach()[0, u.position].double(), grad[0, u.position].double()",
        "v, g = value.detach()[0, u.position].double(), grad[0, u.position - 1].double()",
        ("tests/test_gradient_effects.py",),
    ),
    Mutation(
        "predicted-gradient-sign-flipped",
        "predicted_vs_actual reports +(1 - c) a.dM/da (the effect of doubling, not removing)",
        "circuitgraph/validation/ablation.py",
        "pred_grad = float(-(1 - c) * grad)",
        "pred_grad = float((1 - c) * grad)",
        ("tests/test_gradient_effects.py",),
    ),
    Mutation(
        "spec-item-default-when-required",
        "a query or check item's parameter block defaults to its model when the model has a required field "
        "(and is required when every field has a default)",
        "circuitgraph/spec/base.py",
        "takes_defaults = not any(field.is_required() for field in params.model_fields.values())",
        "takes_defaults = any(field.is_required() for field in params.model_fields.values())",
        ("tests/test_spec_items.py",),
    ),
    Mutation(
        "graph-file-drops-foreign-node-attrs",
        "reading a graph file keeps only the node attributes circuitgraph writes (NODE_ATTRS), dropping "
        "those of the tool that wrote it",
        "circuitgraph/graph/nodes.py",
        "return cast(NodeAttrs, dict(data or {}))",
        "return cast(NodeAttrs, {k: v for k, v in (data or {}).items() if k in NODE_ATTRS})",
        ("tests/test_node_attrs.py",),
    ),
    Mutation(
        "remainder-count-a-numpy-int",
        "a folded remainder's n_features / n_neurons is a numpy integer, not the int NodeAttrs declares",
        "circuitgraph/attribution/feature_selection.py",
        "        attrs[count_attr] = count\n",
        "        attrs[count_attr] = np.int64(count)  # type: ignore[typeddict-item]\n",
        ("tests/test_node_attrs.py",),
    ),
    Mutation(
        "linearised-total-and-constant-swapped",
        "a head's linearised query/key total is stored under the constant's attribute and the reverse",
        "circuitgraph/attribution/build.py",
        "total_key, constant_key = LINEARISED_ATTRS[kind]",
        "constant_key, total_key = LINEARISED_ATTRS[kind]",
        ("tests/test_component_inputs.py",),
    ),
    Mutation(
        "model-source-key-without-a-record",
        "spec/model.py names a model source (hub) that has no record in adapters/model_sources.py",
        "circuitgraph/spec/model.py",
        'ModelSource = Literal["path", "name", "builtin", "pretrained"]',
        'ModelSource = Literal["path", "name", "builtin", "pretrained", "hub"]',
        ("tests/test_source_records.py",),
    ),
    Mutation(
        "allowed-model-mismatch-not-recorded",
        "a dictionary folder loaded with the format's own source record drops the model mismatch the spec allowed",
        "circuitgraph/dictionaries/formats.py",
        "    if source is None and model_mismatch is None:\n        return loaded",
        "    if source is None:\n        return loaded",
        ("tests/test_source_records.py",),
    ),
    Mutation(
        "metadata-key-written-by-hand",
        "the engine writes the graph's dtype by hand under a key graph/metadata.py does not declare",
        "circuitgraph/attribution/build.py",
        'graph.metadata.set_dtype(str(options.dtype).replace("torch.", ""))',
        'graph.metadata["graph_dtype"] = str(options.dtype).replace("torch.", "")',
        ("tests/test_graph_model.py",),
    ),
    Mutation(
        "native-rotary-size-ignores-rotary-dim",
        "the native forward rotates every dimension of a head, not rotary_dim of them",
        "circuitgraph/adapters/native_transformer.py",
        "return self.d_head if self.rotary_dim is None else self.rotary_dim",
        "return self.d_head",
        ("tests/test_native_transformer.py",),
    ),
    Mutation(
        "ablate-eval-rows-sum-drops-a-row",
        "ablate's metric over the evaluation rows leaves the first row out of the sum (still divided by all)",
        "circuitgraph/validation/ablation.py",
        "metric_runs = sum(runs, torch.zeros_like(runs[0])) / len(rows_eval)",
        "metric_runs = sum(runs[1:], torch.zeros_like(runs[0])) / len(rows_eval)",
        ("tests/test_ablate_eval_rows.py",),
    ),
]


def apply(root: Path, m: Mutation) -> None:
    """Replace ``m.find`` (which must occur exactly once) in the copy under ``root``."""
    path = root / m.path
    text = path.read_text()
    n = text.count(m.find)
    if n != 1:
        raise SystemExit(f"mutation {m.name}: the text to replace occurs {n} times in {m.path} (expected once); "
                         "update scripts/mutation_check.py to the current code")
    path.write_text(text.replace(m.find, m.replace))


def tree_files() -> list[str]:
    """The working tree as git sees it: tracked files and untracked ones that are not ignored
    (deleted files left out); every file when the repository is not a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".venv-ct", "__pycache__", ".pytest_cache"}
        return [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(REPO).parts)]
    return sorted({f for f in out.split("\0") if f and (REPO / f).is_file()})


def copy_tree(dest: Path, files: list[str]) -> None:
    """Copy the working tree's ``files`` (relative paths) under ``dest``."""
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)


def run_tests(root: Path, tests: list[str], timeout: float) -> tuple[int, str, float]:
    """(pytest's exit code, first failing test or what went wrong, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_WAIT_POLICY": "PASSIVE"}
    ct = REPO / ".venv-ct" / "bin" / "python"
    if ct.exists() and "CIRCUITGRAPH_CT_PYTHON" not in env:
        env["CIRCUITGRAPH_CT_PYTHON"] = str(ct)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    seconds = time.perf_counter() - t0
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.M)
    if proc.returncode not in (0, 1):  # not a test failure: collection error, usage error, crash
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        failed = [f"pytest exit {proc.returncode}: {' | '.join(tail)}"]
    return proc.returncode, (failed[0] if failed else ""), seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    ap.add_argument("--tests", nargs="+", help="pytest arguments for every mutation (default: each mutation's own)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    args = ap.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:34s} {m.path}: {m.what} [{' '.join(m.tests)}]")
        return 0
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"unknown mutation(s) {sorted(unknown)}; see --list", file=sys.stderr)
        return 2
    def tests_of(m: Mutation) -> list[str]:
        return list(args.tests or m.tests)

    files = tree_files()
    with tempfile.TemporaryDirectory(prefix="circuitgraph-mutation-") as tmp:
        base = Path(tmp) / "base"
        copy_tree(base, files)
        for m in chosen:  # fail early, before any test run, if a mutation no longer applies
            apply_root = Path(tmp) / "probe"
            (apply_root / m.path).parent.mkdir(parents=True)
            shutil.copy(base / m.path, apply_root / m.path)
            apply(apply_root, m)
            shutil.rmtree(apply_root)
        union = list(dict.fromkeys(t for m in chosen for t in tests_of(m)))
        code, first, seconds = run_tests(base, union, args.timeout)
        print(f"{'unmutated':34s} {'passes' if code == 0 else 'FAILS: ' + first} ({seconds:.0f} s)", flush=True)
        if code != 0:
            return 1
        missed, broken = [], []
        for m in chosen:
            root = Path(tmp) / m.name
            copy_tree(root, files)
            apply(root, m)
            code, first, seconds = run_tests(root, tests_of(m), args.timeout)
            status = {0: "NOT CAUGHT", 1: f"caught by {first}"}.get(code, f"ERROR (not a test failure): {first}")
            print(f"{m.name:34s} {status} ({seconds:.0f} s)", flush=True)
            (missed if code == 0 else broken if code != 1 else []).append(m.name)
            shutil.rmtree(root)
    caught = len(chosen) - len(missed) - len(broken)
    print(f"{caught} of {len(chosen)} mutations caught" + (f"; missed: {missed}" if missed else "")
          + (f"; errors: {broken}" if broken else ""))
    return 1 if missed or broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
