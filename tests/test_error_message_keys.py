"""Error messages name spec keys exactly as the spec spells them.

Every message a ``raise``, ``rule_error``, a problem list or a warning can produce is read
from the source.  A dotted spec path in it (``export.max_json_edges``, ``graph.mlp``) must
name keys of the spec schema exactly; a ``{key: value}`` mapping or snake_case word that is
not a key or value of the spec schema, a field of the graph schema or of TransformerLens's
model config, or a hook name, must not be a near miss of a spec key (``max_edges`` for
``max_json_edges``) unless :data:`NOT_SPEC_KEYS` says it is a Python name or file field.  A
Python parameter that stands for a spec key under another name must name the spec key in
the same message.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: snake_case words in messages that are near misses of spec keys but are not meant as spec
#: keys: Python parameters and functions, fields of dictionary files
NOT_SPEC_KEYS = {
    "d_out", "d_transcoder", "skip_transcoder",  # fields of sae-lens / cross-layer transcoder files
    "transcoder_set", "layer_0",  # circuit-tracer's config.yaml model_kind and per-layer file names
    "logit_difference",  # a Python function (circuitgraph.queries)
    "max_nodes",  # a Python parameter; the spec validates export.max_render_nodes itself
    "max_row_nodes",  # a Python parameter of graph_to_dot (the nodes side by side in a diagram row)
    "content",  # a field of a tokenizer_config.json token ({content: ...}), not the spec key context
    "save_pretrained",  # transformers's method (a Hugging Face folder), not the spec key pretrained
}

#: dotted words that look like spec paths but are Python attributes or file names
NOT_SPEC_PATHS = ("graph.edge_weight", "graph.metadata", "model.safetensors")

#: Python parameters that stand for a spec key spelled differently: a message naming one
#: must also name one of the spec spellings
PYTHON_ALIASES = {"max_edges": ("export.max_json_edges",)}

_TOP = ("seed", "model", "transcoders", "prompt", "targets", "graph", "prune", "queries", "validate", "export")
_BRACED_KEY = re.compile(r"\{([a-z][a-z0-9_]*): ")
_DOTTED = re.compile(r"(?<![\w./])((?:" + "|".join(_TOP) + r")(?:\[\d*\])?(?:\.[a-z_][a-z0-9_]*(?:\[\d*\])?)+)")
_SNAKE = re.compile(r"(?<![\w./=-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w(=])")


def _messages() -> list[tuple[str, int, str]]:
    """``(file, line, text)`` of every string that can end up in an error or warning message;
    the values of f-string fields are blanked."""
    out: list[tuple[str, int, str]] = []

    def strings(node: ast.AST) -> list[str]:
        found = []
        for n in ast.walk(node):
            if isinstance(n, ast.JoinedStr):
                found.append("".join(v.value if isinstance(v, ast.Constant) else " " for v in n.values))
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                found.append(n.value)
        return found

    for path in sorted((REPO / "circuitgraph").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                out.append((rel, node.lineno, " ".join(strings(node.exc))))
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in ("rule_error", "PydanticCustomError", "warn") or (
                        name == "append" and getattr(node.func.value, "id", "") == "problems"):
                    out.append((rel, node.lineno, " ".join(strings(node))))
    return out


def _schema_words() -> set[str]:
    words: set[str] = set()

    def walk(x: object) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "properties":
                    words.update(v)
                elif k == "enum":
                    words.update(str(e) for e in v)
                elif k == "const":
                    words.add(str(v))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for name in ("spec.schema.json", "graph.schema.json"):
        walk(json.loads((REPO / "schemas" / name).read_text()))
    return words


def _spec_keys() -> set[str]:
    words: set[str] = set()

    def walk(x: object) -> None:
        if isinstance(x, dict):
            words.update(x.get("properties", {}))
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(json.loads((REPO / "schemas" / "spec.schema.json").read_text()))
    return words


def test_messages_are_found():
    texts = " ".join(m for _, _, m in _messages())
    assert len(_messages()) > 300
    assert "mlp: transcoders" in texts


def test_every_key_a_message_names_is_in_the_schema():
    from transformer_lens import HookedTransformerConfig

    known = _schema_words() | {f.name for f in dataclasses.fields(HookedTransformerConfig)} | NOT_SPEC_KEYS
    spec_keys = _spec_keys()
    unknown: dict[str, list[str]] = {}
    for where, line, text in _messages():
        words = set(_BRACED_KEY.findall(text)) | set(_SNAKE.findall(text))
        dotted = set()
        for path in _DOTTED.findall(text):
            if path.startswith(NOT_SPEC_PATHS):
                continue
            segments = [re.sub(r"\[\d*\]", "", s) for s in path.split(".")]
            dotted |= set(segments)
        for word in words - known - {w for w in words if w.startswith("hook_")}:
            near = difflib.get_close_matches(word, spec_keys, n=1, cutoff=0.75)
            if near:  # a bare word close to a spec key: a misspelled or renamed key
                unknown.setdefault(f"{word} (the spec key is {near[0]}?)", []).append(f"{where}:{line}")
        for word in dotted - spec_keys:  # a spec path must be spelled exactly
            unknown.setdefault(word, []).append(f"{where}:{line}")
        for alias, spellings in PYTHON_ALIASES.items():
            if re.search(rf"\b{alias}\b", text) and not any(s in text for s in spellings):
                unknown.setdefault(f"{alias} (say {' or '.join(spellings)} too)", []).append(f"{where}:{line}")
    assert not unknown, (
        "error messages name keys the spec does not have; spell spec keys as the schema does "
        "(e.g. export.max_json_edges), or, for a word that is not a spec key, add it to NOT_SPEC_KEYS: "
        + "; ".join(f"{k} at {', '.join(v[:3])}" for k, v in sorted(unknown.items()))
    )
