"""The package root's lazy names: a graph handed out through ``circuitgraph.<name>`` has its file and
display methods in a fresh interpreter (they are ``circuitgraph.export``'s, registered on import)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import circuitgraph as cg
getattr(cg, {name!r})
import circuitgraph.graph.graph as g
print(",".join(sorted(g.GRAPH_EXPORTS)))
"""


@pytest.mark.parametrize("name", ["AttributionGraph", "attribute", "run", "load_graph"])
def test_a_graph_name_brings_the_graphs_methods(name: str) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(name=name)], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "from_json,html,render,svg,to_dot,to_json"


def test_the_spec_names_stay_free_of_torch() -> None:
    code = "import sys, circuitgraph as cg; cg.load_spec; cg.Spec; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_install_hints_name_the_distribution() -> None:
    """``pip install 'circuitgraph[...]'`` installs an unrelated package of that name (it takes the
    import name over): every hint names the distribution, ``circuitgraph-lm``."""
    root = Path(__file__).resolve().parents[1]
    wrong = [f"{p.relative_to(root)}:{i}" for folder in ("circuitgraph", "docs")
             for p in sorted((root / folder).rglob("*")) if p.suffix in (".py", ".md")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bcircuitgraph\[", line)]
    assert not wrong, f"install hints naming circuitgraph[...] instead of circuitgraph-lm[...]: {wrong}"
