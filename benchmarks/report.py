"""Write docs/benchmarks/README.md (every table) and the plots from ``run_benchmarks.py``'s results.json.

``write_report(results, out_dir)`` is called after each suite of a benchmark run; run
``python benchmarks/run_benchmarks.py --report-only`` to redraw from ``results.json``.
``readme_paragraph(results)`` is README.md's speed paragraph made from the same record
(``run_benchmarks.py --readme print|write``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

__all__ = ["write_report", "readme_paragraph", "rewrite_readme", "side_by_side_numbers"]

STAGES = ("attribute", "scores", "prune", "export_json", "export_npz")


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
    head = ("| run | tokens | active features (per token per layer) | graph | nodes | edges | import s | load s | attribute s | "
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
            if (s := r.get("progress_at_stop")):  # what it had done when it was stopped
                why += f" after {s['seconds']:.1f} s: {s['done']} / {s['total']}"
            if r.get("note"):
                why += f" ({r['note']})"
            lines.append(f"| {r['name']} | | | FAILED (exit {p['returncode']}{why}) | | | | | | | | | | "
                         f"{_s(p['wall_s'])} | "
                         f"{_s(p['user_s'] + p['sys_s'])} | {_gb(p['peak_rss_mb'])} | | | |")
            continue
        res, p = r["result"], r["process"]
        t = res["timings_s"]
        load = p["load_avg_1min"]
        lines.append(
            f"| {r['name']} | {res['n_pos']} | {res['n_active_features']:,} ({res['active_per_token_per_layer']:.1f}) "
            f"| {_graph_kind(r)} | {res['n_nodes']:,} | {res['n_edges']:,} | {_s(t.get('import'))} | {_s(t.get('load'))} | "
            f"{_s(t.get('attribute'))} | "
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


def _met(ok: Any) -> str:
    return "met" if ok else "NOT met"


def _sum(d: dict[str, float], *keys: str) -> float | None:
    return sum(d[k] for k in keys) if all(k in d for k in keys) else None


def _l(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _mb(b: int | None) -> str:
    return "-" if not b else f"{b / 1e6:.1f}"


def _env_text(env: dict[str, str] | None) -> str:
    return "no OpenMP/MKL variable" if not env else ", ".join(f"`{k}={v}`" for k, v in env.items())


def _ct_runs(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """circuit-tracer's runs by environment (``default``, ``tuned``), those that completed."""
    ct = s.get("circuit_tracer") or {}
    return {k: v for k, v in ct.items() if isinstance(v, dict) and v.get("pipeline")}


