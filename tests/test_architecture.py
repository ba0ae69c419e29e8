"""The architecture's rules, checked on the source (AST), and the engine's public context API.

* no module outside ``circuitgraph/attribution/`` reaches into the engine's tables (the
  collected writer/reader tables, their padded blocks, the integer location encoding): it uses
  :class:`~circuitgraph.attribution.context.AttributionContext`'s ``writer`` / ``reader`` /
  ``frozen_model`` and :class:`~circuitgraph.attribution.context.ResidualLocation`;
* no module sets a private attribute on another object (caches are declared on their class),
  nor reads a private attribute that its own module does not define;
* two modules of the package never share a name for different things;
* the public API is consistent with the edges: propagating a reader's direction down to a
  writer's location and dotting with its vector gives the edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

PACKAGE = Path(__file__).resolve().parents[1] / "circuitgraph"
ENGINE = PACKAGE / "attribution"

#: attributes of the engine's tables (Collected, WriterTable, ReaderTable) and the context's privates
ENGINE_TABLES = {"collected", "_tables", "_writer_index", "_reader_index"}
TABLE_FIELDS = {"writers": {"groups", "padded", "blocks"}, "readers": {"rows", "locs", "positions", "directions", "own_constants"}}
ENGINE_PRIVATE_NAMES = {"Collected", "WriterTable", "ReaderTable", "collect_nodes"}

#: (module, attribute) pairs allowed to set a private attribute on another object (none)
ALLOWED_PRIVATE_SETS: set[tuple[str, str]] = set()
#: documented public functions whose names start with an underscore
PUBLIC_UNDERSCORE_NAMES = {"os._exit"}


def _modules(outside_engine: bool = False):
    for path in sorted(PACKAGE.rglob("*.py")):
        if outside_engine and ENGINE in path.parents:
            continue
        yield path, ast.parse(path.read_text(), filename=str(path))


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


#: modules outside attribution/ that may read the engine's tables, and why (none today:
#: pipeline/estimate.py plans through Collected.count_tables and attribution.build.plan_run)
ENGINE_TABLE_READERS: set[str] = set()


def test_no_module_outside_the_engine_touches_its_tables():
    problems = []
    for path, tree in _modules(outside_engine=True):
        if _rel(path) in ENGINE_TABLE_READERS:
            continue
        for node in ast.walk(tree):
            where = f"{_rel(path)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute):
                if node.attr in ENGINE_TABLES:
                    problems.append(f"{where}: .{node.attr}")
                inner = node.value
                if isinstance(inner, ast.Attribute) and node.attr in TABLE_FIELDS.get(inner.attr, ()):
                    problems.append(f"{where}: .{inner.attr}.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("circuitgraph.attribution."):
                bad = {a.name for a in node.names} & ENGINE_PRIVATE_NAMES
                if bad:
                    problems.append(f"{where}: imports {sorted(bad)} from {node.module}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and node.args[1].value in ENGINE_TABLES):
                problems.append(f"{where}: {ast.unparse(node)}")
    assert not problems, "use AttributionContext.writer/reader/frozen_model and ResidualLocation:\n" + "\n".join(
        problems)


def _declared_private_attributes() -> set[str]:
    """Private attributes some class of the package declares (class body or ``self._x = ...``)."""
    out = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                    out |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.startswith("_")}
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                if isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
                    out.add(node.attr)
    return out


def test_no_private_attributes_across_objects():
    problems = []
    declared = _declared_private_attributes()
    for path, tree in _modules():
        defined = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self",
                                                                                                           "cls"):
                defined.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if ast.unparse(node) in PUBLIC_UNDERSCORE_NAMES:
                continue
            where = f"{_rel(path)}:{node.lineno}: {ast.unparse(node)}"
            if isinstance(node.ctx, ast.Store):  # allowed when a class declares the attribute
                if node.attr not in declared and (_rel(path), node.attr) not in ALLOWED_PRIVATE_SETS:
                    problems.append(where + " set from outside its class (declare the attribute on the class)")
            elif node.attr not in defined and (_rel(path), node.attr) not in ALLOWED_PRIVATE_SETS:
                problems.append(where + " is private to another module")
    assert not problems, "\n".join(problems)


def test_module_names_are_unique_or_mirror_the_spec():
    """Two modules share a name only as ``spec/X.py`` (the spec section X) and the package X's own
    module, or as the per-package ``dispatch`` of queries and validation checks."""
    by_name: dict[str, list[str]] = {}
    for path, _ in _modules():
        if path.name != "__init__.py":
            by_name.setdefault(path.stem, []).append(_rel(path))
    allowed = {"dispatch": {"queries/dispatch.py", "validation/dispatch.py"}}
    for name, paths in by_name.items():
        if len(paths) < 2 or set(paths) == allowed.get(name):
            continue
        others = [p for p in paths if not p.startswith("spec/")]
        assert len(others) <= 1 and len(paths) == 2, f"modules named {name!r}: {paths}"


# ---------------------------------------------------------------------------- the public API
def test_residual_locations():
    from circuitgraph.attribution import ResidualLocation

    assert ResidualLocation.resid_pre(0) == 0 and ResidualLocation.resid_pre(0).sublayer == "embed"
    mid, post = ResidualLocation.resid_mid(2), ResidualLocation.resid_post(2)
    assert (mid.sublayer, mid.layer, post.sublayer, post.layer) == ("attn", 2, "mlp", 2)
    assert post == ResidualLocation.resid_pre(3) and mid.below() == ResidualLocation.resid_pre(2)
    assert repr(mid) == "ResidualLocation.resid_mid(2)" and isinstance(mid, int)
    with pytest.raises(ValueError):
        ResidualLocation.resid_pre(0).below()
    assert ResidualLocation.count(3) == ResidualLocation.resid_post(2) + 1 == 7


def _layer_name(node: ast.AST) -> bool:
    """A name that holds a layer or a layer count (``L``, ``layer``, ``n_layers``, ``fm.n_layers``, and
    the engine's layer loop variables ``l`` and ``m``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ("L", "l", "m") or "layer" in name


def residual_arithmetic(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, expression)`` for each residual location computed by hand: ``2 * layer (+ 1)``,
    ``loc // 2``, ``loc % 2`` (what :class:`~circuitgraph.residual.ResidualLocation` is for)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp):
            continue
        two = lambda n: isinstance(n, ast.Constant) and n.value == 2  # noqa: E731
        if isinstance(node.op, ast.Mult) and ((two(node.left) and _layer_name(node.right))
                                              or (two(node.right) and _layer_name(node.left))):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node.op, (ast.Mod, ast.FloorDiv)) and two(node.right) and any(
                isinstance(n, ast.Name) and "loc" in n.id for n in ast.walk(node.left)):
            out.append((node.lineno, ast.unparse(node)))
    return sorted(out)


