"""Bad input of every kind gives one line on stderr and exit status 2, never a traceback,
and bounded work (an alias bomb or a deeply nested file is refused in well under a second).

The cases come from probing the command line with fuzzed specs, broken bundles and
hand-edited graph files; each class that used to crash has a case here.
"""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from circuitgraph.cli.main import app
from circuitgraph.errors import SpecError, spec_field

DEMO = "format_version: 1\nmodel: {builtin: demo}\nprompt: a\n"
BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}' if prev else 'x'] * 9)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi", strict=False)
)

#: (name, spec text, a piece of the expected message)
BAD_SPECS = [
    ("unhashable key", DEMO + "? [1, 2]\n: 3\n", "mapping key cannot be a list"),
    ("float layer key", DEMO + "graph: {mlp: {1.5: neurons}}\n", "mapping key 1.5"),
    ("boolean layer key", DEMO + "graph: {mlp: {true: neurons}}\n", "mapping key True"),
    ("deep nesting", DEMO.replace("prompt: a", "prompt: " + "[" * 3000 + "]" * 3000), "nested"),
    ("deep mappings", DEMO + "queries: " + "{a: " * 200 + "1" + "}" * 200 + "\n", "nested"),
    ("huge integer", DEMO + "seed: " + "9" * 5000 + "\n", "unreadable value"),
    ("seed out of range", DEMO + "seed: " + "9" * 30 + "\n", "seed: must be <="),
    ("negative seed", DEMO + "seed: -5\n", "seed: must be >= 0"),
    ("unknown user in path", "format_version: 1\nmodel: {path: ~no_such_user_cg/x}\nprompt: a\n", "no such user"),
    ("unknown user in export", DEMO + "export: {json: ~no_such_user_cg/g.json}\n", "no such user"),
    ("lone surrogate", DEMO.replace("prompt: a", 'prompt: "a \\udc80 b"'), "lone surrogate"),
    ("format_version true", DEMO.replace("format_version: 1", "format_version: true"), "expected the integer 1"),
    ("format_version 1.0", DEMO.replace("format_version: 1", "format_version: 1.0"), "expected the integer 1"),
    ("alias bomb", BOMB + DEMO.replace("prompt: a", "prompt: *i"), "YAML aliases"),
    ("recursive alias", DEMO + "queries: &q [*q]\n", "alias"),
    ("same export twice", DEMO + "export: {json: out/x.json, neuronpedia: out/x.json}\n", "also the json output"),
    ("export suffix", DEMO + "export: {svg: out/x.png}\n", "should end in .svg"),
    ("heatmap suffix", DEMO + "validate: [{patching: {corrupted: b, heatmap: out/h.jpg}}]\n", "heatmap image"),
]


def _invoke(args: list[str]):
    return CliRunner().invoke(app, args)


