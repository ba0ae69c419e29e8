"""Write docs/benchmarks/results.md and the plots from the results of ``run_benchmarks.py``.

``write_report(results, out_dir)`` is called at the end of a benchmark run; run
``python benchmarks/run_benchmarks.py --report-only [--quick]`` to redraw from ``results.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_report"]

STAGES = ("attribute", "scores", "prune", "export_json", "export_npz")
SUITE_TITLES = {
    "prompt_length": "Prompt length",
    "active_features": "Active features",
    "gpt2_small": "GPT-2-small-sized random model",
    "precision": "Precision (model weights; edges accumulated in float32, float64 for float64)",
    "long_prompt_6l": "Long prompts, 6-layer model (max_feature_nodes fixed)",
    "long_prompt_gpt2": "Long prompts, GPT-2-small-sized model (max_feature_nodes fixed)",
    "gpu": "On the GPU (model: {device: cuda}; stage times wait for the device)",
}


def _gb(mb: float | None) -> str:
    return "-" if mb is None else f"{mb / 1024:.2f}"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _e(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _ok(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if "result" in r]


def _graph_kind(r: dict[str, Any]) -> str:
    res = r["result"]
    if res["max_feature_nodes"] is None:
        return "full"
    return f"max_feature_nodes {res['max_feature_nodes']} ({r['plan']['reason']})"


def _run_table(runs: list[dict[str, Any]]) -> list[str]:
    head = ("| run | tokens | active features (per token per layer) | graph | nodes | edges | attribute s | "
            "scores s | prune s | JSON s | npz s | process s | process CPU s | peak RSS GB | load avg (mean/max) | "
            "completeness (max rel. violation) | pruned nodes / edges |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        if "result" not in r:
            p = r["process"]
            why = (", stopped at the memory budget" if p.get("killed_for_memory") else "") + (
                ", stopped at the time limit" if p.get("killed_for_time") else "")
            last = [ln for ln in (p.get("log_tail") or "").splitlines() if ln.strip()]
            if last and not why:  # the error the run stopped with
                why = ": " + last[-1].strip().replace("|", "/")[:400]
            if r.get("note"):
                why += f" ({r['note']})"
            lines.append(f"| {r['name']} | | | FAILED (exit {p['returncode']}{why}) | | | | | | | | "
                         f"{_s(p['wall_s'])} | "
                         f"{_s(p['user_s'] + p['sys_s'])} | {_gb(p['peak_rss_mb'])} | | | |")
            continue
        res, p = r["result"], r["process"]
        t = res["timings_s"]
        load = p["load_avg_1min"]
        lines.append(
            f"| {r['name']} | {res['n_pos']} | {res['n_active_features']:,} ({res['active_per_token_per_layer']:.1f}) "
            f"| {_graph_kind(r)} | {res['n_nodes']:,} | {res['n_edges']:,} | {_s(t.get('attribute'))} | "
            f"{_s(t.get('scores'))} | {_s(t.get('prune'))} | {_s(t.get('export_json'))} | {_s(t.get('export_npz'))} | "
            f"{_s(p['wall_s'])} | {_s(p['user_s'] + p['sys_s'])} | {_gb(p['peak_rss_mb'])} | "
            f"{load['mean']:.1f} / {load['max']:.1f} | "
            f"{_e(res['completeness']['max_relative_violation'])} | "
            f"{res['pruned']['n_nodes']:,} / {res['pruned']['n_edges']:,} |")
    return lines


def _scaling_table(runs: list[dict[str, Any]]) -> list[str]:
    """Long prompts at a fixed feature budget: graph construction time and peak memory per
    (position x active feature), relative to the shortest prompt (1.0 = linear growth)."""
    ok = sorted(_ok(runs), key=lambda r: r["result"]["n_pos"])
    if not ok:
        return []
    lines = ["Cost against positions x active features (fixed `max_feature_nodes`; relative to the shortest "
             "prompt, so 1.0 is linear growth and less is slower than linear):", "",
             "| tokens | positions x active features | attribute s | attribute s per 1e9 (pos x active) | relative | "
             "peak RSS GB | largest completeness violation |", "|---|---|---|---|---|---|---|"]
    first = None
    for r in ok:
        res = r["result"]
        work = res["n_pos"] * res["n_active_features"]
        per = res["timings_s"]["attribute"] / work * 1e9
        first = per if first is None else first
        lines.append(f"| {res['n_pos']} | {work:.3g} | {_s(res['timings_s']['attribute'])} | {per:.1f} | "
                     f"{per / first:.2f} | {_gb(r['process']['peak_rss_mb'])} | "
                     f"{_e(res['completeness']['max_relative_violation'])} |")
    return lines


def _precision_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["| model weights | edge accumulation | completeness: max relative violation | max absolute violation | "
             "readers checked | attribute s | peak RSS GB |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        if "result" not in r:
            lines.append(f"| {r['name']} | FAILED | | | | | |")
            continue
        res = r["result"]
        c = res["completeness"]
        lines.append(f"| {res['model_dtype']} | {res['graph_dtype']} | {_e(c['max_relative_violation'])} | "
                     f"{_e(c.get('max_abs_violation'))} | {c.get('n_readers', '-')} | "
                     f"{_s(res['timings_s']['attribute'])} | {_gb(r['process']['peak_rss_mb'])} |")
    return lines


def _ticks(ax: Any, xs: list[float]) -> None:
    """Tick labels at the measured x values (1.5k, 16, ...) instead of log-scale powers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(sorted(set(xs))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:.1f}k" if v >= 2000 else f"{v:g}"))


