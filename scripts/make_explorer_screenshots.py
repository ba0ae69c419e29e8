"""Screenshots for docs/explorer.md: `circuitgraph serve` on the built-in demo, in headless Chromium.

    python scripts/make_explorer_screenshots.py [--out docs/images] [--keep DIR]

Builds, in a temporary folder (or DIR with --keep, which `circuitgraph serve DIR` then shows):

* ``demo/graph.json`` -- the demo graph (examples/demo.yaml's prompt, pruned, with a ``qk`` query);
* ``demo_dataset/`` -- a dataset run of the demo over the first 12 prompts of examples/demo_dataset.jsonl;
* ``demo_features/`` -- dashboards of the demo transcoders' features over all 300 prompts of that
  dataset, computed here directly from the model and transcoders (exact top-5 activations per
  feature with their context, density, the tokens each decoder row promotes through the
  unembedding), written in the features-folder layout of docs/explorer.md, with the labels of
  examples/demo_feature_labels.csv;

then serves the folder and takes the screenshots with Playwright (Debian's Chromium, no download).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOP_K, CONTEXT = 5, 6


def demo_features(out: Path, prompts: list[str], row_ids: list[str]) -> None:
    """Top-``TOP_K`` activating tokens of every demo transcoder feature over ``prompts``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from circuitgraph.pipeline.inputs import load_inputs, resolve_prompt_like
    from circuitgraph.spec import load_spec
    from circuitgraph.testing.explorer_fixture import demo_spec

    adapter, transcoders = load_inputs(load_spec(demo_spec()))
    model, tok = adapter.model, adapter.tokenizer
    heaps: dict[tuple[int, int], list] = {}
    counts: dict[int, np.ndarray] = {}
    sums: dict[int, np.ndarray] = {}
    maxima: dict[int, np.ndarray] = {}
    n_tokens = 0
    rows_tokens = []
    hooks = {layer: transcoders[layer].hook_in for layer in transcoders.layers}
    for row_id, text in enumerate(prompts):
        ids = resolve_prompt_like(text, adapter)
        rows_tokens.append(ids)
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=list(hooks.values()))
        n_tokens += len(ids) - 1  # the BOS position is not counted
        for layer, hook in hooks.items():
            acts = transcoders[layer].activation(cache[hook][0]).double().numpy()[1:]  # (pos, d_sae), no BOS
            d = acts.shape[1]
            counts.setdefault(layer, np.zeros(d))
            sums.setdefault(layer, np.zeros(d))
            maxima.setdefault(layer, np.zeros(d))
            active = acts > 0
            counts[layer] += active.sum(0)
            sums[layer] += acts.sum(0)
            maxima[layer] = np.maximum(maxima[layer], acts.max(0))
            for pos, feat in zip(*np.nonzero(active)):
                key, item = (layer, int(feat)), (float(acts[pos, feat]), -row_id, -(int(pos) + 1))
                heap = heaps.setdefault(key, [])
                (heapq.heappush if len(heap) < TOP_K else heapq.heappushpop)(heap, item)
    W_U = model.W_U.detach().double()
    features, examples = [], []
    for layer in sorted(hooks):
        tc = transcoders[layer]
        for feat in range(tc.d_sae):
            if counts[layer][feat] == 0:
                continue
            logits = tc.decoder_rows(torch.tensor([feat]))[0].double() @ W_U
            order = torch.argsort(logits, descending=True).tolist()
            listing = lambda ids: [{"token": tok.token_str(i), "token_id": i, "value": float(logits[i])} for i in ids]  # noqa: E731
            features.append({"layer": layer, "index": feat, "n_tokens": n_tokens, "n_active": int(counts[layer][feat]),
                             "density": float(counts[layer][feat] / n_tokens), "max_activation": float(maxima[layer][feat]),
                             "mean_active_activation": float(sums[layer][feat] / counts[layer][feat]),
                             "top_output_tokens": listing(order[:8]), "bottom_output_tokens": listing(order[-8:][::-1])})
            for rank, (act, neg_row, neg_pos) in enumerate(sorted(heaps[(layer, feat)], reverse=True)):
                row, pos = -neg_row, -neg_pos
                ids = rows_tokens[row]
                lo = max(1, pos - CONTEXT)
                window = ids[lo:pos + 3]
                pieces = [tok.token_str(t) for t in window]
                at = pos - lo
                text = "".join(pieces[:at]) + "«" + pieces[at] + "»" + "".join(pieces[at + 1:])
                examples.append({"layer": layer, "index": feat, "rank": rank + 1, "row_id": row_ids[row],
                                 "row": row + 1, "position": pos, "start": lo, "activation": act, "tokens": window,
                                 "text": text})
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(features), out / "features.parquet")
    pq.write_table(pa.Table.from_pylist(examples), out / "examples.parquet")
    labels = list(csv.DictReader((REPO / "examples" / "demo_feature_labels.csv").open(encoding="utf-8")))
    with (out / "labels.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, ["layer", "index", "label"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(labels)


def build(folder: Path) -> None:
    from circuitgraph.testing.explorer_fixture import demo_dataset_run, demo_graph_file

    rows = [json.loads(line) for line in (REPO / "examples" / "demo_dataset.jsonl").read_text().splitlines() if line]
    demo_graph_file(folder / "demo" / "graph.json", qk=True)
    demo_dataset_run(folder / "demo_dataset", [r["prompt"] for r in rows[:12]])
    demo_features(folder / "demo_features", [r["prompt"] for r in rows], [r["id"] for r in rows])


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
