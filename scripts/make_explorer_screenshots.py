"""Screenshots for docs/explorer.md: `circuitgraph serve` on the built-in demo, in headless Chromium.

    python scripts/make_explorer_screenshots.py [--out docs/images] [--keep DIR]

Builds, in a temporary folder (or DIR with --keep, which `circuitgraph serve DIR` then shows):

* ``demo/graph.json`` -- the demo graph (examples/demo.yaml's prompt, pruned, with a ``qk`` query and
  the results of two ``steer:`` items of examples/demo_steer.yaml);
* ``demo/corrupted.json`` -- the demo graph of the corrupted prompt (``... the dog ...``), to compare;
* ``demo_dataset/`` -- a dataset run of the demo over the first 12 prompts of examples/demo_dataset.jsonl;
* ``demo_features/`` -- the feature dashboards of examples/demo_features.yaml (the features pipeline
  over all 300 prompts of that dataset, ``export: {features: DIR}``), with the labels of
  examples/demo_feature_labels.csv;

then serves the folder and takes the screenshots with Playwright (Debian's Chromium, no download).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: the steer: items of the demo graph shown (examples/demo_steer.yaml's first two)
STEER = [
    {"name": "vowel features off",
     "interventions": [{"nodes": {"id": ["feature/0/11/142", "feature/0/11/160", "feature/1/11/99", "feature/1/11/453",
                                         "feature/1/11/457"]}, "mode": "zero"}],
     "generate": {"max_new_tokens": 4}},
    {"name": "vowel features off, consonant feature on",
     "interventions": [{"nodes": {"id": ["feature/0/11/142", "feature/0/11/160", "feature/1/11/99", "feature/1/11/453",
                                         "feature/1/11/457"]}, "mode": "zero"},
                       {"node": "feature/0/11/292", "mode": "set", "value": 3.0}],
     "generate": {"max_new_tokens": 4}},
]


def demo_features(out: Path) -> None:
    """The features pipeline of examples/demo_features.yaml (``features:`` over the 300 prompts of
    examples/demo_dataset.jsonl, ``export: {features: out}``), then the labels of
    examples/demo_feature_labels.csv as ``out/labels.csv`` (the run never writes labels)."""
    import yaml

    import circuitgraph

    spec = yaml.safe_load((REPO / "examples" / "demo_features.yaml").read_text())
    spec["dataset"] = str(REPO / "examples" / spec["dataset"])
    spec["export"] = {"features": str(out)}
    circuitgraph.run(spec, progress=False)
    shutil.copyfile(REPO / "examples" / "demo_feature_labels.csv", out / "labels.csv")
    circuitgraph.open_features(out)  # it reads back


def build(folder: Path) -> None:
    from circuitgraph.testing.explorer_fixture import (
        DEMO_CORRUPTED_PROMPT,
        demo_dataset_run,
        demo_graph_file,
    )

    rows = [json.loads(line) for line in (REPO / "examples" / "demo_dataset.jsonl").read_text().splitlines() if line]
    # the features first: demo_dataset_run patches the executor while it runs, and a features
    # driver imported during it would keep the patched one
    demo_features(folder / "demo_features")
    demo_graph_file(folder / "demo" / "graph.json", qk=True, steer=STEER)
    demo_graph_file(folder / "demo" / "corrupted.json", prompt=DEMO_CORRUPTED_PROMPT)
    demo_dataset_run(folder / "demo_dataset", [r["prompt"] for r in rows[:12]])


def shoot(folder: Path, out: Path) -> list[Path]:
    from circuitgraph.serve import running_server
    from circuitgraph.testing.browser import playwright_chromium

    shots = []
    with running_server(folder) as server, playwright_chromium() as browser:
        page = browser.new_page(viewport={"width": 1440, "height": 860})
        ready = "document.body.dataset.state === 'ready'"
        page.goto(server.url + "#graph=demo%2Fgraph.json")
        page.wait_for_function(ready)
        page.focus("#node-threshold")
        for _ in range(15):
            page.keyboard.press("ArrowLeft")  # node threshold 0.85
        page.wait_for_function(ready + " && document.getElementById('graph').dataset.nodeThreshold === '0.85'")
        page.click('#graph g.node[data-id="feature/0/11/142"]')
        page.wait_for_function("document.getElementById('details').dataset.state === 'ready'")
        page.click("#pin-button")
        page.click('#graph g.node[data-id="feature/0/11/160"]')
        page.wait_for_function("document.getElementById('details').dataset.node === 'feature/0/11/160' && "
                               "document.getElementById('details').dataset.state === 'ready'")
        page.click("#pin-button")
        page.click('#graph g.node[data-id="feature/0/11/142"]')
        page.wait_for_function("document.getElementById('details').dataset.node === 'feature/0/11/142' && "
                               "document.getElementById('details').dataset.state === 'ready'")
        page.fill("#search", "owl")
        shots.append(_shot(page, out / "explorer_graph.png"))

        page.fill("#search", "")
        page.click("#propose-button")
        page.wait_for_selector("#proposals .item")
        page.click("#proposals .item button >> nth=0")
        page.wait_for_function(ready)
        page.click("#qk-list .item >> nth=0")
        shots.append(_shot(page, out / "explorer_supernode_qk.png"))

        page.select_option("#graph-select", "demo_dataset/aggregate")
        page.wait_for_function(ready)
        page.wait_for_selector("#dataset-rows .item")
        page.click('#graph g.node[data-id="feature/0/0/292"]')
        page.wait_for_function("document.getElementById('details').dataset.state === 'ready'")
        shots.append(_shot(page, out / "explorer_dataset.png"))

        page.select_option("#graph-select", "demo/graph.json")
        page.wait_for_function(ready)
        page.wait_for_selector("#steering-list .item")
        page.click('#steering-list .item[data-steer="1"]')
        page.wait_for_function("document.getElementById('details').dataset.node === 'steer 1'")
        shots.append(_shot(page, out / "explorer_steering.png"))

        page.select_option("#diff-b", "demo/corrupted.json")
        page.click("#diff-button")
        page.wait_for_function("document.getElementById('details').dataset.node === 'diff' && "
                               "document.getElementById('details').dataset.state === 'ready'")
        shots.append(_shot(page, out / "explorer_diff.png"))
    return shots


def _shot(page, path: Path) -> Path:
    """A screenshot, stored with a 256-colour palette (a few hundred kB at most)."""
    from PIL import Image

    page.screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    ap.add_argument("--keep", type=Path, default=None, help="build the served folder here and keep it")
    args = ap.parse_args(argv)
    from circuitgraph.testing.browser import playwright_unavailable

    reason = playwright_unavailable()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        build(folder)
        for path in shoot(folder, args.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