def test_residual_locations_are_numbered_only_by_residual_location():
    """Every module, the engine included, names residual locations through ``ResidualLocation``
    (``resid_pre/mid/post``, ``count``, ``.layer``, ``.sublayer``); only ``residual.py`` computes them."""
    problems = [f"{_rel(path)}:{line}: {text}" for path, tree in _modules() if _rel(path) != "residual.py"
                for line, text in residual_arithmetic(tree)]
    assert not problems, "use circuitgraph.residual.ResidualLocation:\n" + "\n".join(problems)
    caught = residual_arithmetic(ast.parse("a = 2 * L + 1\nb = loc // 2 - 1\nc = 2 * fm.n_layers\nd = 2 * c + 1\n"
                                           "e = counts[: 2 * m + 2]"))
    assert [text for _, text in caught] == ["2 * L", "loc // 2", "2 * fm.n_layers", "2 * m"]


@pytest.mark.parametrize("granularity", [{}, dict(mlp="neurons", attention="heads")])
def test_context_propagation_reproduces_every_edge(tmp_path, granularity):
    from circuitgraph.attribution import attribute
    from tests.helpers.bundles import load_bundle, make_bundle

    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned", kind="skip"), "float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, **granularity)
    ctx = g.context
    readers, writers = dict(ctx.readers()), dict(ctx.writers())
    assert set(readers) == {n.id for n in g.nodes if n.pre_activation is not None}
    assert set(writers) == {n.id for n in g.nodes if n.kind not in ("logit", "target")}
    fm = ctx.frozen_model
    dense = g.dense_adjacency(dtype=np.float64)
    checked = 0
    for rid, r in readers.items():
        G = torch.zeros(1, r.position + 1, adapter.facts.d_model, dtype=torch.float64)
        G[0, r.position] = r.direction
        at = {r.location: G}
        for loc in range(r.location, 0, -1):
            G = fm.step_down(loc, G.clone())
            at[loc - 1] = G
        for wid, writes in writers.items():
            seen = [w for w in writes if w.location <= r.location and w.position <= r.position]
            expected = sum(float(at[w.location][0, w.position] @ w.vector) for w in seen)
            assert dense[g.index_of(rid), g.index_of(wid)] == pytest.approx(expected, abs=1e-10)
            checked += bool(seen)
    assert checked > 100


