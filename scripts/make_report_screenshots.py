"""Screenshots for docs/reports.md: the HTML report of the demo run, and its Neuronpedia export
next to circuit-tracer's own file in circuit-tracer's bundled frontend (headless Chromium).

    python scripts/make_report_screenshots.py [--out docs/images]

Needs Graphviz, Chromium, circuit-tracer's virtualenv (scripts/install_circuit_tracer.sh) and
the frontend's libraries (scripts/fetch_viewer_libs.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import circuitgraph
    from circuitgraph.export.neuronpedia import graph_to_neuronpedia, neuronpedia_scores
    from circuitgraph.testing.browser import run_chromium, serve_viewer, viewer_unavailable

    reason = viewer_unavailable()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory() as tmp:
        # 1. the demo run's HTML report
        spec = circuitgraph.load_spec(REPO / "examples" / "demo.yaml").model_dump(mode="json")
        spec["export"] = {"max_render_nodes": 60}
        for check in spec.get("validate", []):
            if "patching" in check:
                check["patching"]["heatmap"] = str(Path(tmp) / "patching.png")
        result = circuitgraph.run(spec)
        report = Path(result.report(Path(tmp) / "report.html"))
        run_chromium(report.as_uri(), screenshot=args.out / "report.png", window=(1280, 1500))
        print(f"wrote {args.out / 'report.png'}")

        # 2. Neuronpedia exports in circuit-tracer's frontend: the demo (a logit-difference target)
        #    and the GPT-2 fixture next to circuit-tracer's own file for it
        fixture = circuitgraph.run({
            "format_version": 1,
            "model": {"path": str(REPO / "examples" / "fixtures" / "example-gpt2" / "model")},
            "transcoders": {"path": str(REPO / "examples" / "fixtures" / "example-gpt2" / "transcoders")},
            "prompt": {"tokens": json.loads((REPO / "examples" / "fixtures" / "example-gpt2" / "prompt.json")
                                           .read_text())["tokens"]},
            "targets": [{"top_logits": {"max_n": 10, "cumulative_probability": 0.95}}],
            "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
        })
        docs = {
            "demo": graph_to_neuronpedia(result.graph, full_graph=result.full_graph, slug="demo"),
            "fixture": graph_to_neuronpedia(fixture.graph, full_graph=fixture.full_graph, slug="fixture"),
            "circuit-tracer": json.loads((REPO / "tests" / "data" / "circuit_tracer" / "example-gpt2.json")
                                         .read_text()),
        }
        for slug, doc in docs.items():
            print(f"{slug}: Neuronpedia scores {neuronpedia_scores(doc)}")
        with serve_viewer(docs) as url:
            for slug, name in (("demo", "neuronpedia_viewer_demo.png"), ("fixture", "neuronpedia_viewer_ours.png"),
                               ("circuit-tracer", "neuronpedia_viewer_circuit_tracer.png")):
                # click the first output, so the viewer draws its links and its input features
                clicked = next(n["node_id"] for n in docs[slug]["nodes"] if n["feature_type"] == "logit")
                run_chromium(f"{url}/index.html?slug={slug}&clickedId={clicked}", screenshot=args.out / name,
                             window=(1200, 620), budget_ms=8000)
                print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
