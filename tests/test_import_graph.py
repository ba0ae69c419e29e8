"""The package's import graph: no cycles, and imports inside functions only for optional or heavy
extras.

Every module of ``circuitgraph/`` is parsed (nothing is imported) and every ``import`` statement
is read, at module level and inside functions alike (``if TYPE_CHECKING:`` blocks aside, which
never run).  A module named in a string (``importlib.import_module("circuitgraph.x")``, a
``"circuitgraph.x.y:function"`` record, a lazy-attribute table) is an arrow too: every string
constant that names a module of the package, docstrings aside, counts as an import of it.  An
import inside a function, or by name, hides a cycle from Python but not from this graph.  The
graph has no cycle, and no arrow goes to a later layer of :data:`LAYERS` (base -> results -> spec
-> adapters/dictionaries -> graph -> attribution -> queries/validation -> export -> pipeline ->
datasets -> features -> entry points, docs/architecture.md) but the few in :data:`UPWARD_OK`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "circuitgraph"

#: third-party packages that may be imported inside a function: optional extras (a clear error
#: names the extra when they are missing) and the heavy libraries loaded only when a model or a
#: dictionary is loaded, so that ``import circuitgraph``, the spec tools and graph files stay light
LAZY_PACKAGES = {
    "pandas": "optional extra (notebook, dataset)",
    "networkx": "optional extra (networkx: graph.to_networkx)",
    "pyarrow": "optional extra (dataset)",
    "duckdb": "optional extra (dataset)",
    "ray": "optional extra (dataset: the Ray executor)",
    "matplotlib": "optional extra (plots: patching heat maps)",
    "graphviz": "rendering only (the dot binary)",
    "fcntl": "POSIX only (file locks)",
    "tqdm": "progress bars, on request",
    "tokenizers": "loaded with a tokenizer",
    "transformers": "heavy: loaded with a Hugging Face model folder",
    "huggingface_hub": "heavy, and only for hub downloads",
    "transformer_lens": "heavy: loaded with a model",
    "sae_lens": "heavy: loaded with sae-lens dictionaries",
    "playwright": "optional extra (test: the explorer's browser tests)",
    "tracr": "optional extra (tracr: compiled ground-truth models)",
    "jax": "optional extra (tracr)",
    "haiku": "optional extra (tracr)",
    "gguf": "optional extra (gguf: GGUF checkpoints)",
    "sparsify": "optional extra (train-sparsify: circuitgraph train with backend sparsify)",
    "schedulefree": "optional extra (train-sparsify: sparsify's optimiser)",
    "datasets": "optional extra (train-sparsify: the windows handed to sparsify's Trainer)",
}

#: modules whose function-local imports are deliberate, with the reason
LAZY_MODULES = {
    "circuitgraph": "the package root: `import circuitgraph` imports nothing heavy (names resolved on first use)",
    "circuitgraph.cli.main": "the CLI imports torch and the pipeline only in the commands that need them "
                             "(`circuitgraph --help` and `validate` stay fast)",
}

#: packages that one module imports inside a function, with the reason
LAZY_IN_MODULE = {
    ("circuitgraph.adapters.files", "torch"): "only .pt direction files need torch: `circuitgraph validate` checks "
                                              "every input file without loading it",
    ("circuitgraph.adapters.hf_config", "torch"): "`circuitgraph validate` reads the families table without torch",
    ("circuitgraph.adapters.hf_config", "einops"): "with torch: only when weights are converted",
    ("circuitgraph.adapters.gguf", "torch"): "`circuitgraph validate` reads a GGUF header without torch; torch "
                                             "only when the file is dequantised",
}

#: standard-library modules the CLI imports late as well (with its other imports)
_STDLIB_LATE_OK = {"atexit", "gc", "json", "os", "sys", "warnings", "yaml"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str, bool]]:
    """``(line, imported module, inside a function)`` for every import statement of a module
    (``from pkg import sub`` counts as importing ``pkg.sub`` when that is a module)."""
    return _imports_of_tree(name, path, ast.parse(path.read_text()), modules)


def _imports_of_tree(name: str, path: Path, tree: ast.AST, modules: dict[str, Path]) -> list[tuple[int, str, bool]]:
    """:func:`_imports` of a parsed module."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        inside = type_checking = False
        x = node
        while x in parents:
            child, x = x, parents[x]
            inside |= isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))
            # the body of `if TYPE_CHECKING:` only: its `else:` branch runs
            type_checking |= (isinstance(x, ast.If) and "TYPE_CHECKING" in ast.unparse(x.test)
                              and any(child is c for c in x.body))
        if type_checking:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        out += [(node.lineno, t, inside) for t in targets]
    return out