def side_by_side_numbers(s: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of one side by side: end to end and peak of circuitgraph (mean of its
    ``circuitgraph run`` processes) and of circuit-tracer per environment."""
    cli_runs = [c for c in s.get("circuitgraph_cli_runs") or [] if c.get("returncode") == 0]
    out: dict[str, Any] = {
        "cg_e2e": sum(c["wall_s"] for c in cli_runs) / len(cli_runs) if cli_runs else None,
        "cg_peak_mb": max((c["peak_rss_mb"] for c in cli_runs), default=None),
        "cg_attribute": (((s.get("circuitgraph_stages") or {}).get("result") or {}).get("timings_s") or {}).get("attribute"),
        "ct": {}}
    for kind, ct in _ct_runs(s).items():
        pipe = ct["pipeline"]
        out["ct"][kind] = {"e2e": pipe.get("end_to_end_s"), "attribute": pipe["timings_s"].get("attribute"),
                           "peak_mb": ct.get("peak_rss_mb")}
    return out


def _side_by_side(s: dict[str, Any], target: float) -> list[str]:
    mfn = s.get("max_feature_nodes")
    lines = [f"Bundle `{s['bundle']}` ({_bundle_text(s['bundle_config'])}), {s['n_pos']} tokens, "
             + (f"`max_feature_nodes` {mfn} for both (circuit-tracer batch size {s.get('ct_batch_size')}, "
                f"circuitgraph batch size {s.get('batch_size')}: the same ranking rounds)" if mfn else
                f"the full graph (circuit-tracer batch size {s.get('ct_batch_size', 512)})")
             + "; both from the same files and prompt, node threshold 0.8, edge threshold 0.98, float32, CPU. "
             "circuit-tracer: `benchmarks/circuit_tracer/ct_pipeline.py` (load, `attribute`, `create_graph_files`, "
             "which runs `prune_graph` itself); circuitgraph: `circuitgraph run spec.json` with `prune` and "
             "`export: {json}`, run once before and once after circuit-tracer. End to end = from starting the "
             "process to the pruned graph JSON on disk. `attribute` = graph construction alone (circuitgraph's "
             "from `benchmarks/bench_one.py`). Peak = the process's `ru_maxrss`.", ""]
    ct_all = s.get("circuit_tracer") or {}
    if "skipped" in ct_all:
        return lines + [f"circuit-tracer not run: {ct_all['skipped']}", ""]
    cli_runs = [c for c in s.get("circuitgraph_cli_runs") or [] if c.get("returncode") == 0]
    stages = (s.get("circuitgraph_stages") or {}).get("result") or {}
    cg_t = stages.get("timings_s", {})
    num = side_by_side_numbers(s)
    cg_e2e, cg_attr, cg_peak = num["cg_e2e"], num["cg_attribute"], num["cg_peak_mb"]
    cg_each = ", ".join(f"{c['wall_s']:.1f} s at load {c['load_avg_1min']['mean']:.1f}" for c in cli_runs)
    env = s.get("circuitgraph_environment")
    lines.append(f"circuitgraph's environment: {_env_text(env)} given (`circuitgraph run` sets its OpenMP defaults "
                 "inside itself). " + "; ".join(
                     f"circuit-tracer `{k}` environment: {_env_text(v.get('environment'))}, "
                     f"{(v.get('pipeline') or {}).get('threads', '?')} torch threads"
                     for k, v in ct_all.items() if isinstance(v, dict)) + ".")
    lines += ["", "| | " + " | ".join(f"circuit-tracer 0.5.0 ({k} env.)" for k in ct_all) + " | circuitgraph | "
              + " | ".join(f"ratio ({k})" for k in ct_all) + " | target |",
              "|---|" + "---|" * (2 * len(ct_all) + 2)]
    failed = {k: v for k, v in ct_all.items() if not v.get("pipeline")}

    def row(label: str, theirs: list[str], ours: str, ratios: list[str], tgt: str) -> None:
        lines.append(f"| {label} | " + " | ".join(theirs) + f" | {ours} | " + " | ".join(ratios) + f" | {tgt} |")

    kinds = list(ct_all)
    pipe = {k: (ct_all[k].get("pipeline") or {}) for k in kinds}
    t = {k: pipe[k].get("timings_s", {}) for k in kinds}
    e2e = {k: pipe[k].get("end_to_end_s") for k in kinds}
    head = "default" if "default" in kinds else (kinds[0] if kinds else None)
    row("end to end, whole process: spec -> pruned graph JSON on disk (s)",
        [_s(e2e[k]) if k not in failed else f"FAILED (exit {ct_all[k].get('returncode')})" for k in kinds],
        f"{_s(cg_e2e)} (mean of {cg_each})", [_ratio(e2e[k], cg_e2e) for k in kinds],
        f">= {target:g}x with circuit-tracer's default environment: "
        + _met(head == "default" and e2e.get(head) and cg_e2e and e2e[head] / cg_e2e >= target))
    row("graph construction alone: `attribute` (s)", [_s(t[k].get("attribute")) for k in kinds], _s(cg_attr),
        [_ratio(t[k].get("attribute"), cg_attr) for k in kinds], "")
    row("process start to model + transcoders loaded (s)", [_s(_sum(t[k], "import", "load")) for k in kinds],
        _s(_sum(cg_t, "import", "load")), ["" for _ in kinds], "")
    cg_prune = None if not cg_t else cg_t.get("scores", 0) + cg_t.get("prune", 0) + cg_t.get("export_json", 0)
    row("prune + JSON (s): circuit-tracer `create_graph_files`; circuitgraph scores + prune + JSON",
        [_s(t[k].get("create_graph_files")) for k in kinds], _s(cg_prune),
        [_ratio(t[k].get("create_graph_files"), cg_prune) for k in kinds], "")
    peaks = {k: ct_all[k].get("peak_rss_mb") for k in kinds}
    row("peak RSS, end-to-end process (GB)", [_gb(peaks[k]) for k in kinds], _gb(cg_peak),
        [_ratio(peaks[k], cg_peak) for k in kinds],
        "lower: " + _met(head and peaks.get(head) and cg_peak and cg_peak < peaks[head]))
    row("load average (1 min, mean over the process)",
        [_l((ct_all[k].get("load_avg_1min") or {}).get("mean")) for k in kinds],
        ", ".join(_l(c["load_avg_1min"]["mean"]) for c in cli_runs), ["" for _ in kinds], "")
    row("features: active / selected", [f"{pipe[k].get('n_active_features', '-'):,} / "
                                        f"{pipe[k].get('n_selected_features', '-'):,}" if pipe[k] else "-"
                                        for k in kinds],
        f"{stages.get('n_active_features', 0):,} / {(stages.get('nodes_by_kind') or {}).get('feature', 0):,}"
        if stages else "-", ["" for _ in kinds], "")
    row("pruned JSON size (MB)", [_mb(pipe[k].get("json_bytes")) for k in kinds],
        _mb(cli_runs[0].get("json_bytes") if cli_runs else None), ["" for _ in kinds], "")
    for k, v in failed.items():
        last = [ln for ln in (v.get("log_tail") or "").splitlines() if ln.strip()]
        lines += ["", f"circuit-tracer ({k} environment) failed: exit {v.get('returncode')}"
                  + (", stopped at the memory budget" if v.get("killed_for_memory") else "")
                  + (f": `{last[-1][:300]}`" if last else "")]
    if cli_runs and cli_runs[0].get("stage_times_s"):
        lines += ["", "`circuitgraph run` reported: " + "; ".join(
            ", ".join(f"{k} {c['stage_times_s'][k]:.1f} s" for k in ("graph", "prune", "export")
                      if k in c["stage_times_s"])
            for c in cli_runs)
            + " (its `graph` includes loading; `prune` includes the replacement/completeness scores)."]
    if s.get("circuitgraph_stages"):
        lines += ["", "circuitgraph stage by stage (`bench_one.py`, the same configuration, its own process; `import` "
                  "is from the interpreter's start to circuitgraph imported):", "",
                  *_run_table([s["circuitgraph_stages"]])]
    for k in kinds:
        if t[k]:
            lines += ["", f"circuit-tracer ({k} environment) stage by stage: " + ", ".join(
                f"{stage} {t[k][stage]:.1f} s" for stage in ("import", "load", "attribute", "create_graph_files")
                if stage in t[k]) + "."]
    lines += ["", *_agreement(s.get("comparison") or {})]
    return lines


def _agreement(c: dict[str, Any]) -> list[str]:
    if not c:
        return []
    if "error" in c:
        return [f"comparison failed: {c['error'][-500:]}", ""]
    p = c["pruning"]
    rel = c["max_difference_relative_to_largest_edge"]
    lines = ["| agreement | value | target |", "|---|---|---|",
             f"| same logit targets | {c['targets_equal']} | |"]
    sel = c.get("selected_features")
    if sel:
        lines.append(f"| selected features (layer, position, feature): circuit-tracer / circuitgraph | "
                     f"{sel['n_selected_ct']:,} / {sel['n_selected_circuitgraph']:,} (of {sel['n_active_ct']:,} active), "
                     f"equal: {sel['selected_features_equal']} (only circuit-tracer {sel['n_only_ct']}, only "
                     f"circuitgraph {sel['n_only_circuitgraph']}) | equal: {_met(sel['selected_features_equal'])} |")
    lines += [
        f"| nodes (circuit-tracer / circuitgraph) | {c['n_nodes_ct']:,} / {c['n_nodes_circuitgraph']:,} | |",
        f"| non-zero edges (circuit-tracer / circuitgraph) | {c['nonzero_ct']:,} / {c['n_edges_circuitgraph']:,} | |",
        f"| largest edge | {c['largest_edge']:.4g} | |",
        f"| largest edge difference (every entry of the adjacency) | {c['max_abs_difference']:.3g} "
        f"({rel:.2e} of the largest edge) | <= 1e-5 of the largest edge: {_met(rel <= 1e-5)} |",
    ]
    if c.get("n_remainder_edges_circuitgraph"):
        lines.append(f"| circuitgraph's remainder-node edges (the unselected features' contributions, which "
                     f"circuit-tracer leaves out; not compared): count, largest | "
                     f"{c['n_remainder_edges_circuitgraph']:,}, {c['largest_remainder_edge_circuitgraph']:.3g} | |")
    same = c.get("pruning_without_remainders")
    for label, q, target in (
            ("circuitgraph's graph as built" + (" (remainder nodes kept)" if same else ""), p, same is None),
            ("circuitgraph's graph without its remainder nodes (circuit-tracer's node set and adjacency)", same, True)):
        if q is None:
            continue
        lines += [
            f"| kept nodes after pruning, {label} (circuit-tracer / circuitgraph) | {q['n_nodes_kept_ct']:,} / "
            f"{q['n_nodes_kept_circuitgraph']:,}, equal: {q['kept_nodes_equal']}"
            + (f" (+ {q['n_nodes_kept_without_ct_node']:,} remainder nodes)" if q.get("n_nodes_kept_without_ct_node")
               else "") + f" | {'equal: ' + _met(q['kept_nodes_equal']) if target else ''} |",
            f"| kept edges after pruning, {label} (circuit-tracer / circuitgraph) | {q['n_edges_kept_ct']:,} / "
            f"{q['n_edges_kept_circuitgraph']:,}, equal: {q['kept_edges_equal']} (only circuit-tracer "
            f"{q['n_edges_only_ct']}, only circuitgraph {q['n_edges_only_circuitgraph']}"
            + (f"; + {q['n_edges_kept_without_ct_node']:,} touching remainder nodes" if q.get("n_edges_kept_without_ct_node")
               else "") + f") | {'equal: ' + _met(q['kept_edges_equal']) if target else ''} |"]
    if same is not None:
        p = same
    cut = p.get("edge_cut")
    if cut and cut.get("rank") is not None:
        before = cut["cumulative_share_before_cut_minus_threshold"]
        lines.append(
            f"| edge cut (circuitgraph, float64): rank, one edge's share, cumulative share - 0.98 at the cut / "
            f"one rank before | {cut['rank']:,} of {cut['n_scores']:,}, {cut['share_of_one_score_at_cut']:.2e}, "
            f"{cut['cumulative_share_at_cut_minus_threshold']:+.2e} / {'-' if before is None else f'{before:+.2e}'} | |")
        if not p["kept_edges_equal"] and "kept_edges_verdict" in p:
            lines.append(f"| kept edges: verdict | {p['kept_edges_verdict']} (circuit-tracer cuts in float32, where "
                         "one step of a cumulative share near 1 is 6e-8) | |")
    return lines + [""]


def _bundle_text(b: dict[str, Any]) -> str:
    return (f"{b['n_layers']} layers, d_model {b['d_model']}, {b['n_heads']} heads, d_mlp {b['d_mlp']}, "
            f"d_vocab {b['d_vocab']}, {b['d_sae']}-feature transcoders"
            + (f", {b['active_frac']:.2%} active on calibration prompts" if b.get("active_frac") else "")
            + ("" if b.get("fit_decoder", True) else ", random decoders"))


def _recorded_line(e: dict[str, Any]) -> str:
    """Machine, load, commit and time of one suite's record."""
    m = e.get("machine") or {}
    start, end = e.get("code_at_start") or {}, e.get("code_at_end") or {}
    dirty = start.get("uncommitted_package_files") or []
    code = (f"commit `{start.get('commit')}` ({start.get('subject')})"
            + (f" plus uncommitted changes to {len(dirty)} package files (diff `{start.get('package_diff_sha1')}`)"
               if dirty else ""))
    state = lambda d: (d.get("commit"), d.get("package_diff_sha1"))  # noqa: E731
    if end and state(end) != state(start):
        code += f"; the package changed during the run (at the end: `{end.get('commit')}`, diff `{end.get('package_diff_sha1')}`)"
    kept = [r for r in e.get("runs", []) if r.get("recorded_with")]
    if kept:
        code += "; " + "; ".join(
            f"run {r.get('name')} kept from an earlier invocation ({r['recorded_with'].get('started')}, commit "
            f"`{(r['recorded_with'].get('code') or {}).get('commit')}`)" for r in kept)
    end_load = e.get("load_avg_at_end")
    text = (f"Recorded {e.get('started')}" + (f" in {e['total_seconds'] / 60:.1f} min" if "total_seconds" in e else
                                               " (interrupted: the runs recorded so far)")
            + f" on {m.get('cpu', '?')}, {m.get('cpu_count', '?')} cores, {m.get('memory_gb', 0):.0f} GB RAM, "
            f"{'CUDA available' if m.get('cuda') else 'no GPU'} (Python {m.get('python')}, torch {m.get('torch')}); "
            f"{code}. Load average (1 min) {e['load_avg_at_start'][0]:.1f} at the start, "
            + (f"{end_load[0]:.1f} at the end" if end_load else "- at the end")
            + " (during each run: in the tables).")
    env = e.get("environment") or {}
    if env.get("stripped_from_inherited"):
        text += (" Removed from the inherited environment before any process started: "
                 + ", ".join(f"`{k}`" for k in env["stripped_from_inherited"]) + ".")
    if e.get("stand_ins"):
        text += " **--quick: small stand-in configurations, not the sizes this section is about.**"
    return text


def _suite_head(e: dict[str, Any] | None, reproduce: str) -> list[str]:
    if e is None:
        return [f"Not recorded yet. Command: `{reproduce}`", ""]
    return [_recorded_line(e), "", f"Command: `{e.get('reproduce') or reproduce}`", ""]


#: each recorded suite: its title, what it measures and the command that records it
SECTIONS = {
    "side_by_side": ("Side by side with circuit-tracer: 6 layers, 32 tokens",
                     "The benchmark configuration of issue 25 item 1: end to end at least 15x circuit-tracer 0.5.0's "
                     "with circuit-tracer in its default environment (`--ct-env default`); a tuned environment "
                     "(circuitgraph's OpenMP settings, `--ct-env tuned` or `both`) is a separate column."),
    "gpt2_side_by_side": ("GPT-2-small size side by side: 64 tokens, max_feature_nodes 4096",
                          "Issue 25 item 2: end to end at least 40x circuit-tracer's, lower peak memory, the same "
                          "selected features and kept circuit; and circuitgraph alone at 256 tokens within 16 GiB."),
    "llama_1b": ("Llama-3.2-1B size: 64 tokens",
                 "Issue 25 item 3: 16 layers, d_model 2048, grouped-query attention, 128k vocabulary, 16 per-layer "
                 "transcoders of 32768 features; completes within 16 GiB peak resident memory; the dry run's "
                 "estimate next to the measured peak; whether circuit-tracer fits (`--ct-llama`)."),
    "long_prompt_gpt2": ("Long prompts, GPT-2 size: 256 to 2048 tokens, max_feature_nodes 8192",
                         "Issue 25 item 4: random decoders, ~110 active features per token and layer; 2048 tokens "
                         "within 30 minutes and 20 GiB."),
    "dataset": ("Dataset throughput", "`benchmarks/dataset_throughput.py`: the demo dataset, local processes and a "
                "local Ray instance, 1 and 2 workers (each configuration a fresh process)."),
    "gpu": ("On the GPU", "The side-by-side, GPT-2-size, Llama-size and long-prompt configurations with `model: "
            "{device: cuda}` (stage times wait for the device), next to their CPU times."),
}
OLDER_TITLES = {
    "prompt_length": "Prompt length (older suite)",
    "active_features": "Active features (older suite)",
    "gpt2_small": "GPT-2-small-sized random model, ~50 active per token and layer (older suite)",
    "precision": "Precision (older suite; model weights, edges accumulated in float32, float64 for float64)",
    "long_prompt_6l": "Long prompts, 6-layer model (older suite)",
}
COMMANDS = {
    "side_by_side": "python benchmarks/run_benchmarks.py --only side_by_side --ct-env both",
    "gpt2_side_by_side": "python benchmarks/run_benchmarks.py --only gpt2_side_by_side",
    "llama_1b": "python benchmarks/run_benchmarks.py --only llama_1b --llama-bundle DIR --ct-llama",
    "long_prompt_gpt2": "python benchmarks/run_benchmarks.py --only long_prompt_gpt2",
    "dataset": "python benchmarks/run_benchmarks.py --only dataset",
    "gpu": "python benchmarks/run_benchmarks.py --device cuda",
}


def _runs_section(e: dict[str, Any], out: Path, plots: bool = True) -> list[str]:
    rs = e.get("runs") or []
    if not rs:
        return []
    lines = _run_table(rs)
    if e["suite"].startswith("long_prompt"):
        lines += ["", *_scaling_table(rs)]
    if plots:
        lines += [""] + [f"![{p}]({p})" for p in _plot(e, out)]
    return lines + [""]


def _llama(e: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for r in e.get("runs") or []:
        lines.append(f"Bundle: {_bundle_text(r['bundle_config'])}.")
        dr = (r.get("plan") or {}).get("dry_run") or {}
        peak = (r.get("process") or {}).get("peak_rss_mb")
        ok = "result" in r
        lines += ["", "| run | completed | whole process s | peak RSS GiB | within 16 GiB | dry run: est. peak GB (x measured), "
                  "fits | dry run: est. edges | edges built |", "|---|---|---|---|---|---|---|---|"]
        est = dr.get("peak_gb")
        lines.append(f"| {r['name']} | {ok} | {_s(r['process']['wall_s'])} | {_gb(peak)} | "
                     f"{_met(ok and peak is not None and peak <= 16 * 1024)} | "
                     + (f"{est:.2f} ({est * 1024 / peak:.2f}x), {dr.get('verdict') or dr.get('fits')}" if est and peak
                        else str(dr.get('error', '-'))) + f" | {dr.get('n_edges_upper', 0):,} | "
                     + (f"{r['result']['n_edges']:,}" if ok else "-") + " |")
    ct = e.get("ct_attempt")
    if ct:
        verdict = {True: "fits", False: "does not fit", None: "undecided"}[ct.get("fits")]
        lines += ["", f"circuit-tracer 0.5.0 (default environment, batch size {ct.get('batch_size')}, "
                      f"`max_feature_nodes` {ct.get('max_feature_nodes')}, capped at {ct.get('memory_cap_gb', 0):.0f} GiB "
                      f"and {ct.get('time_cap_s', 0) / 60:.0f} min): **{verdict}**: {ct.get('why')}."]
    elif e.get("runs"):
        lines += ["", "circuit-tracer not tried (`--ct-llama` not given)."]
    return lines + [""]


def _long_prompt_target(e: dict[str, Any]) -> list[str]:
    n_pos = lambda r: (r.get("result") or {}).get("n_pos", r.get("n_pos", 0))  # noqa: E731
    longest = max(e.get("runs") or [], key=n_pos, default=None)
    if not longest or n_pos(longest) < 2048:
        return []
    if "result" not in longest:  # stopped (time limit, memory budget) or failed: what it had done
        p = longest["process"]
        why = ("stopped at the time limit" if p.get("killed_for_time") else
               "stopped at the memory budget" if p.get("killed_for_memory") else f"failed (exit {p['returncode']})")
        s = longest.get("progress_at_stop")
        return [f"{n_pos(longest)} tokens: {why} after {p['wall_s'] / 60:.1f} min"
                + (f", {s['done']} / {s['total']} feature rows done" if s else "")
                + "; target 30 min and 20 GiB: not met.", ""]
    wall, peak = longest["process"]["wall_s"], longest["process"]["peak_rss_mb"]
    return [f"2048 tokens: {wall / 60:.1f} min, peak {peak / 1024:.1f} GiB; target 30 min and 20 GiB: "
            f"{_met(wall <= 1800 and peak <= 20 * 1024)}.", ""]


def _dataset(e: dict[str, Any]) -> list[str]:
    d = e.get("dataset") or {}
    if "error" in d:
        return [f"Failed: `{d['error'][-300:]}`", ""]
    runs = (d.get("record") or {}).get("runs") or []
    lines = ["| executor | workers | prompts | prompts/min (start-up included) | prompts/min (steady) | s/prompt | "
             "aggregation overhead | load avg before -> after |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r['executor']} | {r['workers']} | {r['prompts']} | {r['prompts_per_minute']:.1f} | "
            f"{r['steady_prompts_per_minute']:.1f} | {r['mean_prompt_seconds']:.3f} | "
            f"{100 * r['aggregation_overhead']:.2f}% ({r['reduce_seconds_total']:.2f} s reduce + "
            f"{r['aggregate_seconds']:.2f} s combine) | {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f} |")
    return lines + [""]


def _gpu(e: dict[str, Any], cpu_runs: dict[str, dict[str, Any]]) -> list[str]:
    if e.get("skipped"):
        return [f"skipped: {e['skipped']}", ""]
    lines = ["| run | device | attribute s | whole process s | CPU whole process s (same configuration) | "
             "peak device memory GB | peak RSS GB |", "|---|---|---|---|---|---|---|"]
    for r in e.get("runs") or []:
        cpu = cpu_runs.get(r["name"].removesuffix("-cuda"))
        if "result" not in r:
            lines.append(f"| {r['name']} | | FAILED (exit {r['process']['returncode']}) | {_s(r['process']['wall_s'])} "
                         f"| | | {_gb(r['process']['peak_rss_mb'])} |")
            continue
        res = r["result"]
        dev = max((v for k, v in res["peak_rss_mb"].items() if k.endswith("_device")), default=None)
        lines.append(f"| {r['name']} | {res.get('device_name') or res.get('device')} | "
                     f"{_s(res['timings_s'].get('attribute'))} | {_s(r['process']['wall_s'])} | "
                     f"{_s(cpu['process']['wall_s']) if cpu and 'process' in cpu else '-'} | {_gb(dev)} | "
                     f"{_gb(r['process']['peak_rss_mb'])} |")
    for n in e.get("not_run") or []:
        lines.append(f"| {n['name']} | not run: {n['why']} | | | | | |")
    return lines + [""]


def _estimates(entries: list[dict[str, Any]]) -> list[str]:
    est = [r for e in entries for r in e.get("runs") or [] if "result" in r and r["suite"] != "precision"]
    if not est:
        return []
    recheck = any("dry_run_recheck" in r.get("plan", {}) for r in est)
    lines = ["## Memory estimates", "",
             "Before each run the suite counts the active features per (layer, position) on its prompt (one forward "
             "pass in a separate process) and estimates the full graph (every causally allowed (reader, writer) pair "
             "non-zero); above the budget it uses `max_feature_nodes`. `circuitgraph run --dry-run`'s own estimate "
             "(`circuitgraph.pipeline.estimate`, run as a command on the same spec) is shown next to the measured "
             "peak: it should be an upper bound within a small factor.", "",
             "| run | est. edges (full graph) | edges built | est. peak GB: full graph / run as done | "
             "dry-run: est. edges, peak GB, fits | measured peak GB | dry run / measured |"
             + (" dry run re-made (`--recheck-dry-run`): peak GB (x measured), commit |" if recheck else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if recheck else "")]
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
        ratio = f"{dr['peak_gb'] / measured:.2f}x" if dr.get("peak_gb") and measured else "-"
        lines.append(f"| {r['name']} | {pl['est_full_edges']:,.0f} | {built} | {pl['est_full_peak_gb']:.1f} / "
                     f"{'-' if done is None else f'{done:.1f}'} | {dr.get('n_edges_upper', 0):,}, "
                     f"{dr.get('peak_gb', float('nan')):.1f}, {dr.get('verdict') or dr.get('fits')} | "
                     f"{measured:.2f} | {ratio} |" + extra)
    return lines + [""]


def write_report(results: dict[str, Any], out: Path) -> None:
    """``OUT/README.md`` (every table) and the plots, from the merged ``results.json`` (written by
    the caller): one section per recorded suite, in :data:`SECTIONS`'s order, each with its machine,
    load, commit and command; a suite not recorded yet says so, with its command."""
    out = Path(out)
    suites: dict[str, dict[str, Any]] = results.get("suites") or {}
    quick = any(e.get("mode") == "quick" for e in suites.values())
    lines = [
        "# Benchmarks" + (" (--quick stand-ins)" if quick else ""), "",
        "Every table of circuitgraph's recorded benchmarks, written by `benchmarks/report.py` from "
        "[results.json](results.json) (every number, per run); each suite is recorded by its own command "
        "(`python benchmarks/run_benchmarks.py --only SUITE`, see [benchmarks/README.md](../../benchmarks/README.md)) "
        "and merged into results.json, so each section says when, on which machine, under which load and at "
        "which commit it was measured.", "",
        "How to read: every run is a separate process; times are wall-clock seconds; `process s` is the whole "
        "process (interpreter start, imports, loading, every stage); peak RSS is the process's `ru_maxrss`. "
        "Completeness is the largest relative violation over every reader of `pre_activation = sum(incoming edges) "
        "+ constant`. With load above the core count, wall times are upper bounds. circuit-tracer runs in its "
        "default environment (the inherited one, no OpenMP/MKL variable, torch's own thread count) unless a "
        "column says `tuned`; circuitgraph's processes get the same plain environment and `circuitgraph run` "
        "sets its own OpenMP defaults inside itself.", ""]
    cpu_runs = {r["name"]: r for e in suites.values() if e.get("suite") != "gpu" for r in e.get("runs") or []}
    for e in suites.values():  # a side by side's CPU counterpart: its stage-by-stage run (bench_one.py, as on the GPU)
        if (e.get("side_by_side") or {}).get("circuitgraph_stages"):
            cpu_runs[e["side_by_side"]["name"]] = e["side_by_side"]["circuitgraph_stages"]
    for name, (title, what) in SECTIONS.items():
        e = suites.get(name)
        lines += [f"## {title}", "", what, "", *_suite_head(e, COMMANDS[name])]
        if e is None:
            continue
        if e.get("skipped") and name != "gpu":
            lines += [f"Not run: {e['skipped']}", ""]
        if name in ("side_by_side", "gpt2_side_by_side") and e.get("side_by_side"):
            lines += _side_by_side(e["side_by_side"], 15.0 if name == "side_by_side" else 40.0)
        if name == "gpt2_side_by_side" and e.get("runs"):
            lines += ["circuitgraph alone (`bench_one.py`, stage by stage; target: 256 tokens within 16 GiB):", ""]
            lines += _runs_section(e, out, plots=False)
            for r in e["runs"]:
                peak = r["process"]["peak_rss_mb"]
                lines += [f"{r['name']}: completed {'result' in r}, peak {_gb(peak)} GB: within 16 GiB "
                          f"{_met('result' in r and peak <= 16 * 1024)}.", ""]
        elif name == "llama_1b":
            lines += _llama(e) + _runs_section(e, out, plots=False)
        elif name == "long_prompt_gpt2":
            lines += _runs_section(e, out) + _long_prompt_target(e)
        elif name == "dataset":
            lines += _dataset(e)
        elif name == "gpu":
            lines += _gpu(e, cpu_runs)
    for name, title in OLDER_TITLES.items():
        e = suites.get(name)
        if e is None:
            continue
        lines += [f"## {title}", "", *_suite_head(e, f"python benchmarks/run_benchmarks.py --only {name}")]
        lines += (_precision_table(e.get("runs") or []) + [""]) if name == "precision" else _runs_section(e, out)
    lines += _estimates(list(suites.values()))
    # benchmarks of minutes to hours: the docs test (tests/test_docs_examples.py) does not run them
    lines += ["## Reproduce", "",
              "The lead's order on an idle machine (the circuit-tracer venv once; bundles are built on first use "
              "and cached in `--work`); each command merges its suite into results.json and redraws this page:", "",
              "```bash no-run", "bash scripts/install_circuit_tracer.sh   # circuit-tracer 0.5.0 in .venv-ct",
              *[COMMANDS[s] for s in SECTIONS],
              "python benchmarks/run_benchmarks.py --report-only      # redraw this page from results.json",
              "python benchmarks/run_benchmarks.py --readme write     # README.md's speed paragraph from results.json",
              "```", "",
              "Older pages (earlier harnesses and code, kept for the record): [archive/](archive/). "
              "Profiles: [profiling.md](profiling.md); tracr ground truth: [ground_truth.md](ground_truth.md).", ""]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "README.md.partial"
    tmp.write_text("\n".join(lines))
    tmp.replace(out / "README.md")


# ----------------------------------------------------------------------------- README.md's paragraph
README_START = "<!-- benchmarks:speed:start (written by `python benchmarks/run_benchmarks.py --readme write`) -->"
README_END = "<!-- benchmarks:speed:end -->"


def readme_paragraph(results: dict[str, Any]) -> str:
    """README.md's speed paragraph, its numbers taken from ``results.json``'s recorded suites."""
    suites = results.get("suites") or {}
    parts = ["Edges come from one transposed sweep of the frozen model per batch of readers (batched GEMMs, no "
             "autograd) and are stored sparsely."]
    recorded = False
    for name in ("side_by_side", "gpt2_side_by_side"):
        e = suites.get(name)
        if not e or e.get("mode") == "quick" or not e.get("side_by_side"):
            continue
        sbs = e["side_by_side"]
        b, mfn = sbs["bundle_config"], sbs.get("max_feature_nodes")
        label = (("At GPT-2-small size" if name == "gpt2_side_by_side" else "On the side-by-side benchmark")
                 + f" ({b['n_layers']} layers, d_model {b['d_model']}, {b['d_sae']:,}-feature transcoders, a "
                 f"{sbs['n_pos']}-token prompt" + (f", `max_feature_nodes` {mfn} for both" if mfn else ", the full graph")
                 + f"; {e['machine'].get('cpu_count')} CPU cores)")
        n = side_by_side_numbers(sbs)
        ct = n["ct"].get("default")
        if not ct or not ct.get("e2e") or not n["cg_e2e"]:
            continue
        recorded = True
        text = (f"{label}, the whole run from the spec to a pruned graph JSON on disk takes {n['cg_e2e']:.1f} s "
                f"against circuit-tracer 0.5.0's {ct['e2e']:.1f} s in its default environment "
                f"({ct['e2e'] / n['cg_e2e']:.1f}x)")
        if ct.get("attribute") and n["cg_attribute"]:
            text += f"; graph construction alone {n['cg_attribute']:.1f} s against {ct['attribute']:.1f} s " \
                    f"({ct['attribute'] / n['cg_attribute']:.1f}x)"
        if ct.get("peak_mb") and n["cg_peak_mb"]:
            text += f"; peak memory {n['cg_peak_mb'] / 1024:.1f} GB against {ct['peak_mb'] / 1024:.1f} GB"
        cmp = sbs.get("comparison") or {}
        p = cmp.get("pruning_without_remainders") or cmp.get("pruning") or {}
        sel = cmp.get("selected_features") or {}
        same = [w for w, ok in (("selected features", sel.get("selected_features_equal")),
                                ("kept nodes", p.get("kept_nodes_equal")), ("kept edges", p.get("kept_edges_equal")))
                if ok]
        if same:
            text += "; the same " + (" and ".join(same) if len(same) < 3 else f"{same[0]}, {same[1]} and {same[2]}") + (
                " (pruned on circuit-tracer's node set, circuitgraph's remainder nodes set aside)"
                if "pruning_without_remainders" in cmp and any(w.startswith("kept") for w in same) else "")
        parts.append(text + ".")
    e = suites.get("llama_1b")
    ok = [r for r in (e or {}).get("runs") or [] if "result" in r]
    if e and e.get("mode") != "quick" and ok:
        r = ok[0]
        recorded = True
        b = r["bundle_config"]
        parts.append(f"At Llama-3.2-1B size ({b['n_layers']} layers, d_model {b['d_model']}, d_vocab {b['d_vocab']:,}, "
                     f"{b['n_layers']} transcoders of {b['d_sae']:,} features), a {r['result']['n_pos']}-token prompt "
                     f"takes {r['process']['wall_s']:.0f} s at {r['process']['peak_rss_mb'] / 1024:.1f} GB peak"
                     + (f" (`max_feature_nodes` {r['result']['max_feature_nodes']})"
                        if r["result"].get("max_feature_nodes") else "") + ".")
    e = suites.get("long_prompt_gpt2")
    ok = sorted([r for r in (e or {}).get("runs") or [] if "result" in r], key=lambda r: r["result"]["n_pos"])
    if e and e.get("mode") != "quick" and ok:
        r = ok[-1]
        recorded = True
        parts.append(f"A {r['result']['n_pos']:,}-token prompt at GPT-2 size (`max_feature_nodes` "
                     f"{r['result']['max_feature_nodes']}) takes {r['process']['wall_s'] / 60:.1f} min at "
                     f"{r['process']['peak_rss_mb'] / 1024:.1f} GB peak.")
    if not recorded:
        parts.append("The side by side with circuit-tracer 0.5.0 (run in its default environment), the GPT-2-size "
                     "and Llama-3.2-1B-size runs and the long prompts are recorded with the current harness in "
                     "docs/benchmarks; their numbers appear here once recorded.")
    parts.append("Machine, load, commit, every table and the commands: "
                 "[docs/benchmarks/README.md](docs/benchmarks/README.md).")
    return textwrap.fill(" ".join(parts), width=92, break_long_words=False, break_on_hyphens=False)


def rewrite_readme(path: Path, paragraph: str) -> None:
    """Replace the text between :data:`README_START` and :data:`README_END` in ``path``."""
    text = Path(path).read_text()
    a, b = text.find(README_START), text.find(README_END)
    if a < 0 or b < a:
        raise SystemExit(f"{path}: the speed paragraph's markers are missing ({README_START!r} ... {README_END!r}); "
                         "put them around the paragraph to be rewritten")
    new = text[: a + len(README_START)] + "\n" + paragraph + "\n" + text[b:]
    tmp = Path(str(path) + ".partial")
    tmp.write_text(new)
    tmp.replace(path)