def _plot(results: dict[str, Any], out: Path) -> list[str]:
    """Time per stage and peak memory against prompt length and against active features."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    runs = _ok(results["runs"])
    series = [("prompt_length", "n_pos", "prompt length (tokens)", "time_memory_vs_prompt_length.png"),
              ("active_features", "n_active_features", "active features (before any selection)",
               "time_memory_vs_active_features.png"),
              ("long_prompt_6l", "n_pos", "prompt length (tokens)", "long_prompts_6l.png"),
              ("long_prompt_gpt2", "n_pos", "prompt length (tokens)", "long_prompts_gpt2.png")]
    for suite, key, xlabel, fname in series:
        rs = sorted([r for r in runs if r["suite"] == suite], key=lambda r: r["result"][key])
        if not rs:
            continue
        full = [r for r in rs if r["result"]["max_feature_nodes"] is None]
        capped = [r for r in rs if r["result"]["max_feature_nodes"] is not None]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.4))
        xs = [r["result"][key] for r in rs]
        for i, stage in enumerate((*STAGES, "whole process")):
            color = "k" if stage == "whole process" else f"C{i}"
            for group, style, marker in ((full, "-", "o"), (capped, "--", "^")):
                if not group:
                    continue
                y = [r["process"]["wall_s"] if stage == "whole process" else r["result"]["timings_s"].get(stage)
                     for r in group]
                ax1.plot([r["result"][key] for r in group], [v if v else float("nan") for v in y], ls=style,
                         marker=marker, color=color, label=stage if group is full or not full else None)
        for group, style, marker, label in ((full, "-", "o", "full graph"), (capped, "--", "^", "max_feature_nodes")):
            if group:
                ax2.plot([r["result"][key] for r in group], [r["process"]["peak_rss_mb"] / 1024 for r in group],
                         ls=style, marker=marker, color="C3", label=label)
        for r in capped:
            ax2.annotate(str(r["result"]["max_feature_nodes"]),
                         (r["result"][key], r["process"]["peak_rss_mb"] / 1024), textcoords="offset points",
                         xytext=(4, -12), fontsize=7)
        if suite == "active_features":
            pl = sorted([r for r in runs if r["suite"] == "prompt_length" and r["result"]["max_feature_nodes"] is None],
                        key=lambda r: r["result"][key])
            if pl:
                ax2.plot([r["result"][key] for r in pl], [r["process"]["peak_rss_mb"] / 1024 for r in pl],
                         marker="x", ls=":", color="0.5", label="prompt-length runs (full graph)")
        for ax in (ax1, ax2):
            ax.set_xscale("log")
            _ticks(ax, xs)
            ax.set_xlabel(xlabel)
            ax.grid(True, which="major", alpha=0.3)
        ax1.set_yscale("log")
        ax1.set_ylabel("seconds")
        ax1.legend(fontsize=7, title="solid: full graph; dashed: max_feature_nodes" if capped and full else None,
                   title_fontsize=7)
        ax1.set_title("time per stage (one process per run)", fontsize=10)
        ax2.set_ylabel("peak RSS (GB)")
        ax2.set_ylim(bottom=0)
        ax2.legend(fontsize=7)
        ax2.set_title("peak memory of the run's process", fontsize=10)
        b = rs[0]["bundle_config"]
        what = (f"{b['n_layers']} layers, d_model {b['d_model']}, {b['d_sae']}-feature transcoders"
                + (", 32 tokens, 0.25%-3% active" if suite == "active_features" else ""))
        fig.suptitle(f"circuitgraph: {what} ({results['machine'].get('cpu_count')} CPU cores, no GPU; "
                     f"load average {results['load_avg_at_start'][0]:.1f} at the start)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)
    return made


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.1f}x"


def _side_by_side(s: dict[str, Any]) -> list[str]:
    lines = [f"Bundle `{s['bundle']}`, {s['n_pos']} tokens; both from the same files and prompt, "
             "node threshold 0.8, edge threshold 0.98, float32, CPU. circuit-tracer: "
             "`benchmarks/circuit_tracer/ct_pipeline.py` (load, `attribute`, `create_graph_files`, which runs "
             "`prune_graph` itself; batch size 512); circuitgraph: `circuitgraph run spec.json` with `prune` and "
             "`export: {json}`, run once before and once after circuit-tracer. End to end = from starting the "
             "process to the pruned graph JSON on disk. `attribute` = graph construction alone "
             "(circuitgraph's from `benchmarks/bench_one.py`, run right after its first end-to-end run).", ""]
    cli_runs = [c for c in s.get("circuitgraph_cli_runs") or [] if c.get("returncode") == 0]
    stages = (s.get("circuitgraph_stages") or {}).get("result") or {}
    ct = s.get("circuit_tracer") or {}
    if "skipped" in ct:
        return lines + [f"circuit-tracer not run: {ct['skipped']}"]
    pipe = ct.get("pipeline") or {}
    ct_t = pipe.get("timings_s", {})
    cg_t = stages.get("timings_s", {})
    ct_e2e = pipe.get("end_to_end_s")
    cg_e2e = sum(c["wall_s"] for c in cli_runs) / len(cli_runs) if cli_runs else None
    cg_each = ", ".join(f"{c['wall_s']:.1f} s at load {c['load_avg_1min']['mean']:.1f}" for c in cli_runs)
    ct_attr, cg_attr = ct_t.get("attribute"), cg_t.get("attribute")
    ct_peak = (pipe.get("peak_rss_mb") or {}).get("create_graph_files")
    cg_peak = max((c["peak_rss_mb"] for c in cli_runs), default=None)
    ct_load = (ct.get("load_avg_1min") or {}).get("mean")
    stage_load = ((s.get("circuitgraph_stages") or {}).get("process") or {}).get("load_avg_1min", {}).get("mean")
    ct_prune = ct_t.get("create_graph_files")
    cg_prune = None if not cg_t else cg_t.get("scores", 0) + cg_t.get("prune", 0) + cg_t.get("export_json", 0)
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    lines += [
        "| | circuit-tracer 0.5.0 | circuitgraph | ratio (circuit-tracer / circuitgraph) | target |",
        "|---|---|---|---|---|",
        f"| end to end, whole process: spec -> pruned graph JSON on disk (s) | {_s(ct_e2e)} | {_s(cg_e2e)} "
        f"(mean of {cg_each}) | {_ratio(ct_e2e, cg_e2e)} | >= 10x: "
        f"{met(ct_e2e and cg_e2e and ct_e2e / cg_e2e >= 10)} |",
        f"| graph construction alone: `attribute` (s) | {_s(ct_attr)} | {_s(cg_attr)} | {_ratio(ct_attr, cg_attr)} "
        f"| >= 10x: {met(ct_attr and cg_attr and ct_attr / cg_attr >= 10)} |",
        f"| process start to model + transcoders loaded (s) | {_s(_sum(ct_t, 'import', 'load'))} | "
        f"{_s(_sum(cg_t, 'import', 'load'))} | | |",
        f"| prune + JSON (s): ct `create_graph_files`; circuitgraph scores + prune + JSON | {_s(ct_prune)} | "
        f"{_s(cg_prune)} | {_ratio(ct_prune, cg_prune)} | |",
        f"| peak RSS, end-to-end process (GB) | {_gb(ct_peak)} | {_gb(cg_peak)} | {_ratio(ct_peak, cg_peak)} | "
        f"not higher: {met(ct_peak and cg_peak and cg_peak <= ct_peak)} |",
        f"| peak RSS after `attribute` (GB) | {_gb((pipe.get('peak_rss_mb') or {}).get('attribute'))} | "
        f"{_gb((stages.get('peak_rss_mb') or {}).get('attribute'))} | | |",
        f"| load average (1 min, mean over the process) | {_l(ct_load)} | {_l(stage_load)} (stages run) | | |",
        f"| pruned JSON size (MB) | {_mb(pipe.get('json_bytes'))} | "
        f"{_mb(cli_runs[0].get('json_bytes') if cli_runs else None)} "
        "| | |",
    ]
    if cli_runs and cli_runs[0].get("stage_times_s"):
        lines += ["", "`circuitgraph run` reported: " + "; ".join(
            ", ".join(f"{k} {c['stage_times_s'][k]:.1f} s" for k in ("graph", "prune", "export")
                      if k in c["stage_times_s"])
            for c in cli_runs)
            + " (its `graph` includes loading; `prune` includes the replacement/completeness scores)."]
    c = s.get("comparison") or {}
    if c and "error" not in c:
        p = c["pruning"]
        rel = c["max_difference_relative_to_largest_edge"]
        lines += [
            "", "| agreement | value | target |", "|---|---|---|",
            f"| same logit targets | {c['targets_equal']} | |",
            f"| nodes (circuit-tracer / circuitgraph) | {c['n_nodes_ct']:,} / {c['n_nodes_circuitgraph']:,} | |",
            f"| non-zero edges (circuit-tracer / circuitgraph) | {c['nonzero_ct']:,} / "
            f"{c['n_edges_circuitgraph']:,} | |",
            f"| largest edge | {c['largest_edge']:.4g} | |",
            f"| largest edge difference (every entry of the adjacency) | {c['max_abs_difference']:.3g} "
            f"({rel:.2e} of the largest edge) | <= 1e-5 of the largest edge: {met(rel <= 1e-5)} |",
            f"| kept nodes after pruning (circuit-tracer / circuitgraph) | {p['n_nodes_kept_ct']:,} / "
            f"{p['n_nodes_kept_circuitgraph']:,}, equal: {p['kept_nodes_equal']} | "
            f"equal: {met(p['kept_nodes_equal'])} |",
            f"| kept edges after pruning (circuit-tracer / circuitgraph) | {p['n_edges_kept_ct']:,} / "
            f"{p['n_edges_kept_circuitgraph']:,}, equal: {p['kept_edges_equal']} (only circuit-tracer "
            f"{p['n_edges_only_ct']}, only circuitgraph {p['n_edges_only_circuitgraph']}) | equal: "
            f"{met(p['kept_edges_equal'])} |",
        ]
        cut = p.get("edge_cut")
        if cut and cut.get("rank") is not None:
            before = cut["cumulative_share_before_cut_minus_threshold"]
            lines.append(
                f"| edge cut (circuitgraph, float64): rank, one edge's share, cumulative share - 0.98 at the cut / "
                f"one rank before | {cut['rank']:,} of {cut['n_scores']:,}, {cut['share_of_one_score_at_cut']:.2e}, "
                f"{cut['cumulative_share_at_cut_minus_threshold']:+.2e} / "
                f"{'-' if before is None else f'{before:+.2e}'} | |")
            if not p["kept_edges_equal"] and "kept_edges_verdict" in p:
                lines.append(f"| kept edges: verdict | {p['kept_edges_verdict']} (circuit-tracer cuts in float32, where "
                             "one step of a cumulative share near 1 is 6e-8) | |")
    elif c:
        lines += ["", f"comparison failed: {c['error'][-500:]}"]
    return lines


def _sum(d: dict[str, float], *keys: str) -> float | None:
    return sum(d[k] for k in keys) if all(k in d for k in keys) else None


def _l(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _mb(b: int | None) -> str:
    return "-" if not b else f"{b / 1e6:.1f}"


def _code_line(results: dict[str, Any]) -> str:
    start, end = results.get("code_at_start") or {}, results.get("code_at_end") or {}
    if not start:
        return ""
    dirty = start.get("uncommitted_package_files") or []
    line = (f"Code measured: commit `{start['commit']}` ({start['subject']})"
            + (f" plus uncommitted changes to {len(dirty)} package files (diff `{start['package_diff_sha1']}`)"
               if dirty else "") + ".")
    state = lambda d: (d.get("commit"), d.get("package_diff_sha1"))  # noqa: E731
    if end and state(end) != state(start):
        line += (f" The package changed during the run (at the end: commit `{end.get('commit')}`, diff "
                 f"`{end.get('package_diff_sha1')}`): later rows measure later code.")
    policy = results.get("omp_wait_policy")
    if policy:
        shown = policy if "=" in policy else f"OMP_WAIT_POLICY={policy}"  # older records: the policy alone
        line += (f" Every process, circuitgraph's and circuit-tracer's, ran with `{shown}` "
                 "(what `circuitgraph run` sets for itself) and the same number of threads.")
    return line


def write_report(results: dict[str, Any], out: Path) -> None:
    """``results.md`` + plots in ``out`` (``results.json`` is written by the caller)."""
    out = Path(out)
    plots = _plot(results, out)
    m = results["machine"]
    quick = results["mode"] == "quick"
    lines = [
        "# Benchmark results" + (" (--quick)" if quick else ""),
        "",
        f"Generated by `{results['command']}` on {results['started']} " + (f"in {results['total_seconds'] / 60:.1f} min." if "total_seconds" in results
              else "(interrupted before its end: the runs recorded so far)."),
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpu_count']} cores, {m['memory_gb']:.0f} GB RAM, "
        f"{'CUDA available' if m['cuda'] else 'no GPU'}; Python {m['python']}, torch {m['torch']} "
        f"({m['torch_threads']} threads). The machine was shared with other jobs: 1-minute load average "
        f"{results['load_avg_at_start'][0]:.1f} at the start and " + (f"{results['load_avg_at_end'][0]:.1f} at the end; " if results.get("load_avg_at_end") else "- at the end; ")
        + "the mean and max load during each run are in the tables (with load above the core count, "
        "wall times are upper bounds).",
        "",
        _code_line(results),
        "",
        "Every run is a separate process (`benchmarks/bench_one.py`): times are wall-clock seconds per stage, "
        "`process s` is the whole process (interpreter start, imports, loading, every stage), peak RSS is the "
        "process's `ru_maxrss`. Completeness is the largest relative violation over every reader of "
        "`pre_activation = sum(incoming edges) + constant` (`AttributionGraph.check_completeness`). "
        "`graph` says whether the full graph was built or only the rows of the `max_feature_nodes` most "
        "influential features (the other features folded into remainder nodes), and why.",
        "",
    ]
    if (results.get("gpu") or {}).get("skipped"):
        lines += ["## On the GPU", "", f"Not run: {results['gpu']['skipped']}.", ""]
    if results.get("side_by_side"):
        lines += ["## Side by side with circuit-tracer 0.5.0", ""] + _side_by_side(results["side_by_side"]) + [""]
    runs = results["runs"]
    for suite, title in SUITE_TITLES.items():
        rs = [r for r in runs if r["suite"] == suite]
        if not rs:
            continue
        b = rs[0]["bundle_config"]
        lines += [f"## {title}", ""]
        if suite != "precision":
            names = sorted({r["bundle"] for r in rs})
            lines += [f"Bundle{'s' if len(names) > 1 else ''} {', '.join(f'`{n}`' for n in names)}: {b['n_layers']} "
                      f"layers, d_model {b['d_model']}, {b['n_heads']} heads, d_mlp {b['d_mlp']}, "
                      f"d_vocab {b['d_vocab']}, "
                      f"{b['d_sae']}-feature ReLU transcoders"
                      + (" (the same model; transcoders set for different active fractions)" if len(names) > 1 else "")
                      + ".", ""]
            lines += _run_table(rs)
            if suite.startswith("long_prompt"):
                lines += ["", *_scaling_table(rs)]
        else:
            lines += [f"Bundle `{rs[0]['bundle']}`: {b['n_layers']} layers, d_model {b['d_model']}, "
                      f"{b['d_sae']} features, {rs[0].get('result', {}).get('n_pos', '?')} tokens.", ""]
            lines += _precision_table(rs)
        lines.append("")
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    est = [r for r in runs if "result" in r and r["suite"] != "precision"]
    recheck = any("dry_run_recheck" in r.get("plan", {}) for r in est)
    if est:
        lines += ["## Memory estimates", "",
                  "Before each run the suite counts the active features per (layer, position) on its prompt "
                  "(one forward pass in a separate process) and estimates the full graph: every causally allowed "
                  "(reader, writer) pair non-zero (frozen attention mixes every earlier position), "
                  f"{results['peak_bytes_per_edge_assumed']} bytes per edge at the peak, plus the weights and the "
                  "node tables. Above the budget it uses `max_feature_nodes` (the largest of the configured value, "
                  "halved, whose estimate fits); a run that still passes the budget is stopped and retried with "
                  "half as many feature rows. `circuitgraph run --dry-run`'s own estimate (run as a command on the "
                  "same spec: forward pass and node tables measured, edges bounded by what each reader can see, "
                  "`max_feature_nodes` rows only; `circuitgraph.pipeline.estimate`) is shown next to the measured "
                  "peak: it should be an upper bound within a small factor.", "",
                  "| run | est. edges (full graph) | edges built | est. peak GB: full graph / run as done | "
                  "dry-run: est. edges, peak GB, fits | measured peak GB |"
                  + (" dry run re-made (`--recheck-dry-run`): peak GB (x measured), commit |" if recheck else ""),
                  "|---|---|---|---|---|---|" + ("---|" if recheck else "")]
        for r in est:
            pl, res = r["plan"], r["result"]
            dr = pl.get("dry_run") or {}
            done = pl.get("est_mfn_peak_gb") if res["max_feature_nodes"] is not None else pl["est_full_peak_gb"]
            built = f"{res['n_edges']:,}" + (f" (max_feature_nodes {res['max_feature_nodes']}, folded)"
                                             if res["max_feature_nodes"] is not None else "")
            measured = r["process"]["peak_rss_mb"] / 1024
            again = pl.get("dry_run_recheck") or {}
            extra = ""
            if recheck:
                extra = (f" {again['peak_gb']:.2f} ({again['peak_gb'] / measured:.2f}x), {again.get('commit', '')} |"
                         if "peak_gb" in again else f" {again.get('error', '-')} |")
            lines.append(f"| {r['name']} | {pl['est_full_edges']:,.0f} | {built} | {pl['est_full_peak_gb']:.1f} / "
                         f"{'-' if done is None else f'{done:.1f}'} | {dr.get('n_edges_upper', 0):,}, "
                         f"{dr.get('peak_gb', float('nan')):.1f}, {dr.get('verdict') or dr.get('fits')} | "
                         f"{_gb(r['process']['peak_rss_mb'])} |" + extra)
        lines.append("")
    # a benchmark of minutes: the docs test (tests/test_docs_examples.py) does not run it
    lines += ["## Reproduce", "", "```bash no-run",
              "# once: circuit-tracer 0.5.0 in its own venv (for the side by side)",
              "bash scripts/install_circuit_tracer.sh   # creates .venv-ct",
              f"{results['command']}    # add --skip-ct without the venv",
              "# one suite only, or redraw this page from results.json:",
              "python benchmarks/run_benchmarks.py --only side_by_side" + (" --quick" if quick else ""),
              "python benchmarks/run_benchmarks.py --report-only" + (" --quick" if quick else ""),
              "```", "",
              "Bundles, graphs and logs go to `$TMPDIR/circuitgraph-bench` (`--work`); see benchmarks/README.md.", ""]
    if not quick:
        lines += ["Profiles and suggestions: [profiling.md](profiling.md).", ""]
    (out / "results.md").write_text("\n".join(lines))