#: a string that names a module of the package, or a function in one (``module:function``, ``module.function``)
_NAMED = re.compile(r"^circuitgraph(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$")


def _string_refs(tree: ast.AST, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """``(line, module)`` for every string constant (docstrings aside) naming a module of the
    package or a function in one: the by-name imports an AST of import statements cannot see.
    A name whose nearest module is the package root (``"circuitgraph.diff"``, a format's name) is
    not one."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings):
            continue
        if not _NAMED.match(node.value):
            continue
        target = node.value.split(":")[0]
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != "circuitgraph":
            out.append((node.lineno, target))
    return out


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    local: list[tuple[str, int, str]] = []
    for name, path in modules.items():
        for line, target, inside in _imports(name, path, modules):
            if inside:
                local.append((name, line, target))
            if target.split(".")[0] != "circuitgraph":
                continue
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name:
                edges[name].add(target)
        for _, target in _string_refs(ast.parse(path.read_text()), modules):
            if not (name == target or name.startswith(target + ".")):  # a module's own packages are loaded before it
                edges[name].add(target)
    return edges, local


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    edges, _ = _graph()
    cycles = _cycles(edges)
    detail = []
    for comp in cycles:
        members = set(comp)
        detail.append(" ; ".join(f"{a} -> {b}" for a in comp for b in sorted(edges[a] & members)))
    assert not cycles, "import cycles (put the shared code below both users):\n" + "\n".join(detail)


def test_function_local_imports_are_only_optional_or_heavy_extras():
    _, local = _graph()
    bad = []
    for module, line, target in local:
        if module in LAZY_MODULES and (target.startswith("circuitgraph") or target.split(".")[0] in _STDLIB_LATE_OK):
            continue
        if target.split(".")[0] in LAZY_PACKAGES or (module, target.split(".")[0]) in LAZY_IN_MODULE:
            continue
        bad.append(f"{module}:{line} imports {target}")
    assert not bad, ("imports inside functions (move them to the top of the module; an import that would make a "
                     "cycle means shared code belongs below both users):\n" + "\n".join(bad))


def test_the_checker_sees_cycles_and_local_imports():
    """The graph is built from the statements as written: a made-up cycle through a
    function-local import is found."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    edges, local = _graph()
    assert any(m == "circuitgraph.cli.main" for m, _, _ in local)  # the CLI's lazy imports are seen
    # a module named in a string is an arrow: the package root's lazy attributes name their homes
    assert "circuitgraph.pipeline.entry" in edges["circuitgraph"]
    modules = _modules()
    snippet = ast.parse('"""circuitgraph.export.html is named in a docstring: no arrow"""\n'
                        'import importlib\n'
                        'f = importlib.import_module("circuitgraph.export.html").graph_html\n'
                        'RECORD = {"load": "circuitgraph.dictionaries.formats:load_saelens", "x": "circuitgraph.nothing"}\n')
    assert sorted(t for _, t in _string_refs(snippet, modules)) == [
        "circuitgraph.dictionaries.formats", "circuitgraph.export.html"]


def computed_module_names(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, expression)`` for each f-string that starts with ``circuitgraph.``: a module named
    by a computed string is an arrow no reader (and not :func:`_string_refs`) can follow."""
    return [(n.lineno, ast.unparse(n)) for n in ast.walk(tree)
            if isinstance(n, ast.JoinedStr) and n.values and isinstance(n.values[0], ast.Constant)
            and str(n.values[0].value).startswith("circuitgraph.")]


def test_modules_are_named_in_full():
    """Every by-name reference to a module is a whole string, so the tests above see it."""
    bad = [f"{name}:{line}: {text}" for name, path in _modules().items()
           for line, text in computed_module_names(ast.parse(path.read_text()))]
    assert not bad, "name the module in full (a constant string):\n" + "\n".join(bad)
    assert computed_module_names(ast.parse('m = f"circuitgraph.pipeline.{home}"\nx = f"{a}.circuitgraph.b"')) == [
        (1, "f'circuitgraph.pipeline.{home}'")]


def test_the_else_branch_of_type_checking_is_an_import():
    modules = _modules()
    tree_text = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import circuitgraph.errors\n"
                 "else:\n    import circuitgraph.residual\n")
    path = PACKAGE / "_probe_never_written.py"
    targets = [t for _, t, _ in _imports_of_tree("circuitgraph._probe", path, ast.parse(tree_text), modules)]
    assert "circuitgraph.residual" in targets and "circuitgraph.errors" not in targets


def test_the_engine_and_the_spec_import_nothing_from_later_stages():
    edges, _ = _graph()
    later = ("circuitgraph.pipeline", "circuitgraph.datasets", "circuitgraph.export", "circuitgraph.cli")
    for low in ("circuitgraph.attribution", "circuitgraph.graph", "circuitgraph.spec", "circuitgraph.dictionaries"):
        for m in edges:
            if m.startswith(low):
                assert not [t for t in edges[m] if t.startswith(later)], m
    spec_deps = {t for m in edges if m.startswith("circuitgraph.spec") for t in edges[m]}
    assert all(t.startswith(("circuitgraph.spec", "circuitgraph.errors")) or t == "circuitgraph" for t in spec_deps), \
        spec_deps


#: the package's layers, bottom first (docs/architecture.md): a module imports (or names) only
#: modules of its own layer and of the layers below.  A module is in the layer of the longest
#: prefix that names it; a prefix names a package or a module (the package root: only itself).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("circuitgraph.errors", "circuitgraph._io", "circuitgraph._finite", "circuitgraph._hub",
              "circuitgraph.builtin", "circuitgraph.residual")),
    ("results", ("circuitgraph.text_tables", "circuitgraph.display", "circuitgraph._results")),
    ("spec", ("circuitgraph.spec",)),
    ("model", ("circuitgraph.adapters", "circuitgraph.dictionaries")),
    # _json encodes a NodeId: it sits with the graph, below every writer of JSON
    ("graph", ("circuitgraph.graph", "circuitgraph._json")),
    ("engine", ("circuitgraph.attribution",)),
    ("analysis", ("circuitgraph.queries", "circuitgraph.validation")),
    # the readers of a dataset's and a features run's folders import only the layers below the
    # exports: the pipeline reads a features folder's dashboards, a diff a dataset's aggregate
    ("export", ("circuitgraph.export", "circuitgraph.datasets.store", "circuitgraph.features.summary")),
    ("pipeline", ("circuitgraph.pipeline",)),
    ("datasets", ("circuitgraph.datasets",)),
    ("features", ("circuitgraph.features",)),
    ("entry", ("circuitgraph", "circuitgraph.__main__", "circuitgraph.pipeline.entry", "circuitgraph.pipeline.compare",
               "circuitgraph.cli", "circuitgraph.serve", "circuitgraph.training", "circuitgraph.testing")),
]

#: arrows to a later layer that are deliberate, with the reason
UPWARD_OK = {
    ("circuitgraph.pipeline", "circuitgraph.pipeline.entry"):
        "the package's lazy names (`circuitgraph.pipeline.run`), resolved on first use; importing the package imports nothing",
    ("circuitgraph.datasets.executors", "circuitgraph.features.stream"):
        "a name in the fork server's preload list (imported once so that workers start warm); no code of it runs",
}


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (an AssertionError names a module of no layer)."""
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or (p != "circuitgraph" and module.startswith(p + ".")):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    assert best is not None, f"{module} is in no layer of LAYERS: add its package there (and to docs/architecture.md)"
    return best[0]


def upward_arrows(edges: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
            for a in sorted(edges) for b in sorted(edges[a])
            if layer_of(b) > layer_of(a) and (a, b) not in UPWARD_OK]


def test_imports_follow_the_layers():
    """No module imports or names a module of a later layer: an upward arrow is a loop waiting
    for its other half, and the cycle test alone cannot see it."""
    edges, _ = _graph()
    bad = upward_arrows(edges)
    assert not bad, ("imports of a later layer (move the shared code down, or register it from above):\n"
                     + "\n".join(bad))
    assert all(b in edges[a] for a, b in UPWARD_OK), "an allowed upward arrow is gone: remove it from UPWARD_OK"
    assert upward_arrows({"circuitgraph.export.html": {"circuitgraph.pipeline.runner"},
                          "circuitgraph.pipeline.runner": {"circuitgraph.export.html"}}) == [
        "circuitgraph.export.html (export) -> circuitgraph.pipeline.runner (pipeline)"]


def test_hook_names_are_built_only_in_the_adapters():
    """TransformerLens hook names (``blocks.<l>...``, ``ln_final...``) are made by the adapter's
    methods (``ModelAdapter.hook_*``, ``block_hook``); no other module formats one (docstrings,
    comments and test builders that write other libraries' config files aside)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("adapters/", "testing/")):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                text = str(node.values[0].value)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
            else:
                continue
            if text.startswith(("blocks.", "ln_final.hook")) and "<" not in text:
                bad.append(f"{rel}:{node.lineno} {text[:40]!r}")
    assert not bad, "hook names built outside the adapters (use ModelAdapter.hook_*):\n" + "\n".join(bad)