def test_max_dense_nodes_is_the_dense_limit(tmp_path):
    """The spec key ``graph.max_dense_nodes`` (the graph's ``max_dense_nodes``, kept by its copies
    and by its file) limits densifying."""
    from circuitgraph.errors import QueryError
    from circuitgraph.export import graph_from_json
    from tests.helpers.graphs import random_dag

    g = random_dag(0)
    assert g.dense_adjacency().shape == (g.n_nodes, g.n_nodes)
    g.max_dense_nodes = g.n_nodes - 1
    for h in (g, g.subgraph([n.id for n in g.nodes])):
        with pytest.raises(QueryError, match="max_nodes"):
            h.dense_adjacency()
    assert g.dense_adjacency(max_nodes=g.n_nodes).shape == (g.n_nodes, g.n_nodes)
    g.metadata["spec"] = {"graph": {"max_dense_nodes": g.n_nodes - 1}}  # what a run writes in the file
    with pytest.raises(QueryError, match="max_nodes"):
        graph_from_json(g.to_json()).dense_adjacency()


def test_tests_scripts_and_benchmarks_use_the_public_context_too():
    repo = PACKAGE.parent
    problems = []
    for folder in ("tests", "benchmarks", "scripts", "examples"):
        for path in sorted((repo / folder).rglob("*.py")):
            if path.name == "test_architecture.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Attribute) and node.attr in ENGINE_TABLES:
                    problems.append(f"{path.relative_to(repo)}:{node.lineno}: .{node.attr}")
    assert not problems, "use graph.context.writes/reader/frozen_model:\n" + "\n".join(problems)


def _test_imports(path: Path) -> list[str]:
    """Every module ``path`` imports (anywhere in it, relative imports resolved within tests/)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(["tests"] + ([base] if base else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def _touches_sys_path(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys"):
            return True
    return False


def test_no_test_module_imports_another_or_edits_sys_path():
    """Shared helpers live in tests/helpers (a package); a test module, conftest.py or a helper never
    imports a test module or conftest.py, and nothing in tests/ edits ``sys.path`` (the benchmark
    scripts are imported as the package ``benchmarks``)."""
    tests = Path(__file__).resolve().parent
    bad, path_edits = [], []
    for path in sorted(tests.rglob("*.py")):
        for name in _test_imports(path):
            parts = name.split(".")
            if (parts[0] in ("conftest",) or parts[0].startswith("test_")
                    or (parts[0] == "tests" and len(parts) > 1 and (parts[1] == "conftest" or parts[1].startswith("test_")))):
                bad.append(f"{path.relative_to(tests)} imports {name}")
        if _touches_sys_path(path):
            path_edits.append(str(path.relative_to(tests)))
    assert not bad, "move what is shared into tests/helpers: " + "; ".join(bad)
    assert not path_edits, f"these test files touch sys.path: {path_edits}"


def kind_group_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, literal)`` for each tuple, list or set of strings that spells a named group of node
    kinds (``spec/kinds.py``'s ``OUTPUT_KINDS``, ``TOKEN_KINDS``, ``ACTIVATION_KINDS``) out again."""
    from circuitgraph.spec.kinds import ACTIVATION_KINDS, OUTPUT_KINDS, TOKEN_KINDS

    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            if {e.value for e in node.elts} in (OUTPUT_KINDS, TOKEN_KINDS, ACTIVATION_KINDS):
                out.append((node.lineno, ast.unparse(node)))
    return sorted(out)