def assert_clean_error(res, *needles: str) -> None:
    """Exit 2, exactly one line starting with 'error:', no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"]], ids=["validate", "dry-run"])
@pytest.mark.parametrize("name,text,needle", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_one_line_exit_2(tmp_path, command, name, text, needle):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text, encoding="utf-8", errors="surrogatepass")
    t0 = time.perf_counter()
    res = _invoke([*command, str(spec)])
    assert time.perf_counter() - t0 < 5.0, "bad input must be refused quickly (bounded work)"
    assert_clean_error(res, needle)


def test_alias_bomb_message_is_bounded(tmp_path):
    """Formatting an error never prints (or repr()s) the whole value."""
    spec = tmp_path / "spec.yaml"
    small = "".join(f"{n}: &{n} [{', '.join([f'*{p}' if p else 'x'] * 9)}]\n"
                    for p, n in zip(["", "a", "b", "c"], "abcd", strict=False))  # 6,561 values: under the budget
    spec.write_text(small + DEMO.replace("prompt: a", "prompt: *d"))
    res = _invoke(["validate", str(spec)])
    assert_clean_error(res, "prompt")
    assert len(res.output) < 2000


def test_bad_spec_in_python_raises_spec_error():
    from circuitgraph.errors import SpecError
    from circuitgraph.spec import load_spec

    base = {"format_version": 1, "model": {"builtin": "demo"}, "prompt": "a"}
    deep: list = []
    for _ in range(500):
        deep = [deep]
    for bad in ({**base, "prompt": deep}, {**base, "prompt": "x\udc80"}, {**base, "seed": True},
                {**base, "format_version": True}, {**base, "graph": {"mlp": {True: "neurons"}}}):
        with pytest.raises(SpecError):
            load_spec(bad)


# --------------------------------------------------------------------------- fuzz
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.helpers.fuzz import document_paths, edited  # noqa: E402

VALID_SPEC = {
    "format_version": 1,
    "model": {"builtin": "demo"},
    "transcoders": {"builtin": "demo"},
    "prompt": "mia found owl in the attic . later mia wanted",
    "targets": [{"logit_diff": [" an", " a"]}, {"logit": " an", "position": -1, "weight": 0.5}],
    "graph": {"mlp": {0: "transcoders", 1: "neurons"}, "attention": "frozen", "max_feature_nodes": 100},
    "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
    "queries": [{"top_paths": {"source": {"kind": "embedding"}, "k": 5}}, {"scores": {}}],
    "validate": [{"predicted_vs_actual": {"k": 5}}],
    "export": {"json": "out/g.json", "svg": "out/g.svg"},
}

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=10)
           | st.sampled_from(["neurons", "transcoders", "frozen", "heads", "embedding", " an", "~x/y", "\udc80"]))
VALUES = st.recursive(
    SCALARS,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8) | st.integers(-2, 5), c, max_size=3),
    max_leaves=6,
)


SPEC_PATHS = [p for p in document_paths(VALID_SPEC) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.sampled_from(SPEC_PATHS), VALUES, st.booleans()), min_size=1, max_size=3))
def test_fuzzed_specs_load_or_fail_cleanly(edits):
    """Any edit of a valid spec gives a Spec or a SpecError with a one-line message."""
    from circuitgraph.errors import SpecError
    from circuitgraph.spec import Spec, load_spec

    doc = edited(VALID_SPEC, edits)
    try:
        spec = load_spec(doc, base_dir=".")
    except SpecError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 20_000
        return
    assert isinstance(spec, Spec)
    spec.summary()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list("{}[]:,-&*!|>'\"# \n\tab01.~") + ["\udc80", "é"]), max_size=200))
def test_fuzzed_spec_text_is_one_line_or_ok(tmp_path, text):
    """Arbitrary YAML-ish text through `circuitgraph validate`: exit 0, or exit 2 with one line."""
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(("format_version: 1\nmodel: {builtin: demo}\n" + text).encode("utf-8", "surrogatepass"))
    res = _invoke(["validate", str(spec)])
    assert res.exit_code in (0, 2), (res.exit_code, res.output, repr(res.exception))
    assert len(res.output.strip().splitlines()) == 1


def test_lone_surrogate_through_the_python_api_is_a_token_error():
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.errors import TokenError
    from tests.helpers.bundles import SHARED_FIXTURES

    tok = Tokenizer.from_dir(SHARED_FIXTURES / "example-gpt2" / "tokenizer")
    with pytest.raises(TokenError, match="lone surrogate"):
        tok.encode("t36 \udc80")


def test_zero_targets_are_refused_before_anything_is_written(tmp_path):
    from tests.helpers.bundles import SHARED_FIXTURES

    bundle = SHARED_FIXTURES / "example-gpt2"
    from circuitgraph.adapters.tokenizer import Tokenizer

    t36 = Tokenizer.from_dir(bundle / "tokenizer").encode("t36")[0]
    for target, needle in (({"logit_diff": ["t36", "t36"]}, "compares a token with itself"),
                           ({"logit": "t36", "weight": 0.0}, "weight 0"),
                           ({"logit_diff": ["t36", t36]}, "both tokens are id"),
                           ({"direction": {"layer": 1, "site": "resid_post", "vector": [0.0] * 32}}, "all zeros")):
        spec = {"format_version": 1, "model": {"path": str(bundle / "model")}, "prompt": "t36 t37 t23",
                "targets": [target], "export": {"json": str(tmp_path / "out" / "g.json")}}
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(spec))
        res = _invoke(["run", "-q", str(path)])
        assert_clean_error(res, needle)
        assert not (tmp_path / "out").exists()


def test_a_source_field_left_unset_is_a_spec_error_naming_it():
    """A section built by hand without the field its source needs (``model.path`` of a path model)
    gets a SpecError naming the field, not a TypeError on None deep in a loader."""
    assert spec_field("m.safetensors", "model.path") == "m.safetensors"
    with pytest.raises(SpecError, match=r"model\.path is not set"):
        spec_field(None, "model.path")
