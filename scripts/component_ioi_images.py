"""The IOI component circuit (examples/real/component_ioi.yaml) as a diagram and in the explorer.

    python scripts/component_ioi_images.py WORK_DIR [--out docs/images] [--spec examples/real/component_ioi.yaml]

Runs the spec once (heavy: the real model, about 2.5 GB; skipped when ``WORK_DIR/ioi/graph.json``
exists), then, from the pruned graph file alone:

* ``component_ioi_graph.svg`` / ``.png``: the diagram of the ``--max-nodes`` most influential nodes
  (exact value edges solid, linearised query/key edges dashed and labelled ``q`` / ``k``);
* ``component_ioi_explorer.png`` and ``component_ioi_explorer_qk.png``: ``circuitgraph serve WORK_DIR``
  in headless Chromium (Playwright, Debian's Chromium), the strongest name mover at the final
  position selected: its exact value inputs in the node panel, then the panel scrolled to its
  linearised query and key inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build(spec_path: Path, folder: Path) -> Path:
    import yaml

    import circuitgraph

    spec = yaml.safe_load(spec_path.read_text())
    out = folder / "ioi" / "graph.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    spec["export"] = {"json": str(out)}
    circuitgraph.run(spec, progress=False)
    return out


def diagram(graph_file: Path, out: Path, max_nodes: int) -> list[Path]:
    from circuitgraph.export.json_graph import graph_from_json

    g = graph_from_json(graph_file)
    paths = []
    for suffix in ("svg", "png"):
        path = out / f"component_ioi_graph.{suffix}"
        g.render(str(path), max_nodes=max_nodes, max_edges=2 * max_nodes, title="IOI component circuit of SmolLM2-135M-Instruct: "
                 "heads and MLPs with inputs (q/k dashed: linearised)")
        paths.append(path)
    return paths


def mover(graph_file: Path) -> str:
    """The head at the final position with the largest direct effect on the target."""
    from circuitgraph.export.json_graph import graph_from_json

    g = graph_from_json(graph_file)
    tid = g.targets[0][0]
    T = max(n.position for n in g.nodes) + 1
    direct = {g.nodes[s].id: float(w) for s, t, w in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False)
              if g.nodes[t].id == tid and g.nodes[s].kind == "attention_head" and g.nodes[s].position == T - 1}
    return str(max(direct, key=direct.get))


def screenshot(graph_file: Path, out: Path, node: str, budget: int = 16) -> Path:
    import shutil
    import tempfile

    from PIL import Image

    from circuitgraph.serve import running_server
    from circuitgraph.testing.browser import playwright_chromium

    path, qk_path = out / "component_ioi_explorer.png", out / "component_ioi_explorer_qk.png"
    folder = Path(tempfile.mkdtemp(prefix="component_ioi_"))  # the graph file alone in the catalog
    (folder / "ioi").mkdir()
    shutil.copyfile(graph_file, folder / "ioi" / "graph.json")
    with running_server(folder) as server, playwright_chromium() as browser:
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        page.goto(server.url + "#graph=ioi%2Fgraph.json")
        page.wait_for_function("document.body.dataset.state === 'ready'")
        page.focus("#node-budget")
        for _ in range(40 - budget):  # the most influential nodes only: a layer per row stays legible
            page.keyboard.press("ArrowLeft")
        page.wait_for_timeout(1500)  # the slider's request
        page.wait_for_function("document.body.dataset.state === 'ready'")
        page.click(f'#graph g.node[data-id="{node}"]')
        page.wait_for_function(f"document.getElementById('details').dataset.node === '{node}' && "
                               "document.getElementById('details').dataset.state === 'ready'")
        page.click("#zoom-fit")  # the whole circuit, not the opening view around the targets
        page.screenshot(path=str(path))
        # the same panel scrolled to the head's linearised query and key inputs
        page.evaluate("""() => { const h = [...document.querySelectorAll('#details h4')]
                                   .find((e) => e.textContent.startsWith('query inputs'));
                                 if (h) h.previousElementSibling.scrollIntoView(); }""")
        page.screenshot(path=str(qk_path))
    for p in (path, qk_path):
        Image.open(p).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(p, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "real" / "component_ioi.yaml")
    ap.add_argument("--max-nodes", type=int, default=20)
    args = ap.parse_args(argv)
    graph_file = args.work / "ioi" / "graph.json"
    if not graph_file.exists():
        build(args.spec, args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    for p in diagram(graph_file, args.out, args.max_nodes):
        print(p)
    print(screenshot(graph_file, args.out, mover(graph_file)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