def test_node_kind_groups_are_named_once():
    """The groups of node kinds code tests for (outputs, tokens, units with an activation) are named
    in ``spec/kinds.py``."""
    problems = [f"{_rel(path)}:{line}: {text}" for path, tree in _modules()
                if _rel(path) != "spec/kinds.py"
                for line, text in kind_group_literals(tree)]
    assert not problems, "use circuitgraph.spec.kinds.OUTPUT_KINDS / TOKEN_KINDS / ACTIVATION_KINDS:\n" + "\n".join(problems)
    code = 'a = k in ("target", "logit")\nb = ["embedding", "logit"]\nc = {"neuron", "feature"}\nd = ("feature", "error")'
    assert [t for _, t in kind_group_literals(ast.parse(code))] \
        == ["('target', 'logit')", "['embedding', 'logit']", "{'neuron', 'feature'}"]


def test_residual_locations_place_every_kind_and_site_it_names():
    """:mod:`circuitgraph.residual` sits below the spec and the adapters, so it spells the node kinds
    and intervention sites it places out itself: each must be a kind of ``spec/kinds.py`` or a site
    of ``adapters/sites.py`` (a renamed kind would otherwise fall through to the MLP's location), and
    every kind and site gets the location of its sublayer."""
    from circuitgraph.adapters.sites import SITES
    from circuitgraph.residual import ResidualLocation as R
    from circuitgraph.spec.kinds import NODE_KINDS

    tree = ast.parse((PACKAGE / "residual.py").read_text())
    named = {e.value for node in ast.walk(tree) if isinstance(node, (ast.Tuple, ast.Set))
             for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    assert named and named <= set(NODE_KINDS) | set(SITES), sorted(named - set(NODE_KINDS) - set(SITES))
    embed, attn = {"embed", "pos_embed", "embedding", "positional"}, {"attn", "head", "attention_head"}
    for unit in (*NODE_KINDS, *SITES):
        want = R(0) if unit in embed else R.resid_pre(3) if unit == "resid_pre" else \
            R.resid_mid(3) if unit in attn else R.resid_post(3)
        assert R.written_by(unit, 3) == want, unit
        assert R.read_by(unit, 3) == (R.resid_mid(3) if unit in ("feature", "neuron", "mlp") else R.resid_pre(3)), unit


def unguarded_json_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, call)`` for each JSON file read past the hardened reader: ``json.loads`` of a
    ``read_text()``/``read_bytes()``, or ``json.load`` of a file object."""
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
            continue
        reads_file = any(isinstance(n, ast.Attribute) and n.attr in ("read_text", "read_bytes")
                         for arg in node.args for n in ast.walk(arg))
        if node.func.attr == "load" or (node.func.attr == "loads" and reads_file):
            out.append((node.lineno, ast.unparse(node)[:80]))
    return sorted(out)


def test_json_files_are_read_through_the_hardened_reader():
    """Every JSON file the package reads goes through ``_io.read_json_file`` (a size limit, a
    regular file, UTF-8, one LoadError naming the file), never ``json.loads(path.read_text())``
    nor ``json.load(open file)``."""
    problems = []
    for path, tree in _modules():
        if _rel(path) == "_io.py":
            continue
        problems += [f"{_rel(path)}:{line}: {text}" for line, text in unguarded_json_reads(tree)]
    assert not problems, "read JSON files with circuitgraph._io.read_json_file:\n" + "\n".join(problems)
    caught = unguarded_json_reads(ast.parse("import json\nwith open(p) as f:\n    a = json.load(f)\n"
                                            "b = json.loads(p.read_text())\nc = json.loads(line)\n"))
    assert [line for line, _ in caught] == [3, 4]
